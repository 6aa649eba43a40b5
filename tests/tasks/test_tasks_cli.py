"""`lego tasks prepare` through the real typer app (CliRunner)."""

from __future__ import annotations

import json
from pathlib import Path

from tasks_data import mimo_instance, write_mimo
from typer.testing import CliRunner

from lego_rl.cli.main import app

runner = CliRunner()


def test_prepare_mimo_writes_rows_and_summary(tmp_path: Path) -> None:
    d = write_mimo(tmp_path / "data", [mimo_instance("format-code-task-002661"), mimo_instance("t2")])
    out = tmp_path / "train.jsonl"
    res = runner.invoke(app, ["tasks", "prepare", "--data", str(d), "--output", str(out), "--ids", "format-code-task-002661"])
    assert res.exit_code == 0, res.output
    assert "lego prepare" in res.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["label"] for r in rows] == ["format-code-task-002661"]
    res = runner.invoke(app, ["tasks", "prepare", "--data", str(d), "-o", str(out), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout) == {"output": str(out), "tasks": 2, "images": 2, "bad_rows": []}


def test_bad_rows_write_nothing_unless_skipped(tmp_path: Path) -> None:
    d = write_mimo(tmp_path / "data", [mimo_instance("ok"), mimo_instance("bad", cwd="rel")])
    out = tmp_path / "train.jsonl"
    res = runner.invoke(app, ["tasks", "prepare", "--data", str(d), "-o", str(out)])
    assert res.exit_code == 2 and not out.exists()
    text = " ".join(res.output.split())
    assert "1 bad rows; nothing written" in text and "workdir" in text
    res = runner.invoke(app, ["tasks", "prepare", "--data", str(d), "-o", str(out), "--skip-bad", "--json"])
    assert res.exit_code == 0
    report = json.loads(res.stdout)
    assert report["tasks"] == 1 and report["bad_rows"][0]["row"] == 2
    assert len(out.read_text().splitlines()) == 1


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    d = write_mimo(tmp_path / "data", [mimo_instance("a")])
    for argv, needle in [
        (["--ids", "a,a"], "more than once"),
        (["--ids", "zzz"], "ids not found: zzz"),
        (["--format", "nope"], "not one of"),
        (["--format", "swepro"], "--scripts"),
    ]:
        res = runner.invoke(app, ["tasks", "prepare", "--data", str(d), "-o", str(tmp_path / "x.jsonl"), *argv])
        assert res.exit_code == 2 and needle in " ".join(res.output.split()), (argv, res.output)
    assert not (tmp_path / "x.jsonl").exists()
