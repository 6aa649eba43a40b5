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


def truncation_mask(probs: torch.Tensor, top_k: int | torch.Tensor, top_p: float | torch.Tensor) -> torch.Tensor:
    """Boolean mask ``[..., V]`` of the ids top-k/top-p keep from ``probs`` ``[..., V]`` (one row or a batch).

    ``top_k``/``top_p`` are one value for every row, or tensors ``[B]`` with one value per row of a batch
    ``[B, V]`` (a row with ``top_k <= 0`` and ``top_p >= 1`` keeps everything).
    """
    vocab = probs.shape[-1]
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)  # [..., V]
    keep_sorted = torch.ones_like(sorted_probs, dtype=torch.bool)  # [..., V]
    if isinstance(top_k, torch.Tensor):
        k = top_k.to(probs.device).clamp(0, vocab)  # [B]
        kth = sorted_probs.gather(-1, (k - 1).clamp(min=0).unsqueeze(-1))  # [B, 1] the k-th largest per row
        keep_sorted &= (sorted_probs >= kth) | (k <= 0).unsqueeze(-1)  # [B, V] ties with the k-th stay
    elif 0 < top_k < vocab:
        keep_sorted &= sorted_probs >= sorted_probs[..., top_k - 1 : top_k]  # ties with the k-th stay
    if isinstance(top_p, torch.Tensor) or top_p < 1.0:
        p = top_p.to(probs.device).unsqueeze(-1) if isinstance(top_p, torch.Tensor) else top_p  # [B, 1] or scalar
        kept = torch.where(keep_sorted, sorted_probs, torch.zeros_like(sorted_probs))  # [..., V]
        kept = kept / kept.sum(dim=-1, keepdim=True)
        before = torch.cumsum(kept, dim=-1) - kept  # [..., V] mass strictly before each id
        keep_sorted &= before < p
    keep_sorted[..., 0] = True
    return torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)  # [..., V] back in vocab order


def sample_rows(logits: torch.Tensor, rows: list[RowParams]) -> list[Draw]:
    """Sample one token per row of ``logits`` ``[B, V]`` under each row's parameters, on ``logits``' device.

    The whole batch is processed with batched tensor ops (one truncation sort for all truncated rows, one
    transfer of the results), so the CPU engine and the GPU decode path share this code. Each row draws one
    uniform number per token from its own generator (CPU, so a seed means the same on every device) and
    picks its token by inverting the cumulative distribution (float64): a row's tokens depend on its seed and
    its logits only, never on the other rows of the batch.
    """
    dev = logits.device
    logits = logits.float()  # [B, V]
    greedy = torch.tensor([r.temperature < GREEDY_EPS for r in rows], device=dev)  # [B]
    temps = torch.tensor([r.temperature if r.temperature >= GREEDY_EPS else 1.0 for r in rows], device=dev)  # [B]
    logp = torch.log_softmax(logits / temps.unsqueeze(1), dim=-1)  # [B, V] before truncation
    reported = logp  # [B, V] the distribution each row samples from (the reported logprobs)
    truncated = [r.temperature >= GREEDY_EPS and (r.top_k > 0 or r.top_p < 1.0) for r in rows]
    if any(truncated):
        ks = torch.tensor([r.top_k if t else 0 for r, t in zip(rows, truncated, strict=True)])  # [B]
        ps = torch.tensor([r.top_p if t else 1.0 for r, t in zip(rows, truncated, strict=True)])  # [B]
        mask = truncation_mask(logp.exp(), ks, ps)  # [B, V]
        renorm = torch.log_softmax(logp.masked_fill(~mask, float("-inf")), dim=-1)  # [B, V]
        # Untruncated rows keep logp bit for bit (a second log_softmax would move it by rounding).
        reported = torch.where(torch.tensor(truncated, device=dev).unsqueeze(1), renorm, logp)  # [B, V]
    probs = reported.exp()  # [B, V] exactly 0 outside each nucleus
    u = torch.tensor([float(torch.rand((), generator=r.generator)) if r.temperature >= GREEDY_EPS else 0.0
                      for r in rows], dtype=torch.float64).to(dev)  # [B]
    cdf = torch.cumsum(probs.double(), dim=-1)  # [B, V]
    # The first id whose cumulative mass exceeds u·total: an id of probability 0 is never picked.
    drawn = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)  # [B]
    drawn = drawn.clamp(max=logits.shape[1] - 1)
    tokens = torch.where(greedy, torch.argmax(logits, dim=-1), drawn)  # [B]
    values = reported.gather(1, tokens.unsqueeze(1)).squeeze(1)  # [B]
    # Rank of the sampled id (1 = most likely; truncation keeps the order).
    ranks = (logp > logp.gather(1, tokens.unsqueeze(1))).sum(dim=1) + 1  # [B]
    max_top = max(r.num_logprobs for r in rows)
    top_vals: list[list[float]] = []
    top_ids: list[list[int]] = []
    if max_top > 0:
        tv, ti = torch.topk(reported, min(max_top, reported.shape[1]), dim=1)  # [B, k]
        top_vals, top_ids = tv.tolist(), ti.tolist()
    want = [i for i, r in enumerate(rows) if r.want_nucleus and r.temperature >= GREEDY_EPS]
    nucleus_ids: dict[int, list[int]] = {}
    nucleus_probs: dict[int, list[float]] = {}
    if want:
        sel = torch.tensor(want, device=dev)  # [W]
        keep = probs.index_select(0, sel) > 0  # [W, V]
        where = torch.nonzero(keep)  # [N, 2] (row in sel, id), row-major so ids ascend per row
        kept_probs = probs.index_select(0, sel)[keep].tolist()  # [N]
        counts = keep.sum(dim=1).tolist()  # [W]
        ids = where[:, 1].tolist()
        at = 0
        for i, n in zip(want, counts, strict=True):
            nucleus_ids[i], nucleus_probs[i] = ids[at : at + n], kept_probs[at : at + n]
            at += n
    tokens_l, values_l, ranks_l = tokens.tolist(), values.tolist(), ranks.tolist()
    draws: list[Draw] = []
    for i, row in enumerate(rows):
        top: list[tuple[int, float]] = []
        if row.num_logprobs > 0:
            # Alternatives outside the nucleus have probability 0 under this distribution: not reported.
            top = [(t, v) for t, v in zip(top_ids[i][: row.num_logprobs], top_vals[i][: row.num_logprobs],
                                          strict=True) if v > float("-inf")]
        n_ids, n_probs = nucleus_ids.get(i), nucleus_probs.get(i)
        if row.want_nucleus and row.temperature < GREEDY_EPS:
            n_ids, n_probs = [tokens_l[i]], [1.0]
        draws.append(Draw(tokens_l[i], values_l[i], ranks_l[i], top, n_ids, n_probs))
    return draws
