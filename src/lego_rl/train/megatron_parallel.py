"""How Megatron ranks share a step's work and results: which micro-batches a rank runs, and the collectives
that bring per-rank results (logprobs, losses, paths) to every rank.

Every rank knows every micro-batch (SPMD): micro-batch ``i`` runs on data-parallel rank ``i mod dp``. With expert
parallelism the ranks' micro-batches are padded into rounds of equal token counts (``rounds``), which
megatron-core's all-gather dispatcher needs. Logprobs and losses are computed on the last pipeline stage and
broadcast to the others (``from_last_stage``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lego_rl.train.batching import MicroBatch
from lego_rl.train.megatron_setup import MegatronRank


def padded(mb: MicroBatch, length: int) -> MicroBatch:
    """``mb`` with one padding segment appended up to ``length`` tokens: token id 0, loss mask, token weight,
    advantage and logprobs 0, no route (R3 replays experts 0..k-1 there), its own ``cu_seqlens`` entry so it
    attends only to itself. Nothing of ``mb`` changes: its positions attend to what they did, and the padding's
    terms in every loss are weighted 0. ``mb`` cut to 0 tokens becomes a micro-batch of padding only."""
    extra = length - mb.num_tokens
    if extra <= 0:
        return mb

    def grow(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, t.new_zeros((extra, *t.shape[1:]))])  # [length, ...]

    def maybe(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else grow(t)

    return MicroBatch(
        input_ids=grow(mb.input_ids),  # [length]
        position_ids=torch.cat([mb.position_ids, torch.arange(extra, dtype=mb.position_ids.dtype)]),  # [length]
        cu_seqlens=torch.cat([mb.cu_seqlens, mb.cu_seqlens.new_tensor([length])]),  # [S+2]
        loss_mask=grow(mb.loss_mask), rollout_logprobs=grow(mb.rollout_logprobs), advantages=grow(mb.advantages),
        token_weights=grow(mb.token_weights), rollout_slots=grow(mb.rollout_slots),  # [length] each
        sample_indices=list(mb.sample_indices), nucleus_ids=maybe(mb.nucleus_ids),
        nucleus_probs=maybe(mb.nucleus_probs), nucleus_valid=maybe(mb.nucleus_valid),  # [length, K]
        routed_experts=maybe(mb.routed_experts), routes_valid=maybe(mb.routes_valid))  # [length, L, K], [length]


def blank(like: MicroBatch, length: int) -> MicroBatch:
    """A micro-batch of ``length`` padding tokens (one segment), with ``like``'s optional fields."""
    cut = MicroBatch(
        input_ids=like.input_ids[:0], position_ids=like.position_ids[:0], cu_seqlens=like.cu_seqlens[:1],
        loss_mask=like.loss_mask[:0], rollout_logprobs=like.rollout_logprobs[:0], advantages=like.advantages[:0],
        token_weights=like.token_weights[:0], rollout_slots=like.rollout_slots[:0], sample_indices=[],
        **{name: None if getattr(like, name) is None else getattr(like, name)[:0] for name in (
            "nucleus_ids", "nucleus_probs", "nucleus_valid", "routed_experts", "routes_valid")})
    return padded(cut, length)


def mine(r: MegatronRank, n: int) -> list[int]:
    """Indices of the micro-batches this data-parallel rank runs."""
    return list(range(r.layout.dp_rank, n, r.layout.dp))


