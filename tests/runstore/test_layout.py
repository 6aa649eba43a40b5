from __future__ import annotations

import json
from pathlib import Path

import pytest

from lego_rl.errors import ConfigError
from lego_rl.runstore import RunDir, read_events, safe_name, write_new
from lego_rl.runstore.events import StageFinished


def test_open_records_config_and_refuses_second_run(tmp_path: Path) -> None:
    run = RunDir.open(tmp_path / "run", config={"a": 1})
    run.events.emit(StageFinished(rollout_id="r1", stage="agent", status="ok", duration_s=1.0))
    run.close()
    assert json.loads((tmp_path / "run" / "config.json").read_text()) == {"a": 1}
    with pytest.raises(ConfigError, match="never overwritten"):
        RunDir.open(tmp_path / "run", config={"a": 2})
    assert json.loads((tmp_path / "run" / "config.json").read_text()) == {"a": 1}


def test_resume_appends_and_keeps_old_config(tmp_path: Path) -> None:
    RunDir.open(tmp_path / "run", config={"a": 1}).close()
    run = RunDir.open(tmp_path / "run", config={"a": 2}, resume=True)
    run.events.emit(StageFinished(rollout_id="r1", stage="agent", status="ok", duration_s=1.0))
    run.close()
    kinds = [e.kind for e in read_events(tmp_path / "run" / "events.jsonl")]
    assert kinds == ["run_started", "run_resumed", "stage"]
    assert json.loads((tmp_path / "run" / "config.resume-1.json").read_text()) == {"a": 2}
    with pytest.raises(ConfigError, match="nothing to resume"):
        RunDir.open(tmp_path / "other", config={}, resume=True)


def test_new_run_log_beside_retained_run(tmp_path: Path) -> None:
    RunDir.open(tmp_path / "run", config={}, run_log=tmp_path / "log1.jsonl").close()
    with pytest.raises(ConfigError):
        RunDir.open(tmp_path / "run2", config={}, run_log=tmp_path / "log1.jsonl")


def test_artifacts_never_overwritten(tmp_path: Path) -> None:
    run = RunDir.open(tmp_path / "run", config={})
    d = run.rollout_dir("task/1#0")
    assert d.name.startswith("task_1_0-h")
    write_new(d / "patch.diff", "x")
    with pytest.raises(FileExistsError):
        write_new(d / "patch.diff", "y")
    assert (d / "patch.diff").read_text() == "x"
    assert not [p for p in d.iterdir() if p.name.endswith(".tmp")]
    with pytest.raises(FileExistsError):
        run.rollout_dir("task/1#0")


def test_torn_last_line_not_yet_an_event(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    log.write_text('{"kind": "run_started", "ts": 1, "root": "r"}\n{"kind": "b"')
    assert [e.kind for e in read_events(log)] == ["run_started"]


def test_safe_name() -> None:
    assert safe_name("../../etc").startswith("_.._etc-h")
    assert safe_name("").startswith("_-h")
    assert safe_name("lego-example-median-s0") == "lego-example-median-s0"


def test_the_run_store_is_the_bottom_layer() -> None:
    """Importing it loads no other lego_rl package than errors and termination (monitor reads only it)."""
    import subprocess
    import sys

    probe = "import sys, lego_rl.runstore; print(sorted(m for m in sys.modules if m.startswith('lego_rl')))"
    loaded = json.loads(
        subprocess.run(
            [sys.executable, "-c", probe], check=True, capture_output=True, text=True
        ).stdout.replace("'", '"')
    )
    outside = [
        m for m in loaded if m != "lego_rl" and m.split(".")[1] not in ("runstore", "errors", "termination")
    ]
    assert outside == [], outside


def test_metrics_rows_go_to_the_runs_metrics_log(tmp_path: Path) -> None:
    from lego_rl.runstore import StepMetrics, follow_metrics

    run = RunDir.open(tmp_path / "run", config={})
    run.metrics.append(StepMetrics(step=0, started_at=1.0, finished_at=2.0, values={"loss": 0.5}))
    run.close()
    assert run.layout.metrics == tmp_path / "run" / "metrics.jsonl"
    assert [row.step for row in follow_metrics(run.layout.metrics).read()] == [0]
