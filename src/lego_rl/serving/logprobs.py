"""The trainer's recomputation of sampled-token logprobs, under the serving logprob convention.

Convention (decided for rollout and trainer alike; ``protocol.py``): a token's logprob is its log-probability
under the distribution the sampler drew it from: ``softmax(logits / T)`` truncated by top-k, then top-p, and
renormalised over the kept ids (the nucleus). The embedded engine reports exactly that, and so does vLLM with
``--logprobs-mode processed_logprobs`` (its top-k/top-p mask the logits before the log-softmax). Without
truncation it is plain ``log_softmax(logits / T)``; greedy (``T < 1e-5``) takes T as 1 and ignores the
truncation, as both engines do.

``sampler_logprobs`` is the pure function of logits the trainer applies when it wants numbers comparable
with the rollout's (consistency figures, TIS/MIS against the behaviour policy). With the nucleus captured at
sampling time (``rollout.capture_nucleus``) it replays those exact ids, as the reference example's trainer
does; otherwise it recomputes the nucleus from its own logits, and always keeps the sampled id in it (the
sampler did: a boundary id that rounding moves out of the trainer's nucleus must not become ``-inf``).
``teacher_forced_logprobs`` runs the forward pass for one sequence and applies it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lego_rl.serving.sampler import GREEDY_EPS, truncation_mask

CHUNK_ROWS = 256
"""Positions truncated at once: the sort of a ``[rows, V]`` block bounds memory (256 × 151k fp32 ≈ 155 MB)."""


def sampler_logprobs(logits: torch.Tensor, tokens: torch.Tensor, *, temperature: float, top_p: float = 1.0,
                     top_k: int = -1, nucleus_ids: Sequence[Sequence[int]] | None = None) -> torch.Tensor:
    """Logprobs ``[N]`` (float32) of ``tokens`` ``[N]`` under ``logits`` ``[N, V]`` by the sampler's convention.

    ``nucleus_ids[i]``, when given, is the captured nucleus of position ``i`` (it must hold ``tokens[i]``).
    Differentiable in ``logits`` (the nucleus selection itself is not).
    """
    if logits.dim() != 2 or tokens.shape != logits.shape[:1]:
        raise ValueError(f"need logits [N, V] and tokens [N], got {tuple(logits.shape)} and {tuple(tokens.shape)}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    greedy = temperature < GREEDY_EPS
    logp = torch.log_softmax(logits.float() / (1.0 if greedy else temperature), dim=-1)  # [N, V]
    picked = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # [N] untruncated
    if greedy or (nucleus_ids is None and top_p >= 1.0 and top_k <= 0):
        return picked
    if nucleus_ids is not None:
        if len(nucleus_ids) != tokens.numel():
            raise ValueError(f"{len(nucleus_ids)} captured nuclei for {tokens.numel()} tokens")
        norms = []
        for i, ids in enumerate(nucleus_ids):
            if int(tokens[i]) not in ids:
                raise ValueError(f"position {i}: sampled id {int(tokens[i])} is not in its captured nucleus")
            norms.append(torch.logsumexp(logp[i, list(ids)], dim=0))  # [] log-mass of the nucleus
        return picked - torch.stack(norms)  # [N]
    out = []
    for start in range(0, tokens.numel(), CHUNK_ROWS):
        block = logp[start : start + CHUNK_ROWS]  # [n, V]
        tok = tokens[start : start + CHUNK_ROWS]  # [n]
        keep = truncation_mask(block.detach().exp(), top_k, top_p)  # [n, V]
        keep.scatter_(-1, tok.unsqueeze(-1), True)  # the sampled id was in the sampler's nucleus
        log_mass = torch.logsumexp(block.masked_fill(~keep, float("-inf")), dim=-1)  # [n]
        out.append(block.gather(-1, tok.unsqueeze(-1)).squeeze(-1) - log_mass)  # [n]
    return torch.cat(out)  # [N]


def teacher_forced_logprobs(model: Any, ids: list[int] | torch.Tensor, prompt_len: int, temperature: float, *,
                            top_p: float = 1.0, top_k: int = -1,
                            nucleus_ids: Sequence[Sequence[int]] | None = None) -> torch.Tensor:
    """Logprobs ``[len(ids) - prompt_len]`` (float32) of ``ids[prompt_len:]`` given everything before them,
    by ``sampler_logprobs`` (pass the rollout's ``top_p``/``top_k``, and its nuclei when captured)."""
    seq = torch.as_tensor(ids, dtype=torch.long).flatten()
    if not 0 < prompt_len < seq.numel():
        raise ValueError(f"prompt_len must be in [1, {seq.numel() - 1}] for {seq.numel()} ids, got {prompt_len}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    device = next(model.parameters()).device
    with torch.inference_mode():
        # Logits at positions prompt_len-1 .. n-2 predict ids prompt_len .. n-1.
        n_out = seq.numel() - prompt_len
        out = model(input_ids=seq[:-1].unsqueeze(0).to(device), use_cache=False, logits_to_keep=n_out)
        logits = out.logits[0, -n_out:].float()  # [n_out, V]
        targets = seq[prompt_len:].to(device)  # [n_out]
        return sampler_logprobs(logits, targets, temperature=temperature, top_p=top_p, top_k=top_k,
                                nucleus_ids=nucleus_ids).cpu()
