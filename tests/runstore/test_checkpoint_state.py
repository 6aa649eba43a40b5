"""Typed checkpoint state and the one save/resume path: round trip, kinds told apart, seed and caller checks,
old checkpoints read, and a refused resume leaves the run directory as it was."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lego_rl.errors import ConfigError
from lego_rl.runstore import RunDir, StepMetrics, latest_checkpoint, read_events
from lego_rl.runstore.checkpoint_state import (
    DataCursor,
    RlState,
    SftState,
    TaskSignalState,
    parse_state,
    resume_checkpoint,
    save_checkpoint,
)


class JsonTrainer:
    """TEST DOUBLE for a backend's checkpoint half: keeps ``extra_state`` as JSON in the folder, as the real
    backends do (their weights and optimizer state are tested in tests/train; the loop and SFT resume tests
    take this path through the real torch backend)."""

    def __init__(self) -> None:
        self.loaded: list[Path] = []

    def save_checkpoint(self, path: Path, *, extra_state: dict[str, Any]) -> None:
        path.mkdir(parents=True)
        (path / "extra_state.json").write_text(json.dumps(extra_state))

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        self.loaded.append(path)
        return json.loads((path / "extra_state.json").read_text())  # type: ignore[no-any-return]


def _run(root: Path, rows: int = 0) -> RunDir:
    run = RunDir.open(root, config={}, resume=root.exists())
    for step in range(rows):
        run.metrics.append(StepMetrics(step=step, started_at=0.0, finished_at=1.0))
    return run


RL = RlState(step=1, seed=7, cursor=DataCursor(epoch=1, position=3), pending=["a", "b"],
             task_signal=TaskSignalState(streaks={"t": 2}, retired=["u"]))


def test_rl_state_round_trips_publishes_latest_and_sets_aside_later_rows(tmp_path: Path) -> None:
    run, trainer = _run(tmp_path / "run", rows=3), JsonTrainer()
    path = save_checkpoint(run, trainer, RL)
    assert path.name == "step-000001" and latest_checkpoint(run.layout.checkpoints).step == 1  # type: ignore[union-attr]
    assert json.loads((path / "extra_state.json").read_text())["kind"] == "rl"
    assert [e.kind for e in read_events(run.layout.events)][-1] == "checkpoint_saved"
    state = resume_checkpoint(run, trainer, RlState, seed=7)
    assert state == RL and trainer.loaded == [path]
    assert _steps(run) == [0, 1]  # step 2 was abandoned
    run.close()


def _steps(run: RunDir) -> list[int]:
    return [StepMetrics.model_validate_json(line).step for line in run.layout.metrics.read_text().splitlines()]


def test_nothing_saved_resumes_nothing(tmp_path: Path) -> None:
    assert resume_checkpoint(_run(tmp_path / "run"), JsonTrainer(), SftState, seed=0) is None


@pytest.mark.parametrize(("saved", "expect", "needle"), [
    (RL, SftState, "was not written by SFT (it holds the GRPO loop's state)"),
    (SftState(step=0, seed=7, cursor=DataCursor()), RlState, "was not written by the GRPO loop (it holds SFT's"),
])
def test_a_checkpoint_of_the_other_kind_is_refused_and_nothing_is_set_aside(
        tmp_path: Path, saved: RlState | SftState, expect: type[RlState] | type[SftState], needle: str) -> None:
    run, trainer = _run(tmp_path / "run", rows=3), JsonTrainer()
    save_checkpoint(run, trainer, saved)
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        resume_checkpoint(run, trainer, expect, seed=7)
    assert _steps(run) == [0, 1, 2]


def test_another_seed_or_a_failed_caller_check_is_refused_before_anything_moves(tmp_path: Path) -> None:
    run, trainer = _run(tmp_path / "run", rows=3), JsonTrainer()
    save_checkpoint(run, trainer, RL)
    with pytest.raises(ConfigError, match="train.seed=7, this run has 8") as e:
        resume_checkpoint(run, trainer, RlState, seed=8)
    assert e.value.parameter == "train.seed"

    def unknown_prompts(state: RlState, path: Path) -> None:
        raise ConfigError(f"{path} names prompts {state.pending}", parameter="rollout.prompt_data")

    with pytest.raises(ConfigError, match=r"names prompts \['a', 'b'\]"):
        resume_checkpoint(run, trainer, RlState, seed=7, check=unknown_prompts)
    assert _steps(run) == [0, 1, 2]


def test_checkpoints_written_before_kind_are_read(tmp_path: Path) -> None:
    old_rl = {"step": 3, "cursor": {"epoch": 0, "position": 5}, "pending": ["x"], "seed": 1,
              "task_signal": {"streaks": {}, "retired": []}}
    assert parse_state(old_rl, path=tmp_path) == RlState(step=3, seed=1, cursor=DataCursor(position=5), pending=["x"])
    old_sft = {"sft_step": 4, "sft_cursor": {"epoch": 2, "position": 1}, "seed": 1}
    assert parse_state(old_sft, path=tmp_path) == SftState(step=4, seed=1, cursor=DataCursor(epoch=2, position=1))


@pytest.mark.parametrize("extra", [{}, {"step": 1}, {"kind": "rl", "step": -1, "seed": 0, "cursor": {}},
                                   {"kind": "dpo", "step": 1}])
def test_a_checkpoint_without_usable_state_is_an_error_naming_it(tmp_path: Path, extra: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=f"checkpoint {tmp_path} holds no usable run state"):
        parse_state(extra, path=tmp_path)
