"""The real ``RolloutScheduler`` driven by timed test doubles, on a virtual clock (``virtual_time``).

Used by the staleness property test and ``benchmarks/async_scheduler_bench.py``. What is real: the scheduler
(slots, launch bound, refills, expiry and cancellation, batch choice). What is a double: the rollouts
(``TimedRolloutsDouble``: sleep for a scripted duration, then return a result with a scripted termination) and the
trainer (``simulate``'s loop sleeps a fixed step time, then tells the scheduler the new policy, exactly the
three calls ``TrainLoop.run`` makes: ``take``, train + sync, ``set_policy``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from lego_rl.driver.scheduler import Prompt, RolloutScheduler, RolloutSlot, SchedulerSettings
from lego_rl.rollout.generate import RolloutResult
from lego_rl.runstore.events import BatchTaken, RolloutCancelled, RunEvent
from lego_rl.termination import TerminationReason as TR
from lego_rl.train.advantages import admission_policy
from lego_rl.trajectory.sample import Sample

Script = Callable[[int, RolloutSlot], tuple[float, TR]]
"""(n-th rollout started, its slot) -> (duration in seconds, termination)."""


class TimedRolloutsDouble:
    """TEST DOUBLE for the engine + sandbox side of a rollout: waits ``duration`` seconds of the loop's clock,
    then returns a one-sample result (reward alternating by index, so every group carries signal). Tracks how
    many run at once and which were cancelled (a cancellation arrives while it waits, as in ``generate()``)."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.started = 0
        self.running = 0
        self.max_running = 0
        self.cancelled: set[str] = set()
        self.finished: set[str] = set()

    async def __call__(self, prompt: Prompt, slot: RolloutSlot) -> RolloutResult:
        duration, reason = self.script(self.started, slot)
        self.started += 1
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            await asyncio.sleep(duration)
        except asyncio.CancelledError:
            self.cancelled.add(slot.rollout_id)
            raise
        finally:
            self.running -= 1
        self.finished.add(slot.rollout_id)
        reward = float(slot.index % 2)
        sample = Sample(rollout_id=slot.rollout_id, group_index=slot.group_index, index=slot.index,
                        tokens=[1, 2, 3], loss_mask=[0, 1, 1], rollout_logprobs=[0.0, -1.0, -1.0], reward=reward,
                        termination=reason)
        return RolloutResult(rollout_id=slot.rollout_id, instance_id=prompt.id, harness="timed-double",
                             termination=reason, reward=reward, samples=[sample], timings={"rollout": duration},
                             artifacts=None, group_index=slot.group_index, index=slot.index)


@dataclass
class SimReport:
    steps: int
    wall_s: float
    trainer_wait_s: float
    busy_s: float
    wasted_s: float
    capacity_s: float
    stale_groups: int
    events: list[RunEvent] = field(default_factory=list)
    double: TimedRolloutsDouble | None = None

    @property
    def steps_per_hour(self) -> float:
        return self.steps * 3600.0 / self.wall_s

    @property
    def idle_slot_fraction(self) -> float:
        return 1.0 - self.busy_s / self.capacity_s

    @property
    def trainer_idle_fraction(self) -> float:
        return self.trainer_wait_s / self.wall_s

    def batches(self) -> list[BatchTaken]:
        return [e for e in self.events if isinstance(e, BatchTaken)]

    def cancellations(self) -> list[RolloutCancelled]:
        return [e for e in self.events if isinstance(e, RolloutCancelled)]


async def simulate(*, script: Script, steps: int, train_s: float, batch_size: int, samples_per_prompt: int,
                   slots: int, max_staleness: int, max_refills: int = 2, partial: bool = False) -> SimReport:
    """``steps`` training steps of ``train_s`` each against ``TimedRolloutsDouble(script)``."""
    loop = asyncio.get_running_loop()
    events: list[RunEvent] = []
    counter = iter(range(10**9))
    rollouts = TimedRolloutsDouble(script)
    sched = RolloutScheduler(
        SchedulerSettings(batch_size=batch_size, samples_per_prompt=samples_per_prompt, slots=slots,
                          max_staleness=max_staleness, max_refills=max_refills, replace_zero_variance=False,
                          admission=admission_policy("exclude"), partial=partial),
        rollout_fn=rollouts, draw=lambda: Prompt(f"p{next(counter)}", None), emit=events.append,
        policy=0, next_step=0, end_step=steps)
    t0 = loop.time()
    wait = 0.0
    stale = 0
    sched.start()
    try:
        for step in range(steps):
            rolled = await sched.take(step)
            wait += rolled.wait_s
            stale += rolled.stale_groups
            await asyncio.sleep(train_s)  # the trainer double: a fixed step time (train + sync)
            sched.set_policy(step + 1)
    finally:
        usage = sched.usage()
        await sched.close()
    return SimReport(steps=steps, wall_s=loop.time() - t0, trainer_wait_s=wait, busy_s=usage.busy_s,
                     wasted_s=usage.wasted_s, capacity_s=usage.capacity_s, stale_groups=stale, events=events,
                     double=rollouts)
