"""`lego tasks screen` rolling out itself, end to end through typer: real Claude Code in real bwrap sandboxes,
the real adapter and grader, against the scripted policy (TEST DOUBLE at the model boundary, served over vLLM's
generate route: a random tiny model never solves anything, so it cannot show a band).

The policy fixes `duration` every time, never touches `slugify`, and fixes `median` on every other attempt:
the screen must find them always solved, never solved and kept. A second session in the same run root tops
up only the missing attempts, a third rolls out nothing; the generated dataset's broken rows are named.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, REPO, assert_nothing_running
from support.task_dataset import generate
from test_generate_scripted import WRONG_MEDIAN, write_file_command
from test_rollout_check_cli import engine_thread  # noqa: F401  (the fixture)
from typer.testing import CliRunner

from lego_rl.cli.main import app
from lego_rl.runstore import metric_catalog as mc
from lego_rl.runstore.log import follow_metrics
from support.scripted_engine import tool_call_text

pytestmark = [pytest.mark.slow, pytest.mark.cli, pytest.mark.root]

FIXES = {
    "parse_duration": ("timefmt/duration.py", (EXAMPLES / "src/duration/fix/timefmt/duration.py").read_text()),
    "stats.median": ("stats/center.py", (EXAMPLES / "src/median/fix/stats/center.py").read_text()),
}


class ThreeKindsOfTask:
    """The scripted policy. Claude Code's prompt names the problem statement's file, not the task: the first
    turn reads it, the second acts on the task it names (attempt n of that task), the third answers."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.attempts: Counter[str] = Counter()

    def __call__(self, prompt: str, index: int) -> str:
        if "<tool_response>" not in prompt:
            return tool_call_text("Bash", {"command": "cat /tmp/PROBLEM_STATEMENT.md", "description": "Read it"})
        if any(f"written {path}" in prompt for path, _ in FIXES.values()):
            return "Done."
        if "textkit.slugify" in prompt:
            return "I looked at the code and changed nothing."  # no change: never solved
        task = "stats.median" if "stats.median" in prompt else "parse_duration"
        assert task in prompt, prompt[-2000:]
        with self.lock:
            n = self.attempts[task]
            self.attempts[task] += 1
        path, content = FIXES[task]
        if task == "stats.median" and n % 2:
            content = WRONG_MEDIAN
        return tool_call_text("Bash", {"command": write_file_command(path, content), "description": f"Write {path}"})


def _screen(run_root: Path, url: str, *extra: str) -> Any:
    args = ["tasks", "screen", "-c", "lego.toml", "--vllm-url", url, "--harness", "claude_code", "--json",
            "--concurrency", "3", "--set", f'paths.run_root="{run_root}"', "--set", "adapter.port=0",
            "--set", "model.max_response_tokens=1024", "--set", "agent.time_budget_s=180", *extra]
    return CliRunner().invoke(app, args)


