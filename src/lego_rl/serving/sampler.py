"""Token sampling for the embedded engine, and the logprob convention it reports.

Convention (protocol.py; the trainer's side is ``logprobs.sampler_logprobs``): the reported logprob of a
sampled token is its log-probability under the distribution it was drawn from: ``softmax(logits / T)``
restricted to the top-k/top-p nucleus and renormalised there. Without truncation (``top_p = 1``,
``top_k <= 0``) that is ``log_softmax(logits / T)[token]``. This is what vLLM reports with ``--logprobs-mode
processed_logprobs``. Greedy rows (``T < 1e-5``) ignore top-k/top-p and report ``log_softmax(logits)`` (T taken
as 1), as vLLM does for greedy requests. The nucleus (kept ids and their renormalised probabilities) can be
captured for each draw.

Top-k keeps every id whose probability reaches the k-th largest (ties at the k-th are kept, as in vLLM;
``k <= 0`` disables it) and applies first; top-p then keeps, of the renormalised rest, the smallest
probability-sorted prefix whose mass reaches ``top_p`` (at least one id).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GREEDY_EPS = 1e-5


@dataclass
class RowParams:
    """What the sampler needs of one request."""

    temperature: float
    top_p: float
    top_k: int
    num_logprobs: int
    """How many top alternatives to report (0: only the sampled token)."""
    want_nucleus: bool
    generator: torch.Generator | None


@dataclass
class Draw:
    """One sampled token with its logprob, rank, top alternatives and (optionally) nucleus."""

    token: int
    logprob: float
    rank: int
    top: list[tuple[int, float]]
    nucleus_ids: list[int] | None = None
    nucleus_probs: list[float] | None = None


def truncation_mask(probs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Boolean mask ``[..., V]`` of the ids top-k/top-p keep from ``probs`` ``[..., V]`` (one row or a batch)."""
    vocab = probs.shape[-1]
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)  # [..., V]
    keep_sorted = torch.ones_like(sorted_probs, dtype=torch.bool)  # [..., V]
    if 0 < top_k < vocab:
        keep_sorted &= sorted_probs >= sorted_probs[..., top_k - 1 : top_k]  # ties with the k-th stay
    if top_p < 1.0:
        kept = torch.where(keep_sorted, sorted_probs, torch.zeros_like(sorted_probs))  # [..., V]
        kept = kept / kept.sum(dim=-1, keepdim=True)
        before = torch.cumsum(kept, dim=-1) - kept  # [..., V] mass strictly before each id
        keep_sorted &= before < top_p
    keep_sorted[..., 0] = True
    return torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)  # [..., V] back in vocab order


def sample_rows(logits: torch.Tensor, rows: list[RowParams]) -> list[Draw]:
    """Sample one token per row of ``logits`` ``[B, V]`` (float32) under each row's parameters."""
    logits = logits.float()
    temps = torch.tensor([r.temperature if r.temperature >= GREEDY_EPS else 1.0 for r in rows])
    logp = torch.log_softmax(logits / temps.unsqueeze(1), dim=-1)  # [B, V] before truncation
    reported = logp.clone()  # [B, V] the distribution each row samples from (the reported logprobs)
    tokens = torch.argmax(logits, dim=-1)  # greedy rows keep these
    nuclei: list[tuple[list[int], list[float]] | None] = [None] * len(rows)
    for i, row in enumerate(rows):
        if row.temperature < GREEDY_EPS:
            if row.want_nucleus:
                nuclei[i] = ([int(tokens[i])], [1.0])
            continue
        probs = logp[i].exp()
        if row.top_k > 0 or row.top_p < 1.0:
            mask = truncation_mask(probs, row.top_k, row.top_p)
            reported[i] = torch.log_softmax(logp[i].masked_fill(~mask, float("-inf")), dim=-1)
            probs = reported[i].exp()  # exactly 0 outside the nucleus
        tokens[i] = torch.multinomial(probs, 1, generator=row.generator)[0]
        if row.want_nucleus:
            ids = torch.nonzero(probs > 0).flatten()
            nuclei[i] = (ids.tolist(), probs[ids].tolist())
    # Batched: the reported logprob and its rank (1 = most likely; truncation keeps the order) for every row.
    values = reported.gather(1, tokens.unsqueeze(1))  # [B, 1]
    ranks = ((logp > logp.gather(1, tokens.unsqueeze(1))).sum(dim=1) + 1).tolist()
    values_l, tokens_l = values.squeeze(1).tolist(), tokens.tolist()
    draws: list[Draw] = []
    for i, row in enumerate(rows):
        top: list[tuple[int, float]] = []
        if row.num_logprobs > 0:
            vals, idx = torch.topk(reported[i], min(row.num_logprobs, reported.shape[1]))
            # Alternatives outside the nucleus have probability 0 under this distribution: not reported.
            top = [(t, v) for t, v in zip(idx.tolist(), vals.tolist(), strict=True) if v > float("-inf")]
        nucleus = nuclei[i]
        draws.append(Draw(tokens_l[i], values_l[i], ranks[i], top,
                          nucleus[0] if nucleus else None, nucleus[1] if nucleus else None))
    return draws
