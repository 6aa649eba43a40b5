"""What the monitor knows about a run: aggregates built from its logs, one new line at a time.

``RunState.refresh()`` reads only what was appended since the last call (``JsonlFollower`` cursors), so a
live refresh costs what the run wrote in the meantime, never a re-read of the whole run. Everything a view
shows is kept here in a form it can render without visiting every rollout again: per step, per task, per
(step, harness, stage). A run that is broken in any way (no log yet, a torn last line, a line that does not
parse, a log cut shorter) becomes a ``note``, never an exception: the monitor is what an operator opens when
something went wrong.
"""

from __future__ import annotations

import gc
import json
import time
from collections import Counter, deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from lego_rl.runstore import JsonlFollower, RunLayout, RunLogError, StepMetrics, follow_events, follow_metrics
from lego_rl.runstore import metric_catalog as mc
from lego_rl.runstore.events import (
    AgentExited,
    ArtifactNotSaved,
    Baseline,
    BatchTaken,
    CheckpointSaved,
    ControlArm,
    EvalFinished,
    GroupReplaced,
    LogRepaired,
    RolloutCheckFinished,
    HarnessReady,
    RolloutCancelled,
    ScreenFinished,
    SessionOpened,
    RolloutFinished,
    RolloutRefilled,
    ResumeOverride,
    RolloutStarted,
    RunEvent,
    RunResumed,
    RunStarted,
    ServingReady,
    SessionCloseFailed,
    StageFinished,
    StaleLockTaken,
    StepFinished,
    StepsAbandoned,
    StepStarted,
    TrainingFinished,
)

_NOT_SHOWN = frozenset({HarnessReady, SessionOpened, RolloutCancelled})
"""Event kinds the monitor reads past (a cancelled rollout also ends in ``rollout_finished``, ``interrupted``)."""

EXAMPLES_KEPT = 5
"""Latest examples kept per termination reason (the Terminations view lists them)."""
RECENT_KEPT = 200
"""Finished rollouts kept in order for the rollout list and the search."""


@dataclass
class Rollout:
    """One rollout as the events tell it; ``termination`` is None while it is in flight."""

    rollout_id: str
    instance_id: str
    harness: str
    step: int | None
    """The training step that trained it (``batch_taken``), until then the step open when it started; None
    for evaluation and rollout-check rollouts. Steps are numbered from 0 (docs/monitoring.md)."""
    started: float
    started_step: int | None = None
    """The step open when it started (never moved: an asynchronous run trains it in a later step)."""
    started_policy: int | None = None
    """The policy (weight version) it started on, from ``batch_taken``; None until a step takes it."""
    group_index: int = 0
    index: int = 0
    finished: float | None = None
    termination: str | None = None
    reward: float | None = None
    infrastructure: bool = False
    turns: int = 0
    detail: str = ""
    stages: dict[str, tuple[str, float]] = field(default_factory=dict)
    """stage → (status, seconds), in the order they ended."""
    exit_code: int | None = None
    refilled_by: str | None = None
    problems: list[str] = field(default_factory=list)
    """session_close_failed / artifact_not_saved facts about this rollout."""
    counted_in: int | None = None
    """The step whose figures include this finished rollout (a batch_taken event may move it)."""
    filed: bool = False
    filed_under: int | None = None
    """When ``filed``: the step whose task-grid group holds its reward (moved with ``counted_in``)."""

    @property
    def outcome(self) -> str:
        """``solved``, ``failed``, ``infra`` or ``running`` (the task grid's cell)."""
        if self.termination is None:
            return "running"
        if self.infrastructure:
            return "infra"
        return "solved" if (self.reward or 0.0) >= 1.0 else "failed"


@dataclass
class StepAgg:
    step: int
    started: float
    weight_version: int
    finished: StepFinished | None = None
    metrics: StepMetrics | None = None
    terminations: Counter[str] = field(default_factory=Counter)
    rewards: list[float] = field(default_factory=list)
    rollouts: int = 0
    in_flight: int = 0
    refills: int = 0
    replaced_groups: int = 0
    infrastructure: int = 0
    turns: list[int] = field(default_factory=list)
    group_rewards: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    """(task, group index) → admitted rewards of the step's rollouts: the reward spread per group."""