def test_screen_rolls_out_tops_up_and_reuses(engine_thread: Any, toolchain: Any, tmp_path: Path,  # noqa: F811
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    policy = ThreeKindsOfTask()
    engine = engine_thread(policy)
    run_root = tmp_path / "screen"
    out, report = tmp_path / "screened.jsonl", tmp_path / "report.jsonl"
    res = _screen(run_root, engine.url, "-k", "2", "--output", str(out), "--report", str(report))
    got = json.loads(res.stdout)
    assert res.exit_code == 0, ([(t["instance_id"], t["solved"], t["attempts"]) for t in got["tasks"]],
                                got["summary"])
    decisions = {t["instance_id"]: (t["solved"], t["attempts"], t["decision"]) for t in got["tasks"]}
    assert decisions == {"lego-example-duration": (2, 2, "always solved"), "lego-example-median": (1, 2, "kept"),
                         "lego-example-slugify": (0, 2, "never solved")}
    assert got["summary"]["terminations"] == {"completed": 6}
    assert (got["summary"]["reused"], got["summary"]["rolled_out"]) == (0, 6)
    [kept] = out.read_text().splitlines()
    assert kept == next(line for line in (EXAMPLES / "tasks.jsonl").read_text().splitlines() if "median" in line)
    assert [json.loads(line)["decision"] for line in report.read_text().splitlines()] == [
        "always solved", "kept", "never solved"]
    calls = len(engine.engine.calls)
    assert calls == 3 * 2 + 3 * 2 + 2 * 2  # read, write, answer; slugify: read, answer

    # k=3 in the same run root: one more attempt per task, nothing rolled out twice
    res = _screen(run_root, engine.url, "-k", "3")
    assert res.exit_code == 0, (res.output[-3000:], repr(res.exception))
    got = json.loads(res.stdout)
    assert (got["summary"]["reused"], got["summary"]["rolled_out"]) == (6, 3)
    decisions = {t["instance_id"]: (t["solved"], t["decision"]) for t in got["tasks"]}
    assert decisions == {"lego-example-duration": (3, "always solved"), "lego-example-median": (2, "kept"),
                         "lego-example-slugify": (0, "never solved")}
    started = [json.loads(line) for line in (run_root / "events.jsonl").read_text().splitlines()]
    ids = [e["rollout_id"] for e in started if e["kind"] == "rollout_started"]
    assert len(ids) == len(set(ids)) == 9 and {i.rsplit("-", 1)[1] for i in ids} == {"s0", "s1", "s2"}
    assert (run_root / "config.resume-1.json").is_file()
    # One metrics row per session that rolled out, numbered like steps: 6 rollouts, then the 3 of the top-up.
    rows = list(follow_metrics(run_root / "metrics.jsonl").read())
    assert [(r.step, mc.read(r.values, mc.ROLLOUTS)) for r in rows] == [(0, 6.0), (1, 3.0)]
    assert mc.read(rows[0].values, mc.SOLVE_RATE) == pytest.approx(3 / 6)

    # all there: nothing starts (no engine call, no new config), the verdicts are read again
    calls = len(engine.engine.calls)
    res = _screen(run_root, engine.url, "-k", "3")
    assert res.exit_code == 0 and json.loads(res.stdout)["summary"]["rolled_out"] == 0
    assert len(engine.engine.calls) == calls and not (run_root / "config.resume-2.json").exists()

    # another sampling temperature would mix two policies' attempts: refused, naming the key
    res = _screen(run_root, engine.url, "-k", "3", "--set", "rollout.temperature=0.5")
    assert res.exit_code == 2 and "rollout.temperature was 1.0, is 0.5" in " ".join(res.output.split())
    assert_nothing_running()


def test_screen_names_the_generated_datasets_broken_rows(engine_thread: Any, toolchain: Any,  # noqa: F811
                                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One row of each kind the generator breaks, and one good row, against a policy that changes nothing:
    the row whose repository already carries the fix is always solved (screened out, named), the malformed
    rows are named with their reason and never rolled out, every other row is never solved."""
    monkeypatch.chdir(REPO)
    ds = generate(tmp_path / "data", rows=9, broken_each=1)
    engine = engine_thread(lambda prompt, index: "I changed nothing.")
    res = _screen(tmp_path / "screen", engine.url, "-k", "2", "--data", str(ds.path),
                  "--set", f'sandbox.images="{ds.images}"', "--report", str(tmp_path / "report.jsonl"))
    assert res.exit_code == 1, (res.output[-3000:], repr(res.exception))  # nothing in the band
    tasks = {t["row"]: t for t in json.loads(res.stdout)["tasks"]}
    assert sorted(tasks) == sorted(ds.expected)
    for row, kind in ds.expected.items():
        t = tasks[row]
        if kind == "malformed row":
            assert t["decision"] == "bad row" and t["detail"] and t["attempts"] == 0, t
        elif kind == "base passes":
            assert (t["decision"], t["solved"]) == ("always solved", 2), t
        else:
            assert (t["decision"], t["solved"], t["attempts"]) == ("never solved", 0, 2), (kind, t)
    assert sum(t["decision"] == "bad row" for t in tasks.values()) == 3
    assert len(engine.engine.calls) == 2 * 6  # only the six rows that can be rolled out
    assert_nothing_running()


async def test_an_interrupted_screen_is_topped_up_without_rolling_out_twice(
        engine_thread: Any, toolchain: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Cancelled after its first attempt (as SIGTERM does), the session leaves no sandbox behind; the next one
    reuses that attempt, does not count an interrupted rollout, and rolls out only the rest, under fresh ids."""
    from lego_rl.config.resolve import resolve
    from lego_rl.monitor.state import RunState
    from lego_rl.compose.sessions.screen_session import ScreenSession

    monkeypatch.chdir(REPO)
    engine = engine_thread(ThreeKindsOfTask())
    r = resolve(REPO / "lego.toml", environ={}, overrides=[
        'serving.backend="vllm"', f'serving.urls=["{engine.url}"]', f'paths.run_root="{tmp_path / "screen"}"',
        "adapter.port=0", "model.max_response_tokens=1024", "agent.time_budget_s=180"])
    session = ScreenSession(r, k=3, ids=["lego-example-duration"], harness="claude_code")
    first = session.plan().specs
    finished = asyncio.Event()
    work = asyncio.create_task(session.run(first, concurrency=1,
                                           progress=lambda e, spec, res: finished.set() if res else None))
    await finished.wait()
    work.cancel()
    with pytest.raises(asyncio.CancelledError):
        await work
    assert_nothing_running()
    run_root = tmp_path / "screen"
    monitor = RunState(run_root)
    monitor.refresh()
    assert monitor.status(time.time()) == "finished (stopped)"  # lego monitor: not "running"

    again = ScreenSession(r, k=3, ids=["lego-example-duration"], harness="claude_code")
    attempts = again.attempts()
    assert attempts.rewards["lego-example-duration"] == [1.0]
    assert set(attempts.terminations) <= {"completed", "interrupted"}
    planned = again.plan()
    assert planned.reused == 1 and len(planned.specs) == 2
    assert not {s.rollout_id for s in planned.specs} & attempts.started["lego-example-duration"]
    results = await again.run(planned.specs, concurrency=2)
    assert [res.reward for res in results] == [1.0, 1.0]
    [verdict] = again.verdicts()
    assert (verdict.attempts, verdict.solved, verdict.decision) == (3, 3, "always solved")
    assert_nothing_running()
    events = [json.loads(line) for line in (run_root / "events.jsonl").read_text().splitlines()]
    ends = [(e["rollouts"], e["stopped"]) for e in events if e["kind"] == "screen_finished"]
    assert ends[0][1] and ends[0][0] >= 1 and ends[1:] == [(2, False)]
    monitor.refresh()
    assert monitor.status(time.time()) == "finished"
