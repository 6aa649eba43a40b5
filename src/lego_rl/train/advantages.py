"""Admission and GRPO advantages over segmented rollouts (pure numpy/torch, no model).

Stages, in order:

1. ``admit``: rollouts whose termination reason is in the policy's excluded set (by default every
   infrastructure failure) leave the statistics *and* the loss, and are counted per reason. Policy
   outcomes (turn/context/time limits, agent error exit) keep their verifier reward.
2. ``grpo_advantages``: within each prompt group (``group_index``), mean and std are taken over
   *distinct rollout ids*: a run with 20 segments counts once, like a run with one. The run's advantage
   is broadcast to all of its segments. Groups whose rewards are all equal (including singleton groups)
   get zero advantages and are counted (all-solved, all-failed, other).

GSPO compatibility: the advantage is one scalar per rollout (sequence level), and
``rollout_mean_log_ratio`` gives GSPO's length-normalised sequence log-ratio of a rollout over all its
trained tokens, across segments and micro-batches, so the sequence unit is the rollout, not the segment.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, Field, model_validator

from lego_rl.errors import TrajectoryError
from lego_rl.termination import INFRASTRUCTURE_FAILURES, TerminationReason
from lego_rl.trajectory.sample import Sample


class AdmissionPolicy(BaseModel):
    """Which rollouts enter training. The operator can widen or narrow the excluded set."""

    excluded: frozenset[TerminationReason] = INFRASTRUCTURE_FAILURES
    """Termination reasons whose rollouts are left out of advantages and loss (default: all
    infrastructure failures; policy outcomes are never excluded by default)."""
    zero_reward: frozenset[TerminationReason] = frozenset()
    """Termination reasons whose rollouts are admitted with reward 0, whatever reward they carry
    (``train.infra_failure_policy = "zero_reward"``: infrastructure failures count as failed attempts)."""

    @model_validator(mode="after")
    def _one_treatment_per_reason(self) -> AdmissionPolicy:
        both = self.excluded & self.zero_reward
        if both:
            raise ValueError(f"reasons both excluded and zero-rewarded: {sorted(r.value for r in both)}")
        return self


def admission_policy(infra_failure_policy: Literal["exclude", "zero_reward"]) -> AdmissionPolicy:
    """``train.infra_failure_policy`` as an ``AdmissionPolicy``: infrastructure failures are either
    excluded from statistics and loss, or kept as failed attempts with reward 0."""
    if infra_failure_policy == "exclude":
        return AdmissionPolicy(excluded=INFRASTRUCTURE_FAILURES)
    if infra_failure_policy == "zero_reward":
        return AdmissionPolicy(excluded=frozenset(), zero_reward=INFRASTRUCTURE_FAILURES)
    raise ValueError(f"unknown infra_failure_policy {infra_failure_policy!r}; expected exclude or zero_reward")


class AdmissionReport(BaseModel):
    """Counts of one admission pass (reported per training step)."""

    admitted_rollouts: int = 0
    admitted_samples: int = 0
    excluded_rollouts: dict[str, int] = Field(default_factory=dict)
    """Excluded rollouts per termination reason."""
    excluded_samples: int = 0
    excluded_reasons: list[str] = Field(default_factory=list)
    """The policy in force (sorted reason names), so a report says what was excluded and why."""
    zero_rewarded_rollouts: dict[str, int] = Field(default_factory=dict)
    """Rollouts admitted with reward 0 by ``AdmissionPolicy.zero_reward``, per termination reason."""


def _by_rollout(samples: Sequence[Sample]) -> dict[str, list[int]]:
    """Sample indices per rollout id, checking that a rollout's segments agree on its outcome."""
    rollouts: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(samples):
        rollouts[s.rollout_id].append(i)
    for rid, idx in rollouts.items():
        first = samples[idx[0]]
        for j in idx[1:]:
            other = samples[j]
            for field in ("group_index", "index", "reward", "termination"):
                if getattr(other, field) != getattr(first, field):
                    raise TrajectoryError(
                        f"rollout {rid!r}: segments disagree on {field} "
                        f"({getattr(first, field)!r} vs {getattr(other, field)!r})"
                    )
    return rollouts


def admit(
    samples: Sequence[Sample], policy: AdmissionPolicy | None = None
) -> tuple[list[Sample], AdmissionReport]:
    """Keep the samples of admitted rollouts (order preserved); count what was excluded."""
    policy = policy or AdmissionPolicy()
    report = AdmissionReport(excluded_reasons=sorted(r.value for r in policy.excluded))
    excluded: set[str] = set()
    zeroed: set[str] = set()
    for rid, idx in _by_rollout(samples).items():
        head = samples[idx[0]]
        if head.termination is None:
            raise TrajectoryError(f"rollout {rid!r} has no termination reason; every rollout needs one")
        reason = head.termination.value
        if head.termination in policy.excluded:
            report.excluded_rollouts[reason] = report.excluded_rollouts.get(reason, 0) + 1
            report.excluded_samples += len(idx)
            excluded.add(rid)
            continue
        if head.termination in policy.zero_reward:
            report.zero_rewarded_rollouts[reason] = report.zero_rewarded_rollouts.get(reason, 0) + 1
            zeroed.add(rid)
        elif head.reward is None:
            raise TrajectoryError(f"rollout {rid!r} ({reason}) is admitted but has no reward")
        report.admitted_rollouts += 1
        report.admitted_samples += len(idx)
    return [
        s.model_copy(update={"reward": 0.0}) if s.rollout_id in zeroed else s
        for s in samples
        if s.rollout_id not in excluded
    ], report


