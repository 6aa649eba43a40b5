"""Packing segments into optimizer steps and micro-batches (pure torch, no model).

Two rules from fan-out semantics shape this module:

* **A rollout never straddles optimizer steps.** Rollouts (not segments) are assigned to steps; all of a
  rollout's segments go into the same step, possibly into different micro-batches of it.
* **One loss denominator per rollout.** A rollout's trained tokens are averaged over the total number
  of unmasked tokens of *that rollout*, counted across all its segments and micro-batches, and the step
  averages its rollouts. ``token_weights`` carries exactly that, so the trainer's step loss is
  ``sum over micro-batches of (token_weights * per_token_loss).sum()``: gradient accumulation by plain
  summation gives ``(1/R) * sum_r (1/N_r) * sum_{t in r} loss_t``.

Nothing assumes the number of samples equals rollouts × samples per prompt: sub-agents and compaction
add segments, and packing works on whatever arrives.

Tensors are aligned with ``tokens`` (no shift): ``loss_mask[i]`` refers to ``input_ids[i]`` being
predicted from the positions before it; the loss shifts logits by one, as usual for causal LMs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from lego_rl.errors import ConfigError, TrajectoryError
from lego_rl.train.routing_replay import micro_batch_routes
from lego_rl.trajectory.sample import Sample


@dataclass
class MicroBatch:
    """Segments packed into one sequence of ``T`` tokens (varlen layout, ``S`` segments).

    ``input_ids``, ``position_ids`` (restart at 0 per segment), ``loss_mask``, ``rollout_logprobs``,
    ``advantages``, ``token_weights`` and ``rollout_slots`` (index into the step's ``rollout_ids``)
    are ``[T]``; ``cu_seqlens`` is ``[S + 1]`` int32; ``sample_indices[s]`` indexes the input samples.

    When the samples carry the sampler's captured nucleus, ``nucleus_ids`` ``[T, K]`` int64,
    ``nucleus_probs`` ``[T, K]`` float32 and ``nucleus_valid`` ``[T, K]`` bool hold it per token (``K`` the
    largest nucleus in the micro-batch; shorter ones padded, context tokens all padding); else None.

    When the samples carry MoE routing (R3), ``routed_experts`` ``[T, L, K]`` int16 holds each position's
    experts per MoE layer and ``routes_valid`` ``[T]`` bool where one was recorded
    (``train.routing_replay.sample_routes`` says which route a position gets); else None.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    loss_mask: torch.Tensor
    rollout_logprobs: torch.Tensor
    advantages: torch.Tensor
    token_weights: torch.Tensor
    rollout_slots: torch.Tensor
    sample_indices: list[int]
    nucleus_ids: torch.Tensor | None = None
    nucleus_probs: torch.Tensor | None = None
    nucleus_valid: torch.Tensor | None = None
    routed_experts: torch.Tensor | None = None
    routes_valid: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())


@dataclass
class OptimizerStep:
    """Everything one optimizer step consumes; ``rollout_token_counts[r]`` is rollout r's denominator."""

    rollout_ids: list[str]
    rollout_token_counts: list[int]
    micro_batches: list[MicroBatch] = field(default_factory=list)


