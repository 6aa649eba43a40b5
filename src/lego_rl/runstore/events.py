"""Typed run events: one pydantic model per ``kind``, one JSON object per line of ``events.jsonl``.

Writers build a model (a typo in a field name fails at once, ``extra="forbid"``) and readers get the same
model back, discriminated by ``kind``, so the monitor and resume never guess at free strings. A rollout's
termination reason is decided once and appears only in ``rollout_finished``: the events before it carry
facts (exit code, stage status), never a competing classification.

Adding a kind: a model here and its name in ``RunEvent``. Renaming a field breaks old logs: add a new
field instead and keep reading the old one.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from lego_rl.termination import TerminationReason

StageName = Literal[
    "harness_lookup", "sandbox_setup", "harness_install", "agent", "patch", "cleanup", "grading", "samples"
]
StageStatus = Literal["ok", "failed", "interrupted"]
"""``failed``: the stage raised (the rollout's reason says why); ``interrupted``: cancelled (the guard)."""


def _now() -> float:
    return round(time.time(), 3)


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ts: float = Field(default_factory=_now)
    """Wall-clock time of the event (Unix seconds, ms precision)."""


class RunStarted(_Event):
    kind: Literal["run_started"] = "run_started"
    root: str


class RunResumed(_Event):
    kind: Literal["run_resumed"] = "run_resumed"
    root: str


class StaleLockTaken(_Event):
    """The run directory's lock file still named a holder that died without releasing it (kill -9, a crash):
    this process took the lock over. The dead holder is named here."""

    kind: Literal["stale_lock_taken"] = "stale_lock_taken"
    step: int | None = None
    """The step this process continues with (the newest checkpoint's next; 0 without one): the dead holder's
    work after that checkpoint is abandoned. None when the checkpoint pointer was unreadable."""
    previous_pid: int
    previous_host: str
    previous_since: float


class ResumeOverride(_Event):
    """A resume changed a key that shapes training because the operator named it (``--override KEY``): the
    new value applies from ``step`` on (config/resume_keys.py lists such keys)."""

    kind: Literal["resume_override"] = "resume_override"
    step: int
    """The first step trained with the new value."""
    key: str
    before: Any
    after: Any
    recorded_in: str
    """The config file of the launch that had ``before``."""


class LogRepaired(_Event):
    """The log ended in a torn line (a crash mid-write) when it was reopened for appending. The fragment
    was cut off so that new events start on their own line; its text is kept here."""

    kind: Literal["log_repaired"] = "log_repaired"
    fragment: str


class ServingReady(_Event):
    kind: Literal["serving_ready"] = "serving_ready"
    adapter: str
    serving: list[str]


class Baseline(_Event):
    """One task graded unmodified (``rollout-check --baseline``): it must fail, or its reward says nothing."""

    kind: Literal["baseline"] = "baseline"
    instance_id: str
    solved: bool | None = None
    """None when the grader could not decide (``error`` says why)."""
    reason: str = ""
    error: str | None = None


class RolloutCheckFinished(_Event):
    kind: Literal["rollout_check_finished"] = "rollout_check_finished"
    rewarded: int
    rollouts: int
    terminations: dict[str, int]


class ScreenFinished(_Event):
    """A ``lego tasks screen`` session ended (its rollouts done, or stopped: the next session tops up)."""

    kind: Literal["screen_finished"] = "screen_finished"
    k: int
    rollouts: int
    """Rollouts this session ran (the attempts already in the directory are not counted)."""
    stopped: bool = False
    """Cancelled (SIGTERM, Ctrl-C) before every planned rollout finished."""


class _RolloutEvent(_Event):
    rollout_id: str


class RolloutStarted(_RolloutEvent):
    kind: Literal["rollout_started"] = "rollout_started"
    instance_id: str
    harness: str
    group_index: int = 0
    index: int = 0


class StageFinished(_RolloutEvent):
    kind: Literal["stage"] = "stage"
    stage: StageName
    status: StageStatus
    duration_s: float


class HarnessReady(_RolloutEvent):
    kind: Literal["harness_ready"] = "harness_ready"
    harness: str
    version: str


class AgentExited(_RolloutEvent):
    """The CLI process ended: what was observed, not why the rollout ended (``rollout_finished`` decides)."""

    kind: Literal["agent_exited"] = "agent_exited"
    cli_s: float
    exit_code: int | None
    """None when it was killed at the time budget."""
    detail: str = ""
    """The harness's account of the exit, in words (cut to 300 characters)."""


class SessionOpened(_RolloutEvent):
    """The adapter session was opened with these limits (the config's, narrowed by the harness's options)."""

    kind: Literal["session_opened"] = "session_opened"
    session_id: str
    max_requests: int | None
    harness_options: dict[str, object] = Field(default_factory=dict)
    """What the harness asked of the adapter (``HarnessHandle.adapter_options()``)."""


class SessionCloseFailed(_RolloutEvent):
    """Closing the adapter session (and saving its turn records) raised: the records may be missing."""

    kind: Literal["session_close_failed"] = "session_close_failed"
    error: str
    traceback: str


class ArtifactNotSaved(_RolloutEvent):
    """An artifact could not be written to the rollout's folder (disk full, CLI files unreadable...)."""

    kind: Literal["artifact_not_saved"] = "artifact_not_saved"
    name: str
    error: str


class RolloutFinished(_RolloutEvent):
    """The one place a rollout's termination reason is written."""

    kind: Literal["rollout_finished"] = "rollout_finished"
    termination: TerminationReason
    reward: float | None
    detail: str = ""
    infrastructure_failure: bool
    timings: dict[str, float] = Field(default_factory=dict)
    turns: int = 0
    traceback: str | None = None
    """For ``internal_error``: where the bug is."""


class ControlArm(_Event):
    """This launch is the control arm of an experiment (``train.control``): from ``step`` on, the loss sees
    every advantage as 0 while everything else runs as in training."""

    kind: Literal["control_arm"] = "control_arm"
    step: int
    """The first step this launch trains."""
    control: Literal["zero_advantage"]


class StepStarted(_Event):
    """A training step began drawing rollouts; ``weight_version`` is what the engines serve for it."""

    kind: Literal["step_started"] = "step_started"
    step: int
    weight_version: int


class RolloutRefilled(_Event):
    """An infrastructure failure was replaced by a new rollout for the same prompt (same group slot)."""

    kind: Literal["rollout_refilled"] = "rollout_refilled"
    step: int
    failed_rollout_id: str
    new_rollout_id: str
    termination: TerminationReason
    attempt: int
    """1 for the first refill of this slot."""


class GroupReplaced(_Event):
    """A prompt group whose rewards were all equal (no signal) was dropped and another prompt drawn in its
    place (``train.oversample_zero_variance``)."""

    kind: Literal["group_replaced"] = "group_replaced"
    step: int
    prompt_id: str
    reward: float


class RolloutCancelled(_Event):
    """The scheduler cancelled a rollout in flight: ``stale`` when no step left within ``rollout.max_staleness``
    could still train it, ``stopped`` when the run stopped or failed. The rollout itself ends ``interrupted``
    (its sandbox destroyed and session closed by ``generate()``); nothing of it is trained."""

    kind: Literal["rollout_cancelled"] = "rollout_cancelled"
    rollout_id: str
    prompt_id: str
    reason: Literal["stale", "stopped"]
    started_policy: int
    """The policy (steps trained into the engines' weights) it started on."""
    next_step: int
    """The next step the trainer takes a batch for."""


class BatchTaken(_Event):
    """The rollouts a step trains on, chosen by the scheduler: each with the policy it started on. A rollout
    id appears in at most one of these over a run (resumes included): nothing is trained twice."""

    kind: Literal["batch_taken"] = "batch_taken"
    step: int
    rollout_ids: list[str]
    prompt_ids: list[str]
    """One per group, in the batch's order."""
    started_policies: list[int]
    """Aligned with ``rollout_ids``."""
    wait_s: float
    """How long the trainer waited for the batch (0 when it was ready)."""


class StepFinished(_Event):
    """The step's rollouts were admitted, trained on (unless none carried signal) and synced."""

    kind: Literal["step_finished"] = "step_finished"
    step: int
    admitted_rollouts: int
    excluded_rollouts: dict[str, int] = Field(default_factory=dict)
    zero_variance_groups: int = 0
    trained: bool
    """False when every advantage was zero: the parameters were left as they were."""
    weight_version: int
    reward_mean: float | None = None


class CheckpointSaved(_Event):
    kind: Literal["checkpoint_saved"] = "checkpoint_saved"
    step: int
    """The last completed step the checkpoint holds; a resume continues with ``step + 1``."""
    path: str


class StepsAbandoned(_Event):
    """A resume from the checkpoint of ``resumed_from`` abandoned the later ``steps`` this log recorded (a roll
    back, steps finished after the last checkpoint, a step in flight when the process died): their events
    above stay, but they are not the run's steps any more (readers drop them); their metrics rows were moved
    to ``metrics_set_aside``."""

    kind: Literal["steps_abandoned"] = "steps_abandoned"
    step: int | None = None
    """The first step the resumed run trains (``resumed_from + 1``; 0 without a checkpoint). None in logs
    written before the field existed."""
    resumed_from: int | None
    """The checkpoint's step; None when there was no checkpoint: the run started again from its initial
    weights (killed, or stopped by a second Ctrl-C, before its first checkpoint)."""
    steps: list[int]
    """The abandoned steps: those with a metrics row and those begun (``step_started``) but never finished."""
    metrics_set_aside: str | None
    """The file now holding the former metrics.jsonl whole; None when no row was moved (only steps in flight
    were abandoned)."""


class EvalFinished(_Event):
    """Held-out evaluation: pass@1 estimated from ``samples_per_row`` rollouts of each row."""

    kind: Literal["eval_finished"] = "eval_finished"
    step: int
    pass_at_1: float
    reward_mean: float
    rows: int
    samples_per_row: int
    infrastructure_failures: int = 0


class TrainingFinished(_Event):
    """The loop ended: ``completed`` after ``train.num_rollout`` steps, ``stopped`` on a signal."""

    kind: Literal["training_finished"] = "training_finished"
    status: Literal["completed", "stopped", "failed"]
    steps_done: int
    """Steps completed over the whole run (resumes included)."""
    detail: str = ""


RunEvent = Annotated[
    RunStarted
    | RunResumed
    | LogRepaired
    | StaleLockTaken
    | ResumeOverride
    | ServingReady
    | Baseline
    | RolloutCheckFinished
    | ScreenFinished
    | RolloutStarted
    | StageFinished
    | HarnessReady
    | AgentExited
    | SessionOpened
    | SessionCloseFailed
    | ArtifactNotSaved
    | RolloutFinished
    | ControlArm
    | StepStarted
    | RolloutRefilled
    | GroupReplaced
    | RolloutCancelled
    | BatchTaken
    | StepFinished
    | CheckpointSaved
    | StepsAbandoned
    | EvalFinished
    | TrainingFinished,
    Field(discriminator="kind"),
]
"""Any event of the run log, told apart by its ``kind``."""

EVENTS: TypeAdapter[RunEvent] = TypeAdapter(RunEvent)


_VALIDATE_JSON = EVENTS.validator.validate_json
"""The adapter's core validator, called without ``TypeAdapter.validate_json``'s Python wrapper: a fifth of the
parse of a line (a first read of a 10,000-rollout run parses ~100,000)."""


def parse_event(line: str | bytes) -> RunEvent:
    """One log line as its typed event; ``pydantic.ValidationError`` for an unknown kind or bad field."""
    return _VALIDATE_JSON(line)  # type: ignore[no-any-return]


def event_kinds() -> list[str]:
    """Every ``kind`` a run log may hold."""
    return sorted(EVENTS.json_schema()["discriminator"]["mapping"])
