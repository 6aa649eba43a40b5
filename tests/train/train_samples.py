"""Helpers for train tests: small segmented rollouts."""

from __future__ import annotations

from lego_rl.termination import TerminationReason
from lego_rl.trajectory.sample import Sample


def rollout(
    rid: str,
    group: int,
    reward: float | None,
    segments: int = 1,
    *,
    trained: int = 2,
    context: int = 3,
    termination: TerminationReason | None = TerminationReason.COMPLETED,
    index: int = 0,
) -> list[Sample]:
    """``segments`` samples of one run, each with ``context`` masked and ``trained`` unmasked tokens."""
    n = context + trained
    return [
        Sample(
            rollout_id=rid, group_index=group, index=index, segment=k, num_segments=segments,
            tokens=list(range(k, k + n)), loss_mask=[0] * context + [1] * trained,
            rollout_logprobs=[0.0] * context + [-0.5] * trained, reward=reward, termination=termination,
        )
        for k in range(segments)
    ]
