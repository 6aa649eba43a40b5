"""runstore.checkpoints: the ``latest`` pointer read and written in one place, precise refusals of a broken
pointer, and a resume's abandoned steps moved out of metrics.jsonl without losing a row."""

from __future__ import annotations

from pathlib import Path

import pytest

from lego_rl.errors import ConfigError
from lego_rl.runstore import RunDir, follow_metrics, read_events
from lego_rl.runstore.checkpoints import (
    checkpoint_dir,
    checkpoints_after,
    latest_checkpoint,
    publish_latest,
    set_aside_abandoned,
)
from lego_rl.runstore.events import StepsAbandoned
from lego_rl.runstore.metrics import StepMetrics


def _row(step: int, loss: float) -> StepMetrics:
    return StepMetrics(step=step, started_at=float(step), finished_at=step + 0.5, values={"loss": loss})


def test_latest_round_trip_and_none_before_the_first_checkpoint(tmp_path: Path) -> None:
    ck = tmp_path / "checkpoints"
    assert latest_checkpoint(ck) is None
    for step in (0, 7, 1234567):
        checkpoint_dir(ck, step).mkdir(parents=True)
        publish_latest(ck, step)
        latest = latest_checkpoint(ck)
        assert latest is not None and latest.step == step and latest.path == checkpoint_dir(ck, step)
    assert (ck / "latest").read_text() == "step-1234567\n"
    assert checkpoint_dir(ck, 7).name == "step-000007"


@pytest.mark.parametrize("text", ["", "step-3", "step-00000x", "../step-000001", "step-000001/..", "latest"])
def test_a_pointer_that_names_no_checkpoint_is_refused_naming_it(tmp_path: Path, text: str) -> None:
    (tmp_path / "latest").write_text(text + "\n")
    with pytest.raises(ConfigError, match="not a checkpoint name like step-000003") as err:
        latest_checkpoint(tmp_path)
    assert str(tmp_path / "latest") in str(err.value) and err.value.parameter == "train.resume"


def test_a_pointer_to_a_missing_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "latest").write_text("step-000004\n")
    with pytest.raises(ConfigError, match=r"names step-000004, but .*step-000004 does not exist"):
        latest_checkpoint(tmp_path)


def test_checkpoints_after_sorts_by_step_and_ignores_foreign_names(tmp_path: Path) -> None:
    for name in ("step-000010", "step-000002", "step-000001", "step-1000000", "step-backup", "notes"):
        (tmp_path / name).mkdir()
    (tmp_path / "step-000009").write_text("a file, not a checkpoint")
    assert checkpoints_after(tmp_path, 1) == ["step-000002", "step-000010", "step-1000000"]
    assert checkpoints_after(tmp_path, 1000000) == []


def test_set_aside_keeps_every_row_and_leaves_only_the_resumed_steps(tmp_path: Path) -> None:
    run = RunDir.open(tmp_path, config={})
    for step, loss in ((0, 1.0), (1, 0.9), (2, 0.8), (3, 0.7)):
        run.metrics.append(_row(step, loss))
    original = run.layout.metrics.read_bytes()
    # A resume from step 1's checkpoint, with the metrics log still open (its handle must not keep writing
    # into the file moved aside).
    assert run.abandon_after(1) == [2, 3]
    run.metrics.append(_row(2, 0.5))
    run.close()
    current = [(r.step, r.values["loss"]) for r in follow_metrics(run.layout.metrics).read()]
    assert current == [(0, 1.0), (1, 0.9), (2, 0.5)]
    assert (tmp_path / "metrics.abandoned-1.jsonl").read_bytes() == original
    marks = [e for e in read_events(run.layout.events) if isinstance(e, StepsAbandoned)]
    assert [(m.resumed_from, m.steps, m.metrics_set_aside) for m in marks] == [(1, [2, 3], "metrics.abandoned-1.jsonl")]

    # A second roll back never overwrites the first's rows; a resume that abandons nothing changes nothing.
    run = RunDir.open(tmp_path, config={}, resume=True)
    assert run.abandon_after(2) == []
    assert run.abandon_after(0) == [1, 2]
    run.close()
    assert (tmp_path / "metrics.abandoned-1.jsonl").read_bytes() == original
    assert [r.step for r in follow_metrics(tmp_path / "metrics.abandoned-2.jsonl").read()] == [0, 1, 2]
    assert [r.step for r in follow_metrics(run.layout.metrics).read()] == [0]


def test_set_aside_of_a_log_with_a_foreign_line_refuses_naming_the_line(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(_row(0, 1.0).model_dump_json() + "\n" + '{"step": "two"}\n')
    before = metrics.read_bytes()
    with pytest.raises(ConfigError, match=r"metrics.jsonl:2 is not a metrics row"):
        set_aside_abandoned(metrics, 0)
    assert metrics.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
    assert set_aside_abandoned(tmp_path / "none.jsonl", 0) is None
