"""Token logprobs from hidden states and the LM head, a chunk of positions at a time.

A causal LM's forward ends in ``logits = lm_head(hidden)``: ``[T, V]``, in fp32 for the log-softmax. At
T = 16k and Qwen's V = 152k that is ~10 GB per tensor, and the log-softmax, its exp and their gradients
each add another. Nothing downstream needs the whole matrix: the loss wants one logprob per position (plus
an entropy metric and, for score centering, the K nucleus candidates). ``head_logprobs`` therefore applies
the head to ``chunk`` positions at a time and keeps only those ``[chunk]``/``[chunk, K]`` results, so the
peak is ``chunk × V`` whatever T is.

With gradients, each chunk runs under ``torch.utils.checkpoint`` (non-reentrant): the forward keeps only
the chunk's hidden states, and the backward recomputes that chunk's logits, back-propagates through them
and frees them before the next chunk. The cost is one extra ``[chunk, H] × [H, V]`` matmul per chunk
(the head's forward twice), the usual activation-checkpointing trade.

The logprob convention is the serving one (``serving.logprobs``): ``softmax(logits / T)`` restricted to
the sampler's nucleus and renormalised there. Per position, in order of preference:

1. the captured nucleus (``nucleus_ids``/``nucleus_valid``, the engine's exact ids) when the position has
   one: the trainer replays the sampler's truncation rather than recomputing it from its own logits;
2. otherwise top-k/top-p recomputed from the trainer's logits (``sampler_logprobs``), when configured;
3. otherwise the plain ``log_softmax(logits / T)``.

Greedy (``T < GREEDY_EPS``) takes T as 1 and ignores the truncation, as the engines do. The entropy is
that of the untruncated ``softmax(logits / T)`` (a metric; no gradient).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from lego_rl.serving.logprobs import sampler_logprobs
from lego_rl.serving.sampler import GREEDY_EPS

DEFAULT_CHUNK = 1024
"""Positions per chunk: 1024 × 152k fp32 ≈ 620 MB per ``[chunk, V]`` tensor, large enough to keep the
head's matmul efficient on a GPU."""


@dataclass
class HeadOutputs:
    """What ``head_logprobs`` returns (``N`` positions, ``K`` nucleus slots)."""

    logprobs: torch.Tensor
    """[N] float32 logprob of each target under the sampler's convention (carries the gradient)."""
    entropy: torch.Tensor | None
    """[N] float32 entropy of the untruncated distribution (no gradient), when asked for."""
    candidate_logprobs: torch.Tensor | None
    """[N, K] float32 logprobs of the captured nucleus candidates, renormalised over the nucleus (carries
    the gradient; 0 on padding slots and on positions without a nucleus), when a nucleus was given."""


