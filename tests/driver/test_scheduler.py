"""The rollout scheduler's guarantees, on a virtual clock with timed test doubles (``support.sched_sim``):
the real ``RolloutScheduler``; the rollouts and the trainer are doubles because the property is about
arbitrary duration streams (hours of stragglers), which no real engine produces on demand.

Staleness is a property over random streams (hypothesis): whatever the durations, failures, slots and
trainer step time, no batch holds a rollout older than ``max_staleness`` policies, no rollout is trained
twice or after it was cancelled, no more than ``slots`` run at once, and nothing runs after ``close()``.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.sched_sim import SimReport, simulate
from support.virtual_time import run_virtual

from lego_rl.driver.scheduler import Prompt, RolloutScheduler, RolloutSlot, SchedulerSettings
from lego_rl.rollout.generate import RolloutResult
from lego_rl.runstore.events import RolloutRefilled, RunEvent
from lego_rl.termination import TerminationReason as TR
from lego_rl.train.advantages import admission_policy


def check_invariants(r: SimReport, *, steps: int, batch_size: int, samples: int, slots: int, k: int,
                     partial: bool = False) -> None:
    batches = r.batches()
    assert [b.step for b in batches] == list(range(steps))
    seen: set[str] = set()
    cancelled = {c.rollout_id for c in r.cancellations()}
    for b in batches:
        assert len(b.prompt_ids) == batch_size and len(b.rollout_ids) == batch_size * samples
        for rid, policy in zip(b.rollout_ids, b.started_policies, strict=True):
            # Partial rollouts run on across updates: their start may be older, never in the future.
            assert 0 <= b.step - policy and (partial or b.step - policy <= k), (b.step, rid, policy)
            assert rid not in seen, f"{rid} trained twice"
            assert rid not in cancelled, f"{rid} was cancelled, then trained"
            seen.add(rid)
    assert r.double is not None
    assert r.double.max_running <= slots
    assert r.double.running == 0  # close() waited for every cancelled rollout
    assert r.double.cancelled >= cancelled - r.double.finished


durations = st.lists(st.floats(min_value=0.0, max_value=2000.0, allow_nan=False), min_size=1, max_size=40)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(durations=durations, failures=st.lists(st.booleans(), min_size=1, max_size=7),
       k=st.integers(0, 3), batch_size=st.integers(1, 3), samples=st.integers(1, 3), slots=st.integers(1, 9),
       train_s=st.floats(min_value=0.0, max_value=500.0), steps=st.integers(1, 6), partial=st.booleans())
def test_no_batch_ever_holds_a_rollout_older_than_max_staleness(
        durations: list[float], failures: list[bool], k: int, batch_size: int, samples: int, slots: int,
        train_s: float, steps: int, partial: bool) -> None:
    def script(n: int, slot: RolloutSlot) -> tuple[float, TR]:
        # An infrastructure failure is refilled; the last refill always succeeds (a slot never runs dry).
        failed = failures[n % len(failures)] and slot.attempt < 2
        return durations[n % len(durations)], (TR.SANDBOX_SETUP if failed else TR.COMPLETED)

    report = run_virtual(simulate(script=script, steps=steps, train_s=train_s, batch_size=batch_size,
                                  samples_per_prompt=samples, slots=slots, max_staleness=k, partial=partial))
    check_invariants(report, steps=steps, batch_size=batch_size, samples=samples, slots=slots, k=k, partial=partial)
    if partial:
        assert report.stale_groups == 0 and not report.cancellations()
    if k == 0:
        # Synchronous: nothing ever runs while the trainer trains, so nothing is ever stale.
        assert report.stale_groups == 0 and not report.cancellations()


def test_a_straggler_past_the_bound_is_cancelled_and_its_group_never_trained() -> None:
    # Group 0's second rollout takes 10_000 s; every other one 10 s; a step trains for 30 s.
    def script(n: int, slot: RolloutSlot) -> tuple[float, TR]:
        return (10_000.0 if (slot.group_index, slot.index) == (0, 1) else 10.0), TR.COMPLETED

    r = run_virtual(simulate(script=script, steps=4, train_s=30.0, batch_size=1, samples_per_prompt=2, slots=4,
                             max_staleness=1))
    check_invariants(r, steps=4, batch_size=1, samples=2, slots=4, k=1)
    [cancel] = r.cancellations()
    assert cancel.rollout_id == "g00000-p0-1" and cancel.reason == "stale" and cancel.started_policy == 0
    assert cancel.next_step == 2  # step 1 was the last that could train it
    assert all("p0" not in b.prompt_ids for b in r.batches())
    assert r.double is not None and "g00000-p0-1" in r.double.cancelled
    # The straggler held no step hostage: the four steps took 4 × (10 s rollouts + 30 s training) at most.
    assert r.wall_s <= 4 * 40.0 + 1e-6


def test_synchronous_mode_starts_nothing_while_the_trainer_trains() -> None:
    starts: list[tuple[float, int]] = []

    def script(n: int, slot: RolloutSlot) -> tuple[float, TR]:
        starts.append((asyncio.get_running_loop().time(), slot.group_index))
        return 5.0, TR.COMPLETED

    r = run_virtual(simulate(script=script, steps=3, train_s=100.0, batch_size=2, samples_per_prompt=2, slots=8,
                             max_staleness=0))
    # Step s's rollouts start at s × (5 + 100): all after the previous step's training ended.
    assert sorted({t for t, _ in starts}) == [0.0, 105.0, 210.0]
    assert r.steps_per_hour == pytest.approx(3 * 3600 / 315.0)


def test_asynchronous_mode_overlaps_the_next_batch_with_training() -> None:
    def script(n: int, slot: RolloutSlot) -> tuple[float, TR]:
        return 100.0, TR.COMPLETED

    sync = run_virtual(simulate(script=script, steps=6, train_s=100.0, batch_size=2, samples_per_prompt=2,
                                slots=8, max_staleness=0))
    overlapped = run_virtual(simulate(script=script, steps=6, train_s=100.0, batch_size=2, samples_per_prompt=2,
                                      slots=8, max_staleness=1))
    assert sync.wall_s == pytest.approx(1200.0)
    assert overlapped.wall_s == pytest.approx(100.0 + 6 * 100.0)  # the first batch, then one step per 100 s
    assert all(b.step - p == (0 if b.step == 0 else 1) for b in overlapped.batches() for p in b.started_policies)


def test_an_infrastructure_failure_is_refilled_first_in_its_slot() -> None:
    events: list[RunEvent] = []
    order: list[str] = []

    async def rollouts(prompt: Prompt, slot: RolloutSlot) -> RolloutResult:
        order.append(slot.rollout_id)
        await asyncio.sleep(1.0)
        reason = TR.SANDBOX_SETUP if slot.rollout_id == "g00000-p0-0" else TR.COMPLETED
        return RolloutResult(rollout_id=slot.rollout_id, instance_id=prompt.id, harness="double", termination=reason,
                             reward=None if reason != TR.COMPLETED else 1.0, samples=[], timings={}, artifacts=None,
                             group_index=slot.group_index, index=slot.index)

    async def main() -> None:
        ids = iter(range(100))
        sched = RolloutScheduler(
            SchedulerSettings(batch_size=2, samples_per_prompt=3, slots=1, max_staleness=0, max_refills=2,
                              replace_zero_variance=False, admission=admission_policy("exclude")),
            rollout_fn=rollouts, draw=lambda: Prompt(f"p{next(ids)}", None), emit=events.append, policy=0,
            next_step=0, end_step=1)
        sched.start()
        rolled = await sched.take(0)
        await sched.close()
        [g0, _] = rolled.groups
        assert [r.rollout_id for r in g0.results] == ["g00000-p0-0-refill1", "g00000-p0-1", "g00000-p0-2"]
        assert rolled.refills == 1

    run_virtual(main())
    # One slot: the refill went ahead of the group's own queued rollouts and of the next group.
    assert order == ["g00000-p0-0", "g00000-p0-0-refill1", "g00000-p0-1", "g00000-p0-2", "g00001-p1-0",
                     "g00001-p1-1", "g00001-p1-2"]
    [refill] = [e for e in events if isinstance(e, RolloutRefilled)]
    assert refill.failed_rollout_id == "g00000-p0-0" and refill.termination == TR.SANDBOX_SETUP


def test_a_rollout_function_that_raises_stops_the_batch_with_its_error() -> None:
    async def broken(prompt: Prompt, slot: RolloutSlot) -> RolloutResult:
        raise RuntimeError("bug in the rollout function")

    async def main() -> None:
        sched = RolloutScheduler(
            SchedulerSettings(batch_size=1, samples_per_prompt=2, slots=2, max_staleness=1, max_refills=0,
                              replace_zero_variance=False, admission=admission_policy("exclude")),
            rollout_fn=broken, draw=lambda: Prompt("p", None), emit=lambda e: None, policy=0, next_step=0,
            end_step=2)
        sched.start()
        try:
            with pytest.raises(Exception, match="rollout raised.*RuntimeError: bug in the rollout function"):
                await sched.take(0)
        finally:
            await sched.close()

    run_virtual(main())


def test_partial_rollouts_let_a_straggler_run_on_across_updates_and_train_its_group() -> None:
    # As in the cancellation test, but the straggler runs across weight updates instead of being cancelled.
    def script(n: int, slot: RolloutSlot) -> tuple[float, TR]:
        return (1_000.0 if (slot.group_index, slot.index) == (0, 1) else 10.0), TR.COMPLETED

    r = run_virtual(simulate(script=script, steps=30, train_s=30.0, batch_size=1, samples_per_prompt=2, slots=4,
                             max_staleness=1, partial=True))
    assert not r.cancellations() and r.stale_groups == 0
    [late] = [b for b in r.batches() if "p0" in b.prompt_ids]
    # Trained long after the policy it started on (0): the loop judges its tokens one by one.
    assert late.step > 1 and min(late.started_policies) == 0
    # The other groups did not wait for it.
    assert [b.step for b in r.batches()] == list(range(30)) and r.wall_s < 30 * 40.0
    assert r.double is not None and r.double.running == 0
