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

from collections.abc import Callable
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


CANDIDATES = 1024
"""How many of the most likely ids ``truncation_mask`` sorts first; a row whose nucleus may reach past them is
done again over the whole vocabulary."""


def truncation_mask(probs: torch.Tensor, top_k: int | torch.Tensor, top_p: float | torch.Tensor,
                    candidates: int = CANDIDATES) -> torch.Tensor:
    """Boolean mask ``[..., V]`` of the ids top-k/top-p keep from ``probs`` ``[..., V]`` (one row or a batch).

    ``top_k``/``top_p`` are one value for every row, or tensors ``[B]`` with one value per row of a batch
    ``[B, V]`` (a row with ``top_k <= 0`` and ``top_p >= 1`` keeps everything).

    Only the ``candidates`` most likely ids are sorted (``topk``) at first: a trained model's nucleus is
    usually far smaller than the vocabulary, and a full sort of every row (151,936 ids) is what made top-p
    sampling cost 2–3× top-p = 1. A row is decided there when nothing past its candidates can be kept: its
    top-k stops inside them, or (without top-k) their mass already reaches ``top_p``. The other rows are sorted
    in full. Both give the same mask (the candidates are the sorted prefix of the full order).
    """
    vocab = probs.shape[-1]
    flat = probs.reshape(-1, vocab)  # [B, V]
    rows = flat.shape[0]
    k = (top_k.to(probs.device) if isinstance(top_k, torch.Tensor)
         else torch.full((rows,), int(top_k), device=probs.device)).clamp(max=vocab)  # [B]
    p = (top_p.to(probs.device) if isinstance(top_p, torch.Tensor)
         else torch.full((rows,), float(top_p), device=probs.device))  # [B]
    by_k = k > 0  # [B]
    mask = torch.ones_like(flat, dtype=torch.bool)  # [B, V] rows with nothing to truncate keep every id
    # Rows the candidates can decide: top-k inside them, or a nucleus they can reach (their share of the mass
    # is at most candidates × the row's largest probability, so a flat row goes straight to the full sort).
    reach = flat.amax(-1) * candidates >= p * flat.sum(-1)  # [B]
    may = (by_k & (k <= candidates)) | (~by_k & (p < 1.0) & reach)  # [B]
    if candidates >= vocab:
        may = torch.zeros_like(may)
    redo = (by_k | (p < 1.0)) & ~may  # [B]
    if bool(may.any()):
        idx = may.nonzero().squeeze(-1)  # [M]
        keep, decided = _candidate_mask(flat[idx], k[idx], p[idx], candidates)  # [M, V], [M]
        mask[idx] = keep
        redo[idx] = ~decided
    if bool(redo.any()):
        idx = redo.nonzero().squeeze(-1)  # [R]
        mask[idx] = _full_mask(flat[idx], k[idx], p[idx])  # [R, V]
    return mask.view(probs.shape)


def _candidate_mask(probs: torch.Tensor, k: torch.Tensor, p: torch.Tensor, candidates: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """``truncation_mask`` over each row's ``candidates`` most likely ids: ``probs`` [B, V], ``k``/``p`` [B] →
    (mask [B, V], decided [B]: whether nothing past the candidates can be kept, i.e. the mask is the row's)."""
    vals, order = torch.topk(probs, candidates, dim=-1)  # [B, C] descending: the full order's first C
    by_k = k > 0  # [B]
    kth = vals.gather(-1, (k.clamp(1, candidates) - 1).unsqueeze(-1))  # [B, 1] k-th largest (if k <= C)
    keep = (vals >= kth) | ~by_k.unsqueeze(-1)  # [B, C] ties with the k-th stay
    # Without top-k the nucleus renormalises by the whole row's mass; with it, by the top-k mass (all inside
    # the candidates when the row is decided here).
    total = torch.where(by_k, torch.where(keep, vals, 0.0).sum(-1), probs.sum(-1))  # [B]
    kept = torch.where(keep, vals, 0.0) / total.unsqueeze(-1)  # [B, C]
    cum = torch.cumsum(kept, dim=-1)  # [B, C]
    keep &= (cum - kept < p.unsqueeze(-1)) | (p >= 1.0).unsqueeze(-1)  # mass strictly before each id
    keep[:, 0] = True
    k_inside = by_k & (k <= candidates) & (vals[:, -1] < kth.squeeze(-1))  # [B] top-k ends inside
    p_inside = ~by_k & (p < 1.0) & (cum[:, -1] >= p)  # [B] the nucleus ends inside
    return torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, order, keep), k_inside | p_inside


def _full_mask(probs: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``truncation_mask`` by a sort of every id: ``probs`` [B, V], ``k``/``p`` [B] → [B, V]."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)  # [B, V]
    by_k = (k > 0).unsqueeze(-1)  # [B, 1]
    kth = sorted_probs.gather(-1, (k.clamp(min=1) - 1).unsqueeze(-1))  # [B, 1] the k-th largest per row
    keep_sorted = (sorted_probs >= kth) | ~by_k  # [B, V] ties with the k-th stay
    total = torch.where(by_k.squeeze(-1), torch.where(keep_sorted, sorted_probs, 0.0).sum(-1), probs.sum(-1))  # [B]
    kept = torch.where(keep_sorted, sorted_probs, 0.0) / total.unsqueeze(-1)  # [B, V]
    before = torch.cumsum(kept, dim=-1) - kept  # [B, V] mass strictly before each id
    keep_sorted &= (before < p.unsqueeze(-1)) | (p >= 1.0).unsqueeze(-1)
    keep_sorted[:, 0] = True
    return torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)  # [B, V] back in vocab order