def _chunk_outputs(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    nucleus_ids: torch.Tensor | None,
    nucleus_valid: torch.Tensor | None,
    *,
    temperature: float,
    top_p: float,
    top_k: int,
    with_entropy: bool,
    log_softmax: Callable[[torch.Tensor, float], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One chunk: ``([n] logprobs, [n] entropy or empty, [n, K] candidates or empty)``.

    Returns empty tensors instead of None so that ``checkpoint`` sees only tensors.
    """
    greedy = temperature < GREEDY_EPS
    raw = head(hidden).float()  # [n, V]
    logits = raw / (1.0 if greedy else temperature)  # [n, V]
    if log_softmax is None:
        logp = torch.log_softmax(logits, dim=-1)  # [n, V]
    else:  # the sampler's own arithmetic (train.true_on_policy), temperature divided inside
        logp = log_softmax(raw, 1.0 if greedy else temperature)  # [n, V]
    truncate = not greedy and (top_p < 1.0 or top_k > 0)
    if truncate:
        # The sampler's nucleus recomputed from these logits (temperature already applied: T = 1 there).
        lp = sampler_logprobs(logits, targets, temperature=1.0, top_p=top_p, top_k=top_k)  # [n]
    else:
        lp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [n]
    cand = logits.new_zeros(0)  # [0] placeholder
    if nucleus_ids is not None and nucleus_valid is not None:
        has = nucleus_valid.any(-1)  # [n] bool: position carries a captured nucleus
        raw = logp.gather(-1, nucleus_ids)  # [n, K] untruncated logprobs of the candidates
        # A position without a nucleus gets zeros (finite, and masked out below): an all -inf row would
        # make logsumexp's backward produce NaN even where torch.where discards the value.
        masked = torch.where(nucleus_valid, raw, torch.full_like(raw, float("-inf")))  # [n, K]
        masked = torch.where(has.unsqueeze(-1), masked, torch.zeros_like(raw))  # [n, K]
        log_mass = torch.where(has, torch.logsumexp(masked, dim=-1), torch.zeros_like(lp))  # [n]
        cand = torch.where(nucleus_valid, raw - log_mass.unsqueeze(-1), torch.zeros_like(raw))  # [n, K]
        if not greedy:
            untruncated = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [n]
            lp = torch.where(has, untruncated - log_mass, lp)  # [n] replay the captured nucleus
    ent = logits.new_zeros(0)  # [0] placeholder
    if with_entropy:
        with torch.no_grad():
            ent = -(logp.exp() * logp).sum(-1)  # [n]
    return lp, ent, cand


def head_logprobs(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = -1,
    with_entropy: bool = False,
    nucleus_ids: torch.Tensor | None = None,
    nucleus_valid: torch.Tensor | None = None,
    chunk: int = DEFAULT_CHUNK,
    checkpoint_chunks: bool = True,
    log_softmax: Callable[[torch.Tensor, float], torch.Tensor] | None = None,
) -> HeadOutputs:
    """Logprobs of ``targets`` ``[N]`` given ``hidden`` ``[N, H]`` (row i predicts ``targets[i]``) through
    ``head`` (``[N, H] -> [N, V]``), ``chunk`` rows at a time; see the module docstring.

    ``nucleus_ids`` ``[N, K]`` int64 and ``nucleus_valid`` ``[N, K]`` bool are the captured nucleus of each
    target (padding where ``nucleus_valid`` is False; a row with no valid slot has no nucleus). Gradients
    flow to ``hidden`` and the head's parameters when grad mode is on; ``checkpoint_chunks=False`` keeps
    every chunk's graph instead of recomputing it (for a caller that already holds the full logits).
    ``log_softmax`` ``(raw logits [n, V], T) -> log_softmax(logits / T)``: replaces torch's (the batch-invariant
    one of ``train.true_on_policy``).
    """
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"need hidden [N, H] and targets [N], got {tuple(hidden.shape)} and {tuple(targets.shape)}")
    if chunk < 1:
        raise ValueError(f"chunk must be a positive number of positions, got {chunk}")
    if (nucleus_ids is None) != (nucleus_valid is None):
        raise ValueError("nucleus_ids and nucleus_valid must be given together")
    if nucleus_ids is not None and nucleus_valid is not None:
        if nucleus_ids.dim() != 2 or nucleus_ids.shape[0] != targets.shape[0] or nucleus_valid.shape != nucleus_ids.shape:
            raise ValueError(f"nucleus_ids {tuple(nucleus_ids.shape)} and nucleus_valid {tuple(nucleus_valid.shape)} "
                             f"must both be [N={targets.shape[0]}, K]")
    n = targets.shape[0]
    grad = torch.is_grad_enabled()
    lps, ents, cands = [], [], []
    for start in range(0, n, chunk):
        sl = slice(start, start + chunk)
        args = (hidden[sl], targets[sl],  # [n_c, H], [n_c]
                None if nucleus_ids is None else nucleus_ids[sl],  # [n_c, K]
                None if nucleus_valid is None else nucleus_valid[sl])  # [n_c, K]
        kwargs: dict[str, Any] = {"temperature": temperature, "top_p": top_p, "top_k": top_k,
                                  "with_entropy": with_entropy, "log_softmax": log_softmax}
        if grad and checkpoint_chunks:
            # The chunk's [n_c, V] tensors are dropped after the forward and rebuilt in the backward.
            lp, ent, cand = checkpoint(_chunk_outputs, head, *args, use_reentrant=False, **kwargs)
        else:
            lp, ent, cand = _chunk_outputs(head, *args, **kwargs)
        lps.append(lp)
        ents.append(ent)
        cands.append(cand)
    return HeadOutputs(
        logprobs=torch.cat(lps) if lps else hidden.new_zeros(0, dtype=torch.float32),  # [N]
        entropy=torch.cat(ents) if with_entropy and ents else None,  # [N]
        candidate_logprobs=torch.cat(cands) if nucleus_ids is not None and cands else None,  # [N, K]
    )