@dataclass
class TaskAgg:
    instance_id: str
    cells: list[str] = field(default_factory=list)
    """Outcome of each finished attempt, in order (``solved`` / ``failed`` / ``infra``)."""
    groups: dict[int | None, list[float]] = field(default_factory=dict)
    """step → admitted rewards, for zero-variance groups."""

    @property
    def solve_rate(self) -> float | None:
        graded = [c for c in self.cells if c != "infra"]
        return sum(c == "solved" for c in graded) / len(graded) if graded else None


@dataclass(frozen=True)
class Note:
    level: str
    """``info``, ``warn`` or ``error``."""
    text: str


class _Log:
    """One followed log: its follower, and what happened to it (missing, torn tail, bad lines)."""

    def __init__(self, follower: JsonlFollower[object], name: str) -> None:
        self.follower = follower
        self.name = name
        self.exists = False
        self.torn_bytes = 0
        self.bad_lines: list[str] = []
        self.size = 0
        self.mtime: float | None = None

    def replaced(self) -> bool:
        """Another file is under the name now (another inode), or the file is shorter than the cursor."""
        cur = self.follower.cursor
        if cur.inode is None:
            return False
        try:
            st = self.follower.path.stat()
        except FileNotFoundError:
            return cur.offset > 0
        return st.st_ino != cur.inode or st.st_size < cur.offset

    def read(self) -> Iterator[object]:
        """New records, one at a time (a first read of a long run never holds all its events at once); a line
        that does not parse is noted and stepped over (the rest is still read). Read it to the end: the file's
        state (exists, size, torn tail) is updated after the last record."""
        path = self.follower.path
        for _ in range(1000):  # bounded: at most this many bad lines stepped over in one refresh
            try:
                yield from self.follower.read()
                break
            except RunLogError as exc:
                self.bad_lines.append(str(exc))
                del self.bad_lines[:-5]
                self.follower.skip_line()
        try:
            st = path.stat()
        except FileNotFoundError:
            self.exists = False
            return
        self.exists = True
        self.size, self.mtime = st.st_size, st.st_mtime
        self.torn_bytes = max(0, st.st_size - self.follower.cursor.offset)


@contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """The cyclic collector off while a log is read: a first read of a long run allocates ~100,000 events and
    the records built from them, none in a cycle, and the collector's passes over that growing heap were a
    third of the read's time (10,000 rollouts: 1.6 s → 1.0 s CPU). Reference counting still frees everything."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _resumed_from(a: StepsAbandoned) -> str:
    if a.resumed_from is None:
        return "resumed without a checkpoint (from the initial weights)"
    return f"resumed from step {a.resumed_from}'s checkpoint"


def _set_aside(a: StepsAbandoned) -> str:
    return f"; their metrics rows are in {a.metrics_set_aside}" if a.metrics_set_aside else ""


def _config_value(config: dict[str, object], section: str, key: str) -> object:
    part = config.get(section)
    if isinstance(part, dict):
        entry = part.get(key)
        if isinstance(entry, dict) and "value" in entry:
            return entry["value"]
    return None


class RunState:
    """A run directory followed incrementally. Call ``refresh()``; read the attributes."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.notes_fixed: list[Note] = []
        self.config: dict[str, object] = self._read_config()
        self.layout = RunLayout(self.root, self._moved("artifacts"), self._moved("run_log"))
        self.events = _Log(follow_events(self.layout.events), "events.jsonl")  # type: ignore[arg-type]
        metrics = follow_metrics(self.layout.metrics)
        self.metrics_log = _Log(metrics, "metrics.jsonl")  # type: ignore[arg-type]
        self.rollouts: dict[str, Rollout] = {}
        self.in_flight: dict[str, Rollout] = {}
        self.recent: deque[Rollout] = deque(maxlen=RECENT_KEPT)
        self.steps: dict[int, StepAgg] = {}
        self.open_step: int | None = None
        self.tasks: dict[str, TaskAgg] = {}
        self.examples: dict[str, deque[Rollout]] = {}
        self.terminations: Counter[str] = Counter()
        self.infra_reasons: set[str] = set()
        self.stage_times: dict[tuple[int | None, str, str], list[float]] = {}
        """(step, harness, stage) → seconds of each rollout's stage that ended ``ok`` or ``failed``; the step is the
        one whose batch took the rollout (``batch_taken``), until then the step open when it started."""
        self.turns_by_harness: dict[str, Counter[int]] = {}
        self.evals: list[EvalFinished] = []
        self.checkpoints: list[CheckpointSaved] = []
        self.baselines: list[Baseline] = []
        self.check_finished: RolloutCheckFinished | None = None
        self.screen_finished: ScreenFinished | None = None
        """The last ``lego tasks screen`` session's end (a screening run reads like a rollout-check run)."""
        self.finished: TrainingFinished | None = None
        self.started_at: float | None = None
        self.resumes = 0
        self.abandoned: list[StepsAbandoned] = []
        """Resumes that abandoned recorded steps (a roll back): their metrics rows were moved aside."""
        self.serving: list[str] = []
        self.last_error: tuple[float, str] | None = None
        self.last_event_ts: float | None = None
        self.kind = "empty"
        """A ``metric_catalog.RunKind`` value (``train``, ``sft``, ``rollout-check``, ``tasks-screen``), or
        ``empty`` (nothing yet)."""
        self.incidents: list[tuple[float, str, str]] = []
        """Events an operator must know of, in order: a stale lock taken over, a resume override, a control arm,
        steps abandoned by a resume (``ts``, the event's kind, one line)."""
        self.events_read = 0
        self.metrics_read = 0

    # -- reading -------------------------------------------------------------------------------------

    def _read_config(self) -> dict[str, object]:
        path = self.root / "config.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            self.notes_fixed.append(
                Note("warn", f"{path}: not readable as JSON ({exc}); config values unknown")
            )
            return {}
        return data if isinstance(data, dict) else {}

    def _moved(self, key: str) -> Path | None:
        """``paths.<key>`` when the run put it outside its run root (else None: the default place, under the
        directory given, which may have been moved or copied since the run wrote its config)."""
        value = _config_value(self.config, "paths", key)
        root = _config_value(self.config, "paths", "run_root")
        if not isinstance(value, str) or not Path(value).is_absolute():
            return None
        if isinstance(root, str) and Path(value).is_relative_to(root):
            return None
        return Path(value)

    def refresh(self) -> int:
        """Read what was appended since the last call; the number of new records."""
        if not self.config and (self.root / "config.json").is_file():  # watched since before the run began
            if self.events_read == 0 and self.metrics_read == 0:
                self.__init__(self.root)  # type: ignore[misc]  # the config may place the log elsewhere
            else:
                self.config = self._read_config()
        replaced = [log.name for log in (self.events, self.metrics_log) if log.replaced()]
        if replaced:  # a different file under the name now: what was counted from the old one is void
            self.__init__(self.root)  # type: ignore[misc]
            self.notes_fixed.append(
                Note(
                    "warn",
                    f"{' and '.join(replaced)} was replaced or cut shorter while "
                    "followed (a new run in this directory?): read again from the top",
                )
            )
        new = 0
        with _no_cyclic_gc():
            for event in self.events.read():
                self._apply(event)  # type: ignore[arg-type]
                new += 1
        self.events_read += new
        rows = 0
        for row in self.metrics_log.read():
            assert isinstance(row, StepMetrics)
            agg = self.steps.get(row.step)
            if agg is None:
                agg = self.steps[row.step] = StepAgg(
                    row.step, row.started_at, int(mc.read(row.values, mc.WEIGHT_VERSION) or 0)
                )
            agg.metrics = row
            if mc.read(row.values, mc.DEMONSTRATIONS) is not None:  # only SFT writes it (older configs: no sft_data)
                self.kind = mc.RunKind.SFT.value
            rows += 1
        self.metrics_read += rows
        return new + rows

    def _apply(self, e: RunEvent) -> None:
        self.last_event_ts = e.ts
        if type(e) in _NOT_SHOWN:  # frequent facts no view reads: skip the chain below (a 10,000-rollout run)
            return
        r: Rollout | None
        if isinstance(e, StageFinished):  # the most frequent kind first (five or more per rollout)
            r = self.rollouts.get(e.rollout_id)
            if r is not None:
                r.stages[e.stage] = (e.status, e.duration_s)
                if e.status != "interrupted":
                    self._stage_time(r, e.stage, e.duration_s)
        elif isinstance(e, RolloutStarted):
            step = self.open_step
            r = Rollout(e.rollout_id, e.instance_id, e.harness, step, e.ts, step, None, e.group_index, e.index)
            self.rollouts[e.rollout_id] = r
            self.in_flight[e.rollout_id] = r
            if step is not None and step in self.steps:
                self.steps[step].in_flight += 1
        elif isinstance(e, RolloutFinished):
            self._finish(e)
        elif isinstance(e, AgentExited):
            if (r := self.rollouts.get(e.rollout_id)) is not None:
                r.exit_code = e.exit_code
        elif isinstance(e, SessionCloseFailed | ArtifactNotSaved):
            what = (
                f"session close failed: {e.error}"
                if isinstance(e, SessionCloseFailed)
                else f"artifact {e.name} not saved: {e.error}"
            )
            if (r := self.rollouts.get(e.rollout_id)) is not None:
                r.problems.append(what)
            self.last_error = (e.ts, f"{e.rollout_id}: {what}")
        elif isinstance(e, BatchTaken):
            self._take(e)
        elif isinstance(e, StepStarted):
            self.kind = mc.RunKind.SFT.value if self.is_sft() else mc.RunKind.TRAIN.value
            self.open_step = e.step
            if (known := self.steps.get(e.step)) is None:
                self.steps[e.step] = StepAgg(e.step, e.ts, e.weight_version)
            else:  # its batch_taken came first
                known.started, known.weight_version = e.ts, e.weight_version
        elif isinstance(e, StepFinished):
            agg = self.steps.setdefault(e.step, StepAgg(e.step, e.ts, e.weight_version))
            agg.finished = e
            self.open_step = None
        elif isinstance(e, RolloutRefilled):
            if (r := self.rollouts.get(e.failed_rollout_id)) is not None:
                r.refilled_by = e.new_rollout_id
            if e.step in self.steps:
                self.steps[e.step].refills += 1
        elif isinstance(e, GroupReplaced):
            if e.step in self.steps:
                self.steps[e.step].replaced_groups += 1
        elif isinstance(e, EvalFinished):
            self.evals.append(e)
        elif isinstance(e, CheckpointSaved):
            self.checkpoints.append(e)
        elif isinstance(e, StepsAbandoned):
            # A resume from an older checkpoint: those steps are not the run's any more (their rollouts stay
            # known, counted in no step; the resumed run records the steps again).
            for step in e.steps:
                self.steps.pop(step, None)
            for r in self.rollouts.values():
                if r.counted_in in e.steps:
                    r.counted_in = None
            self.checkpoints = [c for c in self.checkpoints if c.step not in e.steps]
            self.abandoned.append(e)
            self.incidents.append((e.ts, e.kind, f"steps abandoned: {', '.join(map(str, e.steps))} "
                                                 f"({_resumed_from(e)})"))
        elif isinstance(e, TrainingFinished):
            self.finished = e
            self.open_step = None
            if e.status == "failed":
                self.last_error = (e.ts, f"training failed: {e.detail}")
        elif isinstance(e, RunStarted):
            self.started_at = self.started_at or e.ts
        elif isinstance(e, RunResumed):
            self.resumes += 1
            self.finished = None  # a resumed run is running again until its next training_finished
            self.screen_finished = None  # ... or its next screening session's end
        elif isinstance(e, Baseline):
            self.baselines.append(e)
            if self.kind == "empty":
                self.kind = "rollout-check"
        elif isinstance(e, RolloutCheckFinished):
            self.check_finished = e
            self.kind = "rollout-check"
        elif isinstance(e, ScreenFinished):
            self.screen_finished = e
            self.kind = mc.RunKind.TASKS_SCREEN.value
        elif isinstance(e, StaleLockTaken):
            cont = f"; continuing with step {e.step}" if e.step is not None else ""
            self.incidents.append((e.ts, e.kind, f"stale lock taken over: the previous holder (pid {e.previous_pid} on "
                                                 f"{e.previous_host}) died without releasing run.lock{cont}"))
        elif isinstance(e, ControlArm):
            self.incidents.append((e.ts, e.kind, f"control arm from step {e.step}: train.control = {e.control} (the "
                                                 "loss sees every advantage as 0)"))
        elif isinstance(e, ResumeOverride):
            self.incidents.append((e.ts, e.kind, f"resume override from step {e.step}: {e.key} {e.before!r} → "
                                                 f"{e.after!r} (was recorded in {e.recorded_in})"))
        elif isinstance(e, ServingReady):
            self.serving = e.serving
        elif isinstance(e, LogRepaired):
            repaired = f"the log ended in a torn line when reopened (a crash mid-write): {e.fragment[:80]!r}"
            self.last_error = (e.ts, repaired)

    def _count(self, r: Rollout, agg: StepAgg, sign: int) -> None:
        """Add (+1) or take back (-1) a finished rollout's share of a step's figures."""
        reason = r.termination or "?"
        agg.terminations[reason] += sign
        if agg.terminations[reason] <= 0:
            del agg.terminations[reason]
        agg.rollouts += sign
        if sign > 0:
            agg.turns.append(r.turns)
        elif r.turns in agg.turns:
            agg.turns.remove(r.turns)
        if r.infrastructure:
            agg.infrastructure += sign
        elif r.reward is not None:
            group = agg.group_rewards.setdefault((r.instance_id, r.group_index), [])
            if sign > 0:
                agg.rewards.append(r.reward)
                group.append(r.reward)
            else:
                if r.reward in agg.rewards:
                    agg.rewards.remove(r.reward)
                if r.reward in group:
                    group.remove(r.reward)
                if not group:
                    del agg.group_rewards[(r.instance_id, r.group_index)]
        r.counted_in = agg.step if sign > 0 else None

    def _take(self, e: BatchTaken) -> None:
        """The asynchronous scheduler decides which step trains a rollout only when it takes the batch (a rollout
        may start and finish while an earlier step is open): move each taken rollout's figures to that step."""
        agg = self.steps.setdefault(e.step, StepAgg(e.step, e.ts, 0))
        for i, rid in enumerate(e.rollout_ids):
            r = self.rollouts.get(rid)
            if r is None:
                continue
            r.started_policy = e.started_policies[i] if i < len(e.started_policies) else None
            if r.termination is None or r.counted_in == e.step:
                continue
            if r.counted_in is not None and (old := self.steps.get(r.counted_in)) is not None:
                self._count(r, old, -1)
            self._move_stage_times(r, e.step)
            r.step = e.step
            self._count(r, agg, +1)
            self._file(r)

    def _move_stage_times(self, r: Rollout, step: int) -> None:
        """Refile a rollout's stage times from ``r.step`` (the step open when it started) under ``step``, the one
        whose batch took it, as the report files them (``report_curves.stage_series``)."""
        if r.step == step:
            return
        for stage, (status, seconds) in r.stages.items():
            if status == "interrupted":
                continue
            key = (r.step, r.harness, stage)
            if (old := self.stage_times.get(key)) is not None and seconds in old:
                old.remove(seconds)
                if not old:
                    del self.stage_times[key]
            self.stage_times.setdefault((step, r.harness, stage), []).append(seconds)

    def _stage_time(self, r: Rollout, stage: str, seconds: float) -> None:
        key = (r.step, r.harness, stage)
        if (times := self.stage_times.get(key)) is None:
            times = self.stage_times[key] = []
        times.append(seconds)

    def _finish(self, e: RolloutFinished) -> None:
        r = self.rollouts.get(e.rollout_id)
        if r is None:  # its start is not in this log (a log cut, a moved file): keep what we know
            r = self.rollouts[e.rollout_id] = Rollout(e.rollout_id, "?", "?", self.open_step, e.ts, self.open_step)
        self.in_flight.pop(e.rollout_id, None)
        r.finished, r.termination, r.reward = e.ts, str(e.termination), e.reward
        r.infrastructure, r.turns, r.detail = e.infrastructure_failure, e.turns, e.detail
        if not r.stages:  # environment rollouts and older logs: the timings are the stages
            for stage, d in e.timings.items():
                r.stages[stage] = ("ok", d)
                self._stage_time(r, stage, d)
        reason = r.termination
        self.terminations[reason] += 1
        if r.infrastructure:
            self.infra_reasons.add(reason)
            self.last_error = (e.ts, f"{r.rollout_id}: {reason}: {e.detail or (e.traceback or '')[-200:]}")
        if (examples := self.examples.get(reason)) is None:
            examples = self.examples[reason] = deque(maxlen=EXAMPLES_KEPT)
        examples.append(r)
        self.recent.append(r)
        if (turns := self.turns_by_harness.get(r.harness)) is None:
            turns = self.turns_by_harness[r.harness] = Counter()
        turns[r.turns] += 1
        if r.step is not None and (agg := self.steps.get(r.step)) is not None:
            agg.in_flight = max(0, agg.in_flight - 1)
            self._count(r, agg, +1)
        task = self.tasks.get(r.instance_id)
        if task is None:
            task = self.tasks[r.instance_id] = TaskAgg(r.instance_id)
        task.cells.append(r.outcome)
        self._file(r)

    def _file(self, r: Rollout) -> None:
        """File a finished rollout's reward in its task's group of the step that trains it (``r.step``), taking
        it out of the group it was filed in before (the step open when it started, before ``batch_taken``)."""
        if r.infrastructure or r.reward is None:
            return
        task = self.tasks.get(r.instance_id)
        if task is None or (r.filed and r.filed_under == r.step):
            return
        if r.filed and (old := task.groups.get(r.filed_under)) is not None and r.reward in old:
            old.remove(r.reward)
            if not old:
                del task.groups[r.filed_under]
        task.groups.setdefault(r.step, []).append(r.reward)
        r.filed, r.filed_under = True, r.step

    # -- what the views ask ----------------------------------------------------------------------------

    def notes(self, now: float | None = None) -> list[Note]:
        """Everything an operator should know about the state of the files and the run, worst first."""
        now = time.time() if now is None else now
        out = list(self.notes_fixed)
        if not self.root.is_dir():
            return [Note("error", f"{self.root}: no such directory")]
        if not self.events.exists:
            out.append(
                Note(
                    "error" if not self.config else "warn",
                    f"{self.layout.events} does not exist (yet): the run has not started writing events"
                    if self.config
                    else f"{self.root} holds no run (no config.json, no events.jsonl)",
                )
            )
        if not self.metrics_log.exists and self.kind == "train":
            out.append(Note("info", "metrics.jsonl does not exist yet: no step has finished"))
        for log in (self.events, self.metrics_log):
            if log.torn_bytes:
                out.append(
                    Note(
                        "warn",
                        f"{log.name} ends in an incomplete line ({log.torn_bytes} bytes without a "
                        "newline): a writer mid-line, or a crash while writing; not read yet",
                    )
                )
            out.extend(Note("error", f"skipped: {bad}") for bad in log.bad_lines)
        out.extend(Note("info", f"{_resumed_from(a)}: steps {', '.join(map(str, a.steps))} recorded before "
                                f"were abandoned (not shown{_set_aside(a)})") for a in self.abandoned)
        out.extend(Note("warn", text) for _, kind, text in self.incidents if kind != "steps_abandoned")
        out.append(self.status_note(now))
        return out

    def status(self, now: float) -> str:
        if self.finished is not None:
            return f"finished ({self.finished.status})"
        if self.check_finished is not None:
            return "finished"
        if self.screen_finished is not None:
            return "finished (stopped)" if self.screen_finished.stopped else "finished"
        if not self.events.exists or (self.events_read == 0 and not self.events.torn_bytes):
            return "not started"
        quiet = now - (self.events.mtime or now)
        if quiet > self.stall_after_s():
            return "stalled or crashed"
        return "running"

    def stall_after_s(self) -> float:
        """Quiet time after which an unfinished run is called stalled: 10 minutes, or 3 steps' time."""
        times = [a.metrics.finished_at - a.metrics.started_at for a in self.steps.values() if a.metrics]
        return max(600.0, 3 * max(times[-5:], default=0.0))

    def status_note(self, now: float) -> Note:
        status = self.status(now)
        if status.startswith("finished"):
            detail = f": {self.finished.detail}" if self.finished and self.finished.detail else ""
            return Note("error" if "failed" in status else "info", f"run {status}{detail}")
        if status == "stalled or crashed":
            quiet = now - (self.events.mtime or now)
            return Note(
                "warn",
                f"no event for {quiet / 60:.0f} min and no training_finished: the run crashed "
                f"(killed, out of memory) or is stuck; {len(self.in_flight)} rollouts never finished",
            )
        if status == "not started":
            return Note("info", "waiting for the run to write its first event to events.jsonl")
        return Note("info", "running")

    def is_sft(self) -> bool:
        """An SFT run (``lego train --sft`` sets ``train.sft_data``)."""
        return bool(_config_value(self.config, "train", "sft_data"))

    def config_int(self, section: str, key: str) -> int | None:
        value = _config_value(self.config, section, key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def artifact_dir(self, rollout_id: str) -> Path:
        return self.layout.rollout(rollout_id)