def _pack(lengths: dict[int, int], capacity: int) -> list[list[int]]:
    """First-fit decreasing: sample indices per micro-batch, each bin at most ``capacity`` tokens."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(lengths, key=lambda k: (-lengths[k], k)):
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(capacity - lengths[i])
    return [sorted(b) for b in bins]


def _micro_batch(
    samples: Sequence[Sample],
    members: list[int],
    advantages: Sequence[float],
    slot_of: dict[str, int],
    denominators: list[int],
) -> MicroBatch:
    ids, pos, mask, logp, adv, weight, slots, cu = [], [], [], [], [], [], [], [0]
    n_rollouts = len(denominators)
    for i in members:
        s = samples[i]
        n = len(s.tokens)
        slot = slot_of[s.rollout_id]
        m = torch.tensor(s.loss_mask, dtype=torch.float32)  # [n]
        ids.append(torch.tensor(s.tokens, dtype=torch.long))  # [n]
        pos.append(torch.arange(n, dtype=torch.long))  # [n]
        mask.append(m)
        logp.append(torch.tensor(s.rollout_logprobs, dtype=torch.float32))  # [n]
        adv.append(torch.full((n,), float(advantages[i]), dtype=torch.float32))  # [n]
        weight.append(m / (denominators[slot] * n_rollouts))  # [n]
        slots.append(torch.full((n,), slot, dtype=torch.long))  # [n]
        cu.append(cu[-1] + n)
    nucleus = _nucleus_tensors([samples[i] for i in members])
    routes = micro_batch_routes([samples[i] for i in members])
    return MicroBatch(
        input_ids=torch.cat(ids),  # [T]
        position_ids=torch.cat(pos),  # [T]
        cu_seqlens=torch.tensor(cu, dtype=torch.int32),  # [S+1]
        loss_mask=torch.cat(mask),  # [T]
        rollout_logprobs=torch.cat(logp),  # [T]
        advantages=torch.cat(adv),  # [T]
        token_weights=torch.cat(weight),  # [T]
        rollout_slots=torch.cat(slots),  # [T]
        sample_indices=list(members),
        nucleus_ids=nucleus[0] if nucleus else None,  # [T, K]
        nucleus_probs=nucleus[1] if nucleus else None,  # [T, K]
        nucleus_valid=nucleus[2] if nucleus else None,  # [T, K]
        routed_experts=routes[0] if routes else None,  # [T, L, K]
        routes_valid=routes[1] if routes else None,  # [T]
    )


def _nucleus_tensors(members: Sequence[Sample]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The members' captured nuclei padded to ``[T, K]`` (ids, probabilities, valid), or None when no member
    has one. A member without a capture contributes padding rows (its tokens fall back to the trainer's own
    truncation; a loss that needs the nucleus refuses their trained tokens)."""
    if all(s.nucleus_ids is None for s in members):
        return None
    spans: list[list[int]] = []
    probs: list[list[float]] = []
    for s in members:
        if s.nucleus_ids is None or s.nucleus_probs is None:
            spans.extend([] for _ in s.tokens)
            probs.extend([] for _ in s.tokens)
        else:
            spans.extend(s.nucleus_ids)
            probs.extend(s.nucleus_probs)
    k = max(1, max(len(ids) for ids in spans))
    t = len(spans)
    ids_t = torch.zeros(t, k, dtype=torch.long)  # [T, K] padding points at id 0, masked by valid
    probs_t = torch.zeros(t, k, dtype=torch.float32)  # [T, K]
    valid = torch.zeros(t, k, dtype=torch.bool)  # [T, K]
    for row, (ids, p) in enumerate(zip(spans, probs, strict=True)):
        if ids:
            ids_t[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)  # [n_k]
            probs_t[row, : len(p)] = torch.tensor(p, dtype=torch.float32)  # [n_k]
            valid[row, : len(ids)] = True
    return ids_t, probs_t, valid


def plan_steps(
    samples: Sequence[Sample],
    advantages: Sequence[float],
    *,
    num_steps: int = 1,
    max_tokens_per_micro_batch: int,
) -> list[OptimizerStep]:
    """Assign whole rollouts to ``num_steps`` steps (balanced by trained tokens), then pack micro-batches.

    ``advantages[i]`` belongs to ``samples[i]`` (see ``grpo_advantages(...).per_sample``).
    """
    if len(advantages) != len(samples):
        raise ValueError(f"{len(advantages)} advantages for {len(samples)} samples")
    if num_steps < 1:
        raise ConfigError(f"num_steps must be at least 1, got {num_steps}", parameter="num_steps", value=num_steps)
    if max_tokens_per_micro_batch < 1:
        raise ConfigError(
            f"max_tokens_per_micro_batch must be positive, got {max_tokens_per_micro_batch}",
            parameter="max_tokens_per_micro_batch", value=max_tokens_per_micro_batch,
        )
    by_rollout: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(samples):
        by_rollout[s.rollout_id].append(i)
        if len(s.tokens) > max_tokens_per_micro_batch:
            raise ConfigError(
                f"segment {s.segment} of rollout {s.rollout_id!r} has {len(s.tokens)} tokens, more than "
                f"max_tokens_per_micro_batch={max_tokens_per_micro_batch}; raise it to at least {len(s.tokens)}",
                parameter="max_tokens_per_micro_batch", value=max_tokens_per_micro_batch,
            )
    if num_steps > len(by_rollout):
        raise ConfigError(
            f"num_steps={num_steps} but only {len(by_rollout)} rollouts: a rollout cannot be split across steps",
            parameter="num_steps", value=num_steps,
        )
    trained = {r: sum(samples[i].num_trained_tokens for i in idx) for r, idx in by_rollout.items()}
    for r, n in trained.items():
        if n == 0:
            raise TrajectoryError(f"rollout {r!r} has no trained tokens; its loss denominator would be 0")
    # Longest-processing-time assignment: keeps steps' token loads close, deterministic by rollout id.
    steps: list[list[str]] = [[] for _ in range(num_steps)]
    load = [0] * num_steps
    for r in sorted(by_rollout, key=lambda k: (-trained[k], k)):
        target = min(range(num_steps), key=lambda k: (load[k], k))
        steps[target].append(r)
        load[target] += trained[r]
    out: list[OptimizerStep] = []
    for rollouts in steps:
        rollouts.sort()
        slot_of = {r: k for k, r in enumerate(rollouts)}
        denominators = [trained[r] for r in rollouts]
        members = {i: len(samples[i].tokens) for r in rollouts for i in by_rollout[r]}
        step = OptimizerStep(rollout_ids=rollouts, rollout_token_counts=denominators)
        for bin_members in _pack(members, max_tokens_per_micro_batch):
            step.micro_batches.append(_micro_batch(samples, bin_members, advantages, slot_of, denominators))
        out.append(step)
    return out