def is_plain(row: RowParams) -> bool:
    """Whether ``row``'s draw needs nothing but its logits, its temperature and one uniform number: no top-k/top-p,
    at most one alternative (the protocol's default ``logprobs = 1``), no nucleus. Such rows are sampled by
    :func:`draw_plain`, which has no data-dependent control flow and no host synchronisation, so a decode step's
    CUDA graph can run it (``StaticDecoder.decode_draw``)."""
    return row.top_p >= 1.0 and row.top_k <= 0 and row.num_logprobs <= 1 and not row.want_nucleus


def plain_inputs(rows: list[RowParams]) -> tuple[list[float], list[float]]:
    """Per row: the temperature (0.0 = greedy) and the uniform number of this draw, taken from the row's
    generator exactly as :func:`sample_rows` takes it (one per token, none for greedy rows)."""
    temps = [r.temperature if r.temperature >= GREEDY_EPS else 0.0 for r in rows]
    u = [float(torch.rand((), generator=r.generator)) if r.temperature >= GREEDY_EPS else 0.0 for r in rows]
    return temps, u


def draw_plain(logits: torch.Tensor, temps: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """:func:`sample_rows`' arithmetic for plain rows (:func:`is_plain`) as tensor ops alone: ``logits`` [B, V],
    ``temps`` [B] (float32 values; below ``GREEDY_EPS`` = greedy), ``u`` [B] float64 → ``[B, 5]`` float64 of
    (token, logprob, rank, most likely id, its logprob) — exact, so one device-to-host copy returns a step's
    draws. The same ops in the same order as ``sample_rows``, so the numbers are the same (tested)."""
    logits = logits.float()  # [B, V]
    greedy = temps < GREEDY_EPS  # [B]
    t = torch.where(greedy, torch.ones_like(temps), temps).float()  # [B]
    logp = torch.log_softmax(logits / t.unsqueeze(1), dim=-1)  # [B, V]
    cdf = torch.cumsum(logp.exp().double(), dim=-1)  # [B, V]
    drawn = torch.searchsorted(cdf, (u.double() * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)  # [B]
    drawn = drawn.clamp(max=logits.shape[1] - 1)
    tokens = torch.where(greedy, torch.argmax(logits, dim=-1), drawn)  # [B]
    values = logp.gather(1, tokens.unsqueeze(1))  # [B, 1]
    ranks = (logp > values).sum(dim=1) + 1  # [B]
    top_v, top_i = torch.topk(logp, 1, dim=1)  # [B, 1] as sample_rows takes a row's one alternative
    return torch.stack([tokens.double(), values.squeeze(1).double(), ranks.double(), top_i.squeeze(1).double(),
                        top_v.squeeze(1).double()], dim=1)  # [B, 5]


def plain_draws(packed: list[list[float]], rows: list[RowParams]) -> list[Draw]:
    """``draw_plain``'s rows, moved to the host (``.tolist()``), as ``Draw``s of ``rows``."""
    return [Draw(int(tok), lp, int(rank), [(int(top), top_lp)] if row.num_logprobs and top_lp > float("-inf") else [])
            for (tok, lp, rank, top, top_lp), row in zip(packed, rows, strict=True)]


LogSoftmax = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``(logits [B, V], temperatures [B]) -> log_softmax(logits / T)`` [B, V]."""


def sample_rows(logits: torch.Tensor, rows: list[RowParams], log_softmax: LogSoftmax | None = None) -> list[Draw]:
    """Sample one token per row of ``logits`` ``[B, V]`` under each row's parameters, on ``logits``' device.

    The whole batch is processed with batched tensor ops (one truncation sort for all truncated rows, one
    transfer of the results), so the CPU engine and the GPU decode path share this code. Each row draws one
    uniform number per token from its own generator (CPU, so a seed means the same on every device) and
    picks its token by inverting the cumulative distribution (float64): a row's tokens depend on its seed and
    its logits only, never on the other rows of the batch. ``log_softmax``: how the untruncated logprobs are
    computed (``batch_invariant.log_softmax`` under ``train.true_on_policy``; default torch's).
    """
    dev = logits.device
    logits = logits.float()  # [B, V]
    greedy = torch.tensor([r.temperature < GREEDY_EPS for r in rows], device=dev)  # [B]
    temps = torch.tensor([r.temperature if r.temperature >= GREEDY_EPS else 1.0 for r in rows], device=dev)  # [B]
    if log_softmax is None:
        logp = torch.log_softmax(logits / temps.unsqueeze(1), dim=-1)  # [B, V] before truncation
    else:
        logp = log_softmax(logits, temps)  # [B, V]
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