class GroupStats(BaseModel):
    """Group-level counts of one advantage computation."""

    groups: int = 0
    rollouts: int = 0
    samples: int = 0
    uniform_groups: int = 0
    all_solved_groups: int = 0
    all_failed_groups: int = 0
    uniform_other_groups: int = 0
    singleton_groups: int = 0


@dataclass(frozen=True)
class Advantages:
    """``per_sample[i]`` belongs to ``samples[i]`` (shape ``[num_samples]``); ``per_rollout`` by id."""

    per_sample: np.ndarray
    per_rollout: dict[str, float]
    stats: GroupStats


class SamplelessOutcome(BaseModel):
    """An admitted rollout that produced no trainable segment (e.g. the CLI stopped before its first
    answer): it trains nothing, but its reward still belongs in its group's mean and std."""

    rollout_id: str
    group_index: int
    reward: float


def grpo_advantages(
    samples: Sequence[Sample],
    *,
    sampleless: Sequence[SamplelessOutcome] = (),
    scale_by_std: bool = True,
    eps: float = 1e-6,
    solved_reward: float = 1.0,
) -> Advantages:
    """GRPO advantages: per group over distinct rollouts, broadcast to every segment.

    ``A_r = (R_r - mean_g) / (std_g + eps)`` with the population std over the group's distinct rollouts
    (``scale_by_std=False`` gives ``R_r - mean_g``). A uniform group counts as all-solved when its
    common reward is at least ``solved_reward``, all-failed when it is at most 0. ``sampleless``
    rollouts count in their group's statistics only.
    """
    rollouts = _by_rollout(samples)
    reward_of: dict[str, float] = {}
    groups: dict[int, list[str]] = defaultdict(list)
    for rid, idx in rollouts.items():
        head = samples[idx[0]]
        if head.reward is None or not np.isfinite(head.reward):
            raise TrajectoryError(f"rollout {rid!r} has reward {head.reward!r}; admit() rollouts first")
        groups[head.group_index].append(rid)
        reward_of[rid] = head.reward
    for out in sampleless:
        if out.rollout_id in reward_of:
            raise TrajectoryError(f"rollout {out.rollout_id!r} is given both as samples and as sampleless")
        if not np.isfinite(out.reward):
            raise TrajectoryError(f"rollout {out.rollout_id!r} has reward {out.reward!r}")
        groups[out.group_index].append(out.rollout_id)
        reward_of[out.rollout_id] = out.reward
    stats = GroupStats(groups=len(groups), rollouts=len(reward_of), samples=len(samples))
    per_rollout: dict[str, float] = {}
    for _, rids in sorted(groups.items()):
        rewards = np.array([reward_of[r] for r in rids], dtype=np.float64)
        if len(rids) == 1:
            stats.singleton_groups += 1
        if np.ptp(rewards) == 0.0:
            stats.uniform_groups += 1
            common = float(rewards[0])
            if common >= solved_reward:
                stats.all_solved_groups += 1
            elif common <= 0.0:
                stats.all_failed_groups += 1
            else:
                stats.uniform_other_groups += 1
            adv = np.zeros_like(rewards)
        else:
            adv = rewards - rewards.mean()
            if scale_by_std:
                adv = adv / (rewards.std() + eps)
        per_rollout.update(zip(rids, adv.tolist(), strict=True))
    per_sample = np.array([per_rollout[s.rollout_id] for s in samples], dtype=np.float64)
    return Advantages(per_sample=per_sample, per_rollout=per_rollout, stats=stats)


def rollout_mean_log_ratio(
    log_ratios: Sequence[torch.Tensor],
    loss_masks: Sequence[torch.Tensor],
    rollout_ids: Sequence[str],
) -> dict[str, torch.Tensor]:
    """GSPO's sequence log-ratio per rollout: mean of ``log pi/pi_old`` over *all* its trained tokens.

    ``log_ratios[i]`` and ``loss_masks[i]`` are ``[T_i]`` tensors of segment ``i`` (any micro-batch);
    segments of one rollout are pooled, so a rollout split into segments gets the same value as if it
    were one sequence. Gradients flow; detach the result for the GSPO-token form
    (``sg[s_r] * pi_t / sg[pi_t]``), which lets micro-batches be processed one at a time.
    """
    if not (len(log_ratios) == len(loss_masks) == len(rollout_ids)):
        raise ValueError(
            f"got {len(log_ratios)} log-ratio tensors, {len(loss_masks)} masks, {len(rollout_ids)} rollout ids"
        )
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, torch.Tensor] = {}
    for lr, m, rid in zip(log_ratios, loss_masks, rollout_ids, strict=True):
        if lr.shape != m.shape:
            raise ValueError(f"rollout {rid!r}: log-ratio shape {tuple(lr.shape)} != mask {tuple(m.shape)}")
        m = m.to(lr.dtype)
        sums[rid] = sums.get(rid, 0) + (lr * m).sum()  # type: ignore[assignment]
        counts[rid] = counts.get(rid, 0) + m.sum()  # type: ignore[assignment]
    out: dict[str, torch.Tensor] = {}
    for rid, total in sums.items():
        if float(counts[rid]) == 0.0:
            raise TrajectoryError(f"rollout {rid!r} has no trained tokens; its sequence ratio is undefined")
        out[rid] = total / counts[rid]
    return out
