"""`lego monitor --once / --json` through typer against the recorded runs and broken copies of them: every
view printed, the JSON equal to the snapshot, broken files as notes (exit 0, no traceback), bad arguments
as exit 2 naming the path. One slow test records a fresh `lego train` run and reads it back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from monitor_runs import CHECK, TOY
from typer.testing import CliRunner

from lego_rl.cli.main import app
from lego_rl.monitor.views import VIEWS

runner = CliRunner()
TITLES = [title for _, section, title in VIEWS if section != "compare"]


def _ok(args: list[str]) -> str:
    res = runner.invoke(app, ["monitor", *args], env={"COLUMNS": "160"})
    assert res.exit_code == 0, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    return res.output


def test_once_prints_every_view_of_a_finished_train_run() -> None:
    text = _ok([str(TOY), "--once"])
    for title in TITLES:
        assert f" {title} " in text, title
    assert "finished (completed)" in text and "steps done 16/16 (last: step 15)" in text
    assert "24 tasks; zero-variance groups" in text and "worst steps by k3 KL" in text
    # the Curves view whole (the terminal shows its top; its lower panels scroll into the window)
    assert "consistency per turn kind (rollout vs trainer)" in text and "termination mix (share of" in text
    assert max(len(line) for line in text.splitlines()) <= 500  # off a terminal: 160-column rules, no 100k ones


def test_json_is_the_snapshot_with_the_opened_rollout_and_a_search() -> None:
    data = json.loads(
        _ok([str(CHECK), "--json", "--rollout", "lego-example-median-s0", "--search", "tool:Bash"])
    )
    assert data["run"]["kind"] == "rollout-check" and data["run"]["status"] == "finished"
    assert set(data) >= {
        "overview",
        "terminations",
        "timing",
        "tasks",
        "consistency",
        "behaviour",
        "pipeline",
        "rollouts",
        "rollout",
    }
    assert [r["rollout_id"] for r in data["rollouts"]] == ["lego-example-median-s0"]
    assert data["rollout"]["patch"].startswith("diff --git")
    assert data["terminations"]["totals"] == {"completed": 1}
    missing = json.loads(_ok([str(CHECK), "--json", "--rollout", "nope"]))
    assert missing["rollout"] is None


def test_compare_view_and_json(copy_run: Callable[[Path], Path]) -> None:
    other = copy_run(TOY)
    text = _ok([str(TOY), "--once", "--compare", str(other)])
    assert " Compare " in text and "24 tasks in both; up 0, down 0" in text
    data = json.loads(_ok([str(TOY), "--json", "--compare", str(other)]))
    assert data["compare"]["b"] == str(other) and all(d["delta"] == 0 for d in data["compare"]["deltas"])


@pytest.mark.parametrize(
    "damage", ["torn-tail", "garbage-line", "no-metrics", "no-events", "empty-files", "truncated-config"]
)
def test_a_damaged_run_gives_notes_never_a_traceback(damage: str, copy_run: Callable[[Path], Path]) -> None:
    root = copy_run(TOY)
    events = root / "events.jsonl"
    if damage == "torn-tail":
        data = events.read_bytes()
        events.write_bytes(data[: len(data) // 2 + 7])
    elif damage == "garbage-line":
        with events.open("ab") as fh:
            fh.write(b'{"kind":"no_such_kind"}\n\xff\xfe\n')
    elif damage == "no-metrics":
        (root / "metrics.jsonl").unlink()
    elif damage == "no-events":
        events.unlink()
    elif damage == "empty-files":
        events.write_bytes(b"")
        (root / "metrics.jsonl").write_bytes(b"")
    else:
        (root / "config.json").write_text('{"model": ')
    text = _ok([str(root), "--once"])
    data = json.loads(_ok([str(root), "--json"]))
    notes = " ".join(n["text"] for n in data["notes"])
    expect = {
        "torn-tail": "incomplete line",
        "garbage-line": "events.jsonl:1128: not a valid record",
        "no-metrics": "metrics.jsonl does not exist yet",
        "no-events": "events.jsonl does not exist (yet)",
        "empty-files": "waiting for the run to write",
        "truncated-config": "config.json: not readable as JSON",
    }
    assert expect[damage] in notes, notes
    assert expect[damage] in " ".join(text.split())


def test_bad_arguments_exit_2_naming_the_path(tmp_path: Path) -> None:
    res = runner.invoke(app, ["monitor", str(tmp_path / "nope"), "--once"])
    assert res.exit_code == 2 and f"RUN_DIR {tmp_path / 'nope'} is not a directory" in " ".join(
        res.output.split()
    )
    res = runner.invoke(app, ["monitor", str(TOY), "--once", "--compare", str(tmp_path / "other")])
    assert res.exit_code == 2 and "--compare" in res.output
    res = runner.invoke(app, ["monitor", str(TOY), "--once", "--set", "monitor.refresh_s=0"])
    assert res.exit_code == 2 and "monitor.refresh_s" in res.output


@pytest.mark.slow
def test_a_freshly_recorded_train_run_reads_back(tmp_path: Path) -> None:
    """The recording in runs/ may age: record a new run with today's `lego train` and read it back."""
    from lego_rl.driver.toy_env import make_rows

    (tmp_path / "toy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in make_rows(8)))
    (tmp_path / "lego.toml").write_text(
        '[serving]\ndevice = "cpu"\nport = 0\n[sandbox]\nprovider = "bwrap"\n[rollout]\nprompt_data = "toy.jsonl"\nbatch_size = 2\n'
        'samples_per_prompt = 4\ntop_p = 1.0\n[train]\nenvironment = "first_letter"\nnum_rollout = 3\n'
        '[paths]\nrun_root = "runs/toy"\n'
    )
    lego = str(Path(sys.executable).with_name("lego"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEGO_", "RUN_", "HF_", "DATA_ROOT"))}
    subprocess.run(
        [lego, "train", "-c", "lego.toml", "--json"],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
        timeout=600,
    )
    out = subprocess.run(
        [lego, "monitor", "runs/toy", "--json"],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    data = json.loads(out)
    rows = [json.loads(x) for x in (tmp_path / "runs/toy/metrics.jsonl").read_text().splitlines()]
    assert data["run"]["status"] == "finished (completed)" and data["overview"]["step"] == 2
    assert [p["value"] for p in data["overview"]["reward"]] == [r["values"]["reward_mean"] for r in rows]
    assert [s["counts"] for s in data["terminations"]["per_step"]] == [r["terminations"] for r in rows]
