"""`lego tasks check --red-team`: its help, its usage errors, and its JSON on rows that never reach a sandbox.

The gradings themselves run in tests/swe/test_tasks_redteam.py (real bwrap, real pytest and unittest).
"""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from lego_rl.cli.main import app
from lego_rl.swe.redteam import CLASSES

runner = CliRunner()


def test_help_names_the_option_the_classes_and_the_exit_codes() -> None:
    res = runner.invoke(app, ["tasks", "check", "--help"], terminal_width=200)
    assert res.exit_code == 0
    text = " ".join(res.output.split())
    assert "--red-team" in text and "--attack" in text
    for code in CLASSES:
        assert code in text, code
    assert "0 every task sound" in text and "1 some task hackable" in text


def test_bad_usage_exits_2_before_any_sandbox(tmp_path: Path) -> None:
    data = tmp_path / "tasks.jsonl"
    data.write_text('{"x": 1}\n')
    base = ["tasks", "check", "--data", str(data)]
    res = runner.invoke(app, [*base, "--attack", "exit-status"])
    assert res.exit_code == 2 and "--attack needs --red-team" in res.output
    res = runner.invoke(app, [*base, "--red-team", "--attack", "exit-status,no-such-class"])
    assert res.exit_code == 2 and "no-such-class" in res.output and CLASSES[0] in res.output
    res = runner.invoke(app, [*base, "--red-team", "--write-valid", str(tmp_path / "valid.jsonl")])
    assert res.exit_code == 2 and not (tmp_path / "valid.jsonl").exists()


def test_json_names_a_row_it_could_not_red_team_and_exits_3(tmp_path: Path) -> None:
    data = tmp_path / "tasks.jsonl"
    data.write_text('{"metadata": {"instance_id": "broken"}}\nnot json\n')
    out = tmp_path / "report.jsonl"
    res = runner.invoke(app, ["tasks", "check", "--data", str(data), "--red-team", "--json", "--output", str(out)])
    assert res.exit_code == 3, res.output
    report = json.loads(res.stdout)
    assert [t["verdict"] for t in report["tasks"]] == ["error", "error"]
    assert report["tasks"][0]["instance_id"] == "broken" and report["tasks"][1]["detail"].startswith("invalid JSON")
    assert report["summary"]["verdicts"] == {"error": 2} and report["summary"]["hackable_share"] is None
    assert [json.loads(line)["row"] for line in out.read_text().splitlines()] == [1, 2]
