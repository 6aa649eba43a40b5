"""Token sampling for the embedded engine, and the logprob convention it reports.

Convention (protocol.py, shared with the trainer's ``teacher_forced_logprobs``): the reported logprob of a
sampled token is ``log_softmax(logits / T)[token]``, after temperature and *before* top-k/top-p truncation.
Greedy rows (``T < 1e-5``) report ``log_softmax(logits)`` (T taken as 1), as vLLM does for greedy requests.
The token itself is drawn from the truncated, renormalised distribution; the nucleus (ids kept by
top-k/top-p and their renormalised probabilities) can be captured for each draw.

Top-p keeps the smallest prefix of the probability-sorted vocabulary whose mass reaches ``top_p``
(at least one token); top-k keeps the ``k`` most likely (``k <= 0`` disables it); top-k applies first.
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
    """Boolean mask ``[V]`` of the ids top-k/top-p keep from ``probs`` ``[V]``."""
    vocab = probs.shape[-1]
    sorted_probs, order = torch.sort(probs, descending=True)
    keep_sorted = torch.ones(vocab, dtype=torch.bool)
    if 0 < top_k < vocab:
        keep_sorted[top_k:] = False
    if top_p < 1.0:
        kept = torch.where(keep_sorted, sorted_probs, torch.zeros_like(sorted_probs))
        kept = kept / kept.sum()
        before = torch.cumsum(kept, dim=0) - kept  # mass strictly before each id
        keep_sorted &= before < top_p
    keep_sorted[0] = True
    mask = torch.zeros(vocab, dtype=torch.bool)
    mask[order[keep_sorted]] = True
    return mask


def sample_rows(logits: torch.Tensor, rows: list[RowParams]) -> list[Draw]:
    """Sample one token per row of ``logits`` ``[B, V]`` (float32) under each row's parameters."""
    logits = logits.float()
    temps = torch.tensor([r.temperature if r.temperature >= GREEDY_EPS else 1.0 for r in rows])
    logp = torch.log_softmax(logits / temps.unsqueeze(1), dim=-1)  # [B, V] the reported distribution
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
            probs = torch.where(mask, probs, torch.zeros_like(probs))
            probs = probs / probs.sum()
        tokens[i] = torch.multinomial(probs, 1, generator=row.generator)[0]
        if row.want_nucleus:
            ids = torch.nonzero(probs > 0).flatten()
            nuclei[i] = (ids.tolist(), probs[ids].tolist())
    # Batched: the reported logprob and its rank (1 = most likely) for every row at once.
    values = logp.gather(1, tokens.unsqueeze(1))  # [B, 1]
    ranks = ((logp > values).sum(dim=1) + 1).tolist()
    values_l, tokens_l = values.squeeze(1).tolist(), tokens.tolist()
    draws: list[Draw] = []
    for i, row in enumerate(rows):
        top: list[tuple[int, float]] = []
        if row.num_logprobs > 0:
            vals, idx = torch.topk(logp[i], min(row.num_logprobs, logp.shape[1]))
            top = list(zip(idx.tolist(), vals.tolist(), strict=True))
        nucleus = nuclei[i]
        draws.append(Draw(tokens_l[i], values_l[i], ranks[i], top,
                          nucleus[0] if nucleus else None, nucleus[1] if nucleus else None))
    return draws
