"""The rollout scheduler: rollout slots kept busy across training steps, with bounded staleness.

Vocabulary. The *policy* ``P`` counts the steps whose update the engines serve: the loaded checkpoint is
the policy of the first step, and once step ``s`` is trained and synced the engines serve policy ``s + 1``
(a step that trained nothing moves it too: the bound is then conservative, never loose). A rollout
*starts on* the policy the engines serve when it gets its slot. Step ``s`` may train a rollout that started
on ``p`` only if ``s - p <= max_staleness`` (``K``); a group is as old as its oldest kept rollout.

* **Groups.** A prompt × ``samples_per_prompt`` sample slots, launched in prompt-stream order. A slot
  whose rollout ends for a reason admission excludes (an infrastructure failure) is *refilled* with a new
  rollout of the same prompt and index, up to ``max_refills`` times, ahead of any new group: one outage
  never shrinks or drops the group. A group is *complete* when every slot has a result it keeps.
* **Launch bound: nothing starts that could not be trained.** A new group starts only while
  ``live < (min(P + K, end - 1) - n + 1) × batch_size``: ``n`` is the next step the trainer takes a batch
  for, ``live`` the groups launched and neither trained nor dropped. With ``K = 0`` nothing starts while a
  step trains (the synchronous loop, same code); with ``K = 1`` the next step's groups run meanwhile.
* **Slots.** At most ``slots`` rollouts run at once. A cancelled rollout keeps its slot until its cleanup
  is over (its sandbox still exists until then).
* **Batches.** ``take(step)`` waits until ``batch_size`` complete groups that ``step`` may train are ready
  and takes them, oldest policy first (they expire first), then completion order: a straggler delays no
  step while other groups are complete (termination-aware admission).
* **Expiry.** When ``n`` moves past what a group can reach (``p + K < n``), the group is dropped: its
  running rollouts are cancelled (``generate()`` destroys the sandbox and closes the session; a
  ``rollout_cancelled`` event each) and its finished ones are never trained. Its prompt is not redrawn:
  ``stale_groups`` in the step's metrics says how often that happened (a bias against long tasks when it
  is frequent: raise ``K`` or the slot count).
* **Partial rollouts** (``partial``): no group is cancelled or dropped for its age; a rollout in flight across
  weight updates runs on (its later turns sample from the new weights) and the loop decides per token what
  its tokens older than the bound are worth (``rollout.partial_rollouts``: keep or drop). Batches still take
  the oldest groups first, and the launch bound still holds.
* **Zero variance** (``replace_zero_variance``): a complete group whose kept rewards are all equal is
  dropped (``group_replaced``) while the current step's budget of ``batch_size`` lasts; the launch bound
  then lets a fresh prompt start in its place.

The scheduler runs on the event loop it is created on and is driven by the trainer: ``take(step)``,
then ``set_policy(step + 1)`` after the sync, ``close()`` at the end. Time is read from the event loop's
clock, so a test may run it on a virtual clock.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from lego_rl.errors import LegoError
from lego_rl.rollout.generate import RolloutResult
from lego_rl.runstore.events import BatchTaken, GroupReplaced, RolloutCancelled, RolloutRefilled, RunEvent
from lego_rl.train.advantages import AdmissionPolicy


class SchedulerError(LegoError):
    """The scheduler cannot produce a batch (a rollout function that raised, or nothing left that could run)."""


@dataclass(frozen=True)
class Prompt:
    """A dataset row as the loop sees it: a stable id and the row object the ``RolloutFn`` understands."""

    id: str
    row: Any


@dataclass(frozen=True)
class RolloutSlot:
    """Where a rollout belongs: its unique id, its group (prompt) and index within the group."""

    rollout_id: str
    group_index: int
    index: int
    attempt: int = 0
    """0 for the first try of the slot; n for its n-th refill."""


RolloutFn = Callable[[Prompt, RolloutSlot], Awaitable[RolloutResult]]
"""One rollout: never raises for a failed rollout (the result's termination says what happened); a
cancellation cleans up (sandbox, session) before it propagates."""


@dataclass
class Group:
    prompt: Prompt
    group_index: int
    results: list[RolloutResult] = field(default_factory=list)
    """The kept result of each sample slot (after refills), by index."""
    policies: dict[str, int] = field(default_factory=dict)
    """Rollout id -> the policy it started on, for every rollout in ``results``."""

    @property
    def oldest_policy(self) -> int | None:
        return min(self.policies.values(), default=None)


@dataclass
class StepRollouts:
    """What one step's rollout phase produced."""

    groups: list[Group]
    """The groups trained on."""
    dropped: list[Group] = field(default_factory=list)
    """Zero-variance groups replaced by fresh prompts: reported in the step's rewards, never trained on."""
    refills: int = 0
    replaced_groups: int = 0
    zero_variance_groups: int = 0
    """Uniform-reward groups seen in this step (replaced or kept)."""
    stale_groups: int = 0
    """Groups dropped since the previous batch because no step within the staleness bound could train them."""
    cancelled_rollouts: int = 0
    """Rollouts cancelled since the previous batch (stale groups, not a stop)."""
    wait_s: float = 0.0
    """How long the trainer waited for this batch."""
    slot_busy_s: float = 0.0
    """Slot-seconds held by rollouts since the previous batch (cleanup of cancelled ones included)."""
    slot_wasted_s: float = 0.0
    """Of which by rollouts that will never be trained (cancelled, stale, replaced)."""
    slot_capacity_s: float = 0.0
    """Slots × seconds since the previous batch."""


def uniform_reward(results: Sequence[RolloutResult], admission: AdmissionPolicy) -> float | None:
    """The common reward of a group whose admitted rollouts all scored the same (None otherwise)."""
    admitted = [r for r in results if r.termination not in admission.excluded]
    rewards = {0.0 if r.termination in admission.zero_reward else r.reward for r in admitted}
    if len(admitted) < 2 or len(rewards) != 1 or None in rewards:
        return None
    return next(iter(rewards))  # type: ignore[return-value]


@dataclass(frozen=True)
class SchedulerSettings:
    batch_size: int
    """Groups per step."""
    samples_per_prompt: int
    slots: int
    """Rollouts in flight at most (``rollout.concurrency``)."""
    max_staleness: int
    max_refills: int
    replace_zero_variance: bool
    admission: AdmissionPolicy
    partial: bool = False
    """Partial rollouts (``rollout.partial_rollouts`` keep/drop): no group is cancelled or dropped for its age;
    the loop decides per token what its older tokens are worth. The launch bound still holds."""


@dataclass(frozen=True)
class SlotUsage:
    """Slot-seconds since the scheduler started: busy (a rollout held the slot, cleanup included) and of those
    wasted (rollouts cancelled or thrown away as stale), over ``slots × elapsed``."""

    busy_s: float
    wasted_s: float
    capacity_s: float

    @property
    def idle_fraction(self) -> float:
        return 1.0 - self.busy_s / self.capacity_s if self.capacity_s > 0 else 0.0


@dataclass
class _Run:
    rollout_id: str
    task: asyncio.Task[RolloutResult]
    group: _Live
    index: int
    policy: int
    started: float
    cancel_reason: Literal["stale", "stopped"] | None = None


@dataclass
class _Live:
    """A launched group, not yet trained or dropped."""

    seq: int
    prompt: Prompt
    base_id: str
    final: dict[int, RolloutResult] = field(default_factory=dict)
    attempts: dict[int, int] = field(default_factory=dict)
    policy_of: dict[str, int] = field(default_factory=dict)
    """Every started rollout's policy."""
    running: set[str] = field(default_factory=set)
    slot_policy: dict[int, int] = field(default_factory=dict)
    """Per sample slot, the policy its current (running or kept) rollout started on."""
    busy_s: float = 0.0
    """Slot-seconds of its finished rollouts (counted as wasted if the group is never trained)."""
    done_at: int | None = None
    """Completion order (None while a slot is still open)."""

    def oldest(self) -> float:
        return min(self.slot_policy.values(), default=math.inf)


class RolloutScheduler:
    """See the module docstring."""

    def __init__(self, settings: SchedulerSettings, *, rollout_fn: RolloutFn, draw: Callable[[], Prompt],
                 emit: Callable[[RunEvent], object], policy: int, next_step: int, end_step: int, id_prefix: str = "",
                 redo: Sequence[Prompt] = ()) -> None:
        s = settings
        if s.batch_size < 1 or s.samples_per_prompt < 1 or s.slots < 1 or s.max_staleness < 0:
            raise ValueError(f"scheduler settings out of range: {s}")
        self.s = settings
        self.rollout_fn = rollout_fn
        self.draw = draw
        self.emit = emit
        self.policy = policy
        self.next_step = next_step
        self.end_step = end_step
        self.id_prefix = id_prefix
        self._redo: deque[Prompt] = deque(redo)
        """Prompts of groups a stopped run never trained: launched again first (resume)."""
        self._live: dict[int, _Live] = {}
        self._queue: deque[tuple[_Live, int]] = deque()
        self._runs: dict[str, _Run] = {}
        self._seq = 0
        self._done_seq = 0
        self._changed = asyncio.Event()
        self._error: BaseException | None = None
        self._closed = False
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time()
        self._busy_s = 0.0
        self._wasted_s = 0.0
        # Counters since the previous batch (reported with the next one).
        self._dropped: list[Group] = []
        self._refills = 0
        self._stale_groups = 0
        self._cancelled = 0
        self._replace_budget = s.batch_size if s.replace_zero_variance else 0
        self._usage_mark = SlotUsage(0.0, 0.0, 0.0)

    # -- state the trainer reads --------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return len(self._runs)

    def finished_rollouts(self) -> int:
        """Rollouts finished (and kept) in groups not taken yet: what the next ``take`` can already count on."""
        return sum(len(g.final) for g in self._live.values())

    def pending_prompts(self) -> list[Prompt]:
        """Prompts drawn but not trained (live groups in launch order, then those not relaunched yet): what a
        checkpoint must hand to the next run so no prompt is skipped."""
        return [g.prompt for g in sorted(self._live.values(), key=lambda g: g.seq)] + list(self._redo)

    def usage(self) -> SlotUsage:
        now = self._loop.time()
        running = sum(now - r.started for r in self._runs.values())
        return SlotUsage(busy_s=self._busy_s + running, wasted_s=self._wasted_s,
                         capacity_s=self.s.slots * (now - self._t0))

    # -- the trainer's side -------------------------------------------------------------------------

    def start(self) -> None:
        self._pump()

    def set_policy(self, policy: int) -> None:
        """The engines now serve ``policy`` (after step ``policy - 1`` synced): more groups may start."""
        if policy < self.policy:
            raise ValueError(f"policy went back from {self.policy} to {policy}")
        self.policy = policy
        self._pump()

    async def take(self, step: int) -> StepRollouts:
        """``batch_size`` complete groups that ``step`` may train (waits for them)."""
        if step != self.next_step:
            raise ValueError(f"asked for step {step}'s batch but the next step is {self.next_step}")
        if step >= self.end_step:
            raise ValueError(f"step {step} is past the scheduler's last step {self.end_step - 1}")
        self._expire()
        self._pump()
        t0 = self._loop.time()
        while True:
            if self._error is not None:
                raise SchedulerError(f"a rollout raised instead of returning a result: "
                                     f"{type(self._error).__name__}: {self._error}") from self._error
            floor = step - self.s.max_staleness
            ready = sorted((g for g in self._live.values()
                            if g.done_at is not None and (self.s.partial or g.oldest() >= floor)),
                           key=lambda g: (g.oldest(), g.done_at))
            if len(ready) >= self.s.batch_size:
                break
            if not self._runs and not self._queue and not self._can_launch():
                raise SchedulerError(f"step {step} needs {self.s.batch_size} complete groups, {len(ready)} are "
                                     "ready and nothing runs or may start (a scheduler bug)")
            self._changed.clear()
            await self._changed.wait()
        wait_s = self._loop.time() - t0
        chosen = ready[: self.s.batch_size]
        groups = []
        for g in chosen:
            del self._live[g.seq]
            groups.append(self._as_group(g))
        zero_variance = len(self._dropped) + sum(
            1 for g in groups if uniform_reward(g.results, self.s.admission) is not None)
        usage, mark = self.usage(), self._usage_mark
        self._usage_mark = usage
        out = StepRollouts(groups=groups, dropped=self._dropped, refills=self._refills,
                           replaced_groups=len(self._dropped), zero_variance_groups=zero_variance,
                           stale_groups=self._stale_groups, cancelled_rollouts=self._cancelled, wait_s=wait_s,
                           slot_busy_s=usage.busy_s - mark.busy_s, slot_wasted_s=usage.wasted_s - mark.wasted_s,
                           slot_capacity_s=usage.capacity_s - mark.capacity_s)
        ids = [r.rollout_id for g in groups for r in g.results]
        self.emit(BatchTaken(step=step, rollout_ids=ids, prompt_ids=[g.prompt.id for g in groups],
                             started_policies=[g.policies[r.rollout_id] for g in groups for r in g.results],
                             wait_s=round(wait_s, 6)))
        self._dropped, self._refills, self._stale_groups, self._cancelled = [], 0, 0, 0
        self._replace_budget = self.s.batch_size if self.s.replace_zero_variance else 0
        self.next_step = step + 1
        # What the next step can no longer train goes now, not after this step's training: its slots
        # are better used for work that counts.
        self._expire()
        self._pump()
        return out

    async def close(self) -> None:
        """Cancel everything in flight and wait until every cancelled rollout has cleaned up."""
        self._closed = True
        self._queue.clear()
        for run in list(self._runs.values()):
            self._cancel(run, "stopped")
        tasks = [r.task for r in self._runs.values()]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- internals ----------------------------------------------------------------------------------

    def _as_group(self, g: _Live) -> Group:
        results = [g.final[i] for i in sorted(g.final)]
        return Group(g.prompt, g.seq, results, {r.rollout_id: g.policy_of[r.rollout_id] for r in results})

    def _horizon(self) -> int:
        """The last step a group started now could be trained in."""
        return min(self.policy + self.s.max_staleness, self.end_step - 1)

    def _can_launch(self) -> bool:
        if self._closed:
            return False
        allowed = (self._horizon() - self.next_step + 1) * self.s.batch_size
        return len(self._live) < allowed

    def _pump(self) -> None:
        """Start rollouts while a slot is free: queued slots (refills first), then new groups."""
        if self._closed:
            return
        while len(self._runs) < self.s.slots:
            if not self._queue:
                if not self._can_launch():
                    return
                self._launch_group()
            live, index = self._queue.popleft()
            if live.seq not in self._live:
                continue  # dropped while it waited for a slot
            self._start(live, index)

    def _launch_group(self) -> None:
        prompt = self._redo.popleft() if self._redo else self.draw()
        seq = self._seq
        self._seq += 1
        live = _Live(seq, prompt, f"{self.id_prefix}g{seq:05d}-{prompt.id}")
        self._live[seq] = live
        self._queue.extend((live, i) for i in range(self.s.samples_per_prompt))

    def _start(self, live: _Live, index: int) -> None:
        attempt = live.attempts.get(index, 0)
        rid = f"{live.base_id}-{index}" + (f"-refill{attempt}" if attempt else "")
        slot = RolloutSlot(rid, live.seq, index, attempt)
        live.policy_of[rid] = self.policy
        live.slot_policy[index] = self.policy
        live.running.add(rid)
        task = asyncio.ensure_future(self.rollout_fn(live.prompt, slot))
        self._runs[rid] = _Run(rid, task, live, index, self.policy, self._loop.time())
        # A done callback, not a wrapper's ``finally``: a task cancelled before its first step never runs
        # its body, and its slot must still come back.
        task.add_done_callback(lambda t: self._ended(live, slot, t))

    def _ended(self, live: _Live, slot: RolloutSlot, task: asyncio.Task[RolloutResult]) -> None:
        run = self._runs.pop(slot.rollout_id)
        live.running.discard(slot.rollout_id)
        held = self._loop.time() - run.started
        self._busy_s += held
        result: RolloutResult | None = None
        if task.cancelled():
            pass  # ours (stale, stopped) or the event loop's teardown: nothing to keep either way
        elif task.exception() is not None:
            if self._error is None:
                self._error = task.exception()  # take() raises it in the trainer
        else:
            result = task.result()
        kept = result is not None and not self._closed and live.seq in self._live
        if kept:
            live.busy_s += held
        else:
            self._wasted_s += held
        self._changed.set()
        if kept:
            assert result is not None
            self._finished(live, slot, result)
        self._pump()

    def _finished(self, live: _Live, slot: RolloutSlot, result: RolloutResult) -> None:
        if result.termination in self.s.admission.excluded and slot.attempt < self.s.max_refills:
            attempt = slot.attempt + 1
            live.attempts[slot.index] = attempt
            live.slot_policy.pop(slot.index, None)
            new_id = f"{live.base_id}-{slot.index}-refill{attempt}"
            self.emit(RolloutRefilled(step=self.next_step, failed_rollout_id=result.rollout_id,
                                      new_rollout_id=new_id, termination=result.termination, attempt=attempt))
            self._refills += 1
            self._queue.appendleft((live, slot.index))  # refills go first: they complete a group
            return
        live.final[slot.index] = result
        if result.termination in self.s.admission.excluded:
            # Never trained, so its age bounds nothing.
            live.slot_policy.pop(slot.index, None)
        if len(live.final) < self.s.samples_per_prompt:
            return
        if not self.s.partial and live.oldest() < self.next_step - self.s.max_staleness:
            self._drop_stale(live)  # complete, but too old for any step left (defensive: _expire saw it first)
            return
        results = [live.final[i] for i in sorted(live.final)]
        common = uniform_reward(results, self.s.admission)
        if common is not None and self._replace_budget > 0:
            self._replace_budget -= 1
            del self._live[live.seq]
            self._wasted_s += live.busy_s
            self._dropped.append(self._as_group(live))
            self.emit(GroupReplaced(step=self.next_step, prompt_id=live.prompt.id, reward=common))
            return
        live.done_at = self._done_seq
        self._done_seq += 1

    def _expire(self) -> None:
        """Drop every group the next step can no longer train (its oldest kept rollout is too old)."""
        if self.s.partial:
            return  # rollouts run on across updates: their later turns sample from newer weights
        floor = self.next_step - self.s.max_staleness
        for live in [g for g in self._live.values() if g.oldest() < floor]:
            self._drop_stale(live)

    def _drop_stale(self, live: _Live) -> None:
        del self._live[live.seq]
        self._stale_groups += 1
        self._wasted_s += live.busy_s
        for rid in list(live.running):
            self._cancel(self._runs[rid], "stale")
            self._cancelled += 1

    def _cancel(self, run: _Run, reason: Literal["stale", "stopped"]) -> None:
        if run.cancel_reason is not None:
            return
        run.cancel_reason = reason
        run.task.cancel()
        self.emit(RolloutCancelled(rollout_id=run.rollout_id,
                                   prompt_id=run.group.prompt.id, reason=reason, started_policy=run.policy,
                                   next_step=self.next_step))
