"""What a checkpoint holds besides the trainer's own state, typed, and the one way a run saves and resumes one.

A trainer backend writes its model, optimizer, RNG and weight version, plus an ``extra_state`` JSON object it
does not read (``extra_state.json``). That object is a ``CheckpointState``: the GRPO loop's ``RlState``
(the last completed step, the prompt stream's cursor, the prompts drawn but not trained, the per-task signal)
or SFT's ``SftState`` (step and the demonstration order's cursor), told apart by ``kind``. A GRPO resume
refuses an SFT checkpoint and the other way round, naming what it found.

``save_checkpoint`` and ``resume_checkpoint`` are the path both take: the backend writes the folder, then
``checkpoints/latest`` is published and a ``checkpoint_saved`` event written; a resume loads ``latest``,
checks kind and seed (and what the caller checks), then sets aside the metrics rows of later steps.

Checkpoints written before ``kind`` existed are read too: the loop's had ``step``/``cursor``, SFT's
``sft_step``/``sft_cursor``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from lego_rl.errors import ConfigError
from lego_rl.runstore.checkpoints import checkpoint_dir, latest_checkpoint, publish_latest
from lego_rl.runstore.events import CheckpointSaved
from lego_rl.runstore.layout import RunDir


class DataCursor(BaseModel):
    """Where a seeded data stream is: epoch ``epoch``'s shuffled order, position ``position`` in it."""

    epoch: int = Field(default=0, ge=0)
    position: int = Field(default=0, ge=0)


class TaskSignalState(BaseModel):
    """Per task: zero-variance groups in a row so far, and the tasks retired (never drawn again)."""

    streaks: dict[str, int] = Field(default_factory=dict)
    retired: list[str] = Field(default_factory=list)


class RlState(BaseModel):
    """The GRPO loop's state after step ``step``."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["rl"] = "rl"
    step: int = Field(ge=0)
    """The last completed step; a resume continues with ``step + 1``."""
    seed: int
    """``train.seed``: the prompt order depends on it, so a resume with another seed is refused."""
    cursor: DataCursor
    """The prompt stream as the last completed step left it."""
    pending: list[str] = Field(default_factory=list)
    """Ids of prompts drawn but not trained when the step ended (groups already launched): redrawn first."""
    task_signal: TaskSignalState = Field(default_factory=TaskSignalState)


class SftState(BaseModel):
    """SFT's state after step ``step``."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["sft"] = "sft"
    step: int = Field(ge=0)
    seed: int
    cursor: DataCursor
    """The demonstration order as the step left it."""


CheckpointState = Annotated[RlState | SftState, Field(discriminator="kind")]
_STATE: TypeAdapter[RlState | SftState] = TypeAdapter(CheckpointState)
S = TypeVar("S", RlState, SftState)
_WRITER = {"rl": "the GRPO loop", "sft": "SFT"}


class CheckpointingTrainer(Protocol):
    """The part of a trainer backend a checkpoint needs (``TrainerBackend`` has it)."""

    def save_checkpoint(self, path: Path, *, extra_state: dict[str, Any]) -> None: ...

    def load_checkpoint(self, path: Path) -> dict[str, Any]: ...


def _legacy(extra: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's ``extra_state`` from before ``kind``, in today's shape (anything else unchanged)."""
    if "kind" in extra:
        return extra
    if "sft_step" in extra:
        return {"kind": "sft", "step": extra["sft_step"], "seed": extra.get("seed", 0),
                "cursor": extra.get("sft_cursor")}
    if "cursor" in extra:
        return {"kind": "rl", **extra, "task_signal": extra.get("task_signal") or {}}
    return extra


def parse_state(extra: dict[str, Any], *, path: Path) -> RlState | SftState:
    """The typed state of the checkpoint at ``path``; a ``ConfigError`` naming the checkpoint when it holds none."""
    try:
        return _STATE.validate_python(_legacy(dict(extra)))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"])) or "(state)"
        raise ConfigError(f"checkpoint {path} holds no usable run state ({where}: {first['msg']}); it was not "
                          "written by lego's training loop or SFT", parameter="train.resume", value=str(path)) from None


def save_checkpoint(run: RunDir, trainer: CheckpointingTrainer, state: RlState | SftState) -> Path:
    """Checkpoint after ``state.step`` into ``checkpoints/step-NNNNNN``, then point ``latest`` at it (only once
    the backend returned: ``latest`` never names a checkpoint still being written) and record the event."""
    path = checkpoint_dir(run.layout.checkpoints, state.step)
    trainer.save_checkpoint(path, extra_state=state.model_dump(mode="json"))
    publish_latest(run.layout.checkpoints, state.step)
    run.events.emit(CheckpointSaved(step=state.step, path=str(path)))
    return path


def resume_checkpoint(run: RunDir, trainer: CheckpointingTrainer, expect: type[S], *, seed: int,
                      check: Callable[[S, Path], None] | None = None) -> S | None:
    """Load the run's newest checkpoint into ``trainer`` and return its state (None: nothing was saved).

    Refused with a ``ConfigError``: a checkpoint of the other kind, one trained with another ``train.seed``
    (the data order would differ), or what ``check`` raises. Only then are the rows of steps after the
    checkpoint set aside (``RunDir.abandon_after``): a refused resume leaves the run directory as it was.
    Without a checkpoint (killed by kill -9, or a second Ctrl-C, before the first one was saved) the run
    starts again from its initial weights, so every step it recorded is set aside the same way: step 0 is
    never written twice into metrics.jsonl."""
    latest = latest_checkpoint(run.layout.checkpoints)
    if latest is None:
        run.abandon_after(None)
        return None
    state = parse_state(trainer.load_checkpoint(latest.path), path=latest.path)
    wanted = expect.model_fields["kind"].default
    if not isinstance(state, expect):
        raise ConfigError(f"checkpoint {latest.path} was not written by {_WRITER[wanted]} (it holds "
                          f"{_WRITER[state.kind]}'s state): resume it the way it was written, or start in a new run "
                          "root",
                          parameter="train.resume", value=str(latest.path))
    if state.seed != seed:
        raise ConfigError(f"checkpoint {latest.path} was trained with train.seed={state.seed}, this run has {seed}: "
                          "the data order would differ", parameter="train.seed", value=seed)
    if check is not None:
        check(state, latest.path)
    run.abandon_after(state.step)
    return state
