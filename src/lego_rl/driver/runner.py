"""Driving many rollouts: specs in, results out, at most N in flight.

``RolloutRunner`` knows nothing of rollout-check, of the config or of the serving stack: it gets a
``RolloutContext`` (settings, run directory, adapter sessions) and calls ``generate()`` per spec. A
scheduler for training reuses it per step; a Ray actor wraps it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Literal

from lego_rl.rollout.generate import RolloutContext, RolloutResult, RolloutSpec, generate
from lego_rl.tasks.model import TaskRow

ProgressFn = Callable[[Literal["started", "finished"], RolloutSpec, RolloutResult | None], None]
"""Called with ``("started", spec, None)`` and ``("finished", spec, result)``."""


def plan(rows: Sequence[TaskRow], samples_per_task: int, harness: str | None = None) -> list[RolloutSpec]:
    """One spec per (task, sample); group_index is the task's position, index the sample number.

    ``harness`` overrides every row's ``metadata.agent``.
    """
    if samples_per_task < 1:
        raise ValueError(f"samples_per_task must be at least 1, got {samples_per_task}")
    specs = []
    for g, row in enumerate(rows):
        if harness:
            row = row.model_copy(update={"metadata": row.metadata.model_copy(update={"agent": harness})})
        for i in range(samples_per_task):
            specs.append(
                RolloutSpec(row=row, rollout_id=f"{row.metadata.instance_id}-s{i}", group_index=g, index=i)
            )
    return specs


class RolloutRunner:
    """Run specs through ``generate()`` with at most ``concurrency`` rollouts in flight."""

    def __init__(self, ctx: RolloutContext, *, concurrency: int = 4) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.ctx = ctx
        self.concurrency = concurrency

    async def run(
        self, specs: Sequence[RolloutSpec], progress: ProgressFn | None = None
    ) -> list[RolloutResult]:
        """Every spec's result, ordered by (group_index, index). generate() never raises for a failed
        rollout, so one bad task cannot cancel the others. Cancelling ``run`` cancels every rollout and
        waits for their cleanup (no task outlives it); each rollout in flight saves its outcome
        (``interrupted``) and is reported to ``progress`` as finished before the cancellation goes on."""
        dupes = sorted(i for i, n in Counter(spec.rollout_id for spec in specs).items() if n > 1)
        if dupes:
            raise ValueError(f"rollout ids must be unique (each names an artifact folder); repeated: {dupes}")
        gate = asyncio.Semaphore(self.concurrency)
        results: list[RolloutResult] = []

        def finished(spec: RolloutSpec, result: RolloutResult) -> None:
            results.append(result)
            if progress:
                progress("finished", spec, result)

        async def one(spec: RolloutSpec) -> None:
            async with gate:
                if progress:
                    progress("started", spec, None)
                await generate(self.ctx, spec, on_result=lambda result: finished(spec, result))

        # A TaskGroup, not gather: should anything raise, the other rollouts are cancelled and awaited
        # (they clean up their sandboxes) instead of running on unowned until the loop shuts down.
        async with asyncio.TaskGroup() as group:
            for spec in specs:
                group.create_task(one(spec))
        return sorted(results, key=lambda res: (res.group_index, res.index))