def rounds(r: MegatronRank, micro_batches: Sequence[MicroBatch]) -> list[tuple[int | None, MicroBatch]]:
    """This rank's micro-batches as ``(index in micro_batches, what runs)``, one per forward.

    Without expert parallelism that is ``mine``'s, unchanged. With it, megatron-core's all-gather dispatcher
    gathers the tokens of every rank of an expert-parallel group with equal-size collectives, in forward and
    backward: every DP rank must run the same number of forwards, round ``j`` with the same token count. Round
    ``j`` is micro-batches ``j·dp .. j·dp + dp - 1`` (one per DP rank); each is padded to the longest of them
    (``padded``), and a rank with none that round runs padding only (index None). Every rank knows every
    micro-batch (SPMD), so this needs no communication."""
    own = mine(r, len(micro_batches))
    if r.layout.ep == 1:
        return [(i, micro_batches[i]) for i in own]
    dp, n = r.layout.dp, len(micro_batches)
    out: list[tuple[int | None, MicroBatch]] = []
    for j in range(-(-n // dp)):
        length = max(mb.num_tokens for mb in micro_batches[j * dp:(j + 1) * dp])
        i = j * dp + r.layout.dp_rank
        out.append((i, padded(micro_batches[i], length)) if i < n else (None, blank(micro_batches[0], length)))
    return out


def share_over_dp(r: MegatronRank, n: int, local: dict[int, torch.Tensor]) -> list[torch.Tensor]:
    """Every micro-batch's CPU tensor on every rank, from each DP rank's share."""
    if r.layout.dp == 1:
        return [local[i] for i in range(n)]
    from megatron.core import parallel_state as ps

    parts: list[Any] = [None] * r.layout.dp
    dist.all_gather_object(parts, local, group=ps.get_data_parallel_group_gloo())
    merged: dict[int, torch.Tensor] = {}
    for part in parts:
        merged.update(part)
    return [merged[i] for i in range(n)]


def sum_over_dp(r: MegatronRank, loss_sum: float, metrics: dict[str, float]) -> tuple[float, dict[str, float]]:
    """The step's loss and metric sums over every DP rank's micro-batches (each rank holds its own partial sums),
    added in float64."""
    if r.layout.dp == 1:
        return loss_sum, metrics
    from megatron.core import parallel_state as ps

    keys = sorted(metrics)
    summed = torch.tensor([loss_sum] + [metrics[k] for k in keys], dtype=torch.float64)  # [1+M]
    gathered: list[Any] = [None] * r.layout.dp
    dist.all_gather_object(gathered, (keys, summed), group=ps.get_data_parallel_group_gloo())
    totals: dict[str, float] = {}
    loss_sum = 0.0
    for part_keys, part in gathered:
        loss_sum += float(part[0])
        for k, v in zip(part_keys, part[1:].tolist(), strict=True):
            totals[k] = totals.get(k, 0.0) + v
    return loss_sum, totals


def from_last_stage(r: MegatronRank, mbs: Sequence[MicroBatch], values: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per micro-batch [T] CPU tensors held by the last stage, on every stage (one broadcast over the pipeline
    group: every stage knows the lengths)."""
    if r.layout.pp == 1:
        return [v.cpu() for v in values]
    sizes = [mb.num_tokens for mb in mbs]
    if not sizes:
        return []
    if r.stage.last:
        flat = torch.cat(values).float().contiguous()  # [ΣT]
    else:
        flat = torch.empty(sum(sizes), device=r.device)  # [ΣT]
    from megatron.core import parallel_state as ps

    dist.broadcast(flat, src=r.pp_ranks[-1], group=ps.get_pipeline_model_parallel_group())
    return [t.cpu() for t in flat.split(sizes)]


def from_last_stage_object(r: MegatronRank, value: Any) -> Any:
    """A small Python value of the last stage's, on every stage of the pipeline."""
    if r.layout.pp == 1:
        return value
    from megatron.core import parallel_state as ps

    box = [value if r.stage.last else None]
    dist.broadcast_object_list(box, src=r.pp_ranks[-1], group=ps.get_pipeline_model_parallel_group())
    return box[0]


def broadcast_path(r: MegatronRank, tmp: Path | None) -> Path:
    """Rank 0's ``tmp`` on every rank."""
    if r.layout.world == 1:
        assert tmp is not None
        return tmp
    box: list[Any] = [str(tmp) if tmp is not None else None]
    dist.broadcast_object_list(box, src=0)
    return Path(box[0])


def barrier(r: MegatronRank) -> None:
    """Wait for every rank (nothing to wait for alone)."""
    if r.layout.world > 1:
        dist.barrier()
