"""`lego tasks screen`: pass rates from recorded rollouts (`--run`), the band, the screened dataset and report;
and, for the screen that rolls out itself, what a session plans, reuses and refuses before any rollout
(tests/rollout/test_tasks_screen_rollouts.py runs it end to end with real Claude Code).

The attempts come from the real recorded `lego train` run of the monitor's tests (first_letter, 8 samples per
prompt) and, where infrastructure failures matter, from the synthetic run (support.synthetic_run, a TEST
DOUBLE for a long coding-agent run: ~8 % of its rollouts are infrastructure failures).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from support.synthetic_run import write_synthetic_run
from typer.testing import CliRunner

from lego_rl.cli.main import app
from lego_rl.tasks.screen import read_attempts, screen

TOY = Path(__file__).resolve().parents[1] / "monitor" / "runs" / "toy-train"
EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples" / "tasks"
EXAMPLE = json.loads((EXAMPLES_DIR / "tasks.jsonl").read_text().splitlines()[0])
runner = CliRunner()


def _dataset(path: Path, ids: list[str]) -> Path:
    lines = []
    for iid in ids:
        row = json.loads(json.dumps(EXAMPLE))
        row["metadata"]["instance_id"] = row["label"] = iid
        lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n")
    return path


def _rewards_by_hand(events: Path) -> dict[str, list[float]]:
    """The policy rewards per task, in log order, read straight from the JSON lines."""
    task: dict[str, str] = {}
    rewards: dict[str, list[float]] = defaultdict(list)
    for line in events.read_text().splitlines():
        e = json.loads(line)
        if e["kind"] == "rollout_started":
            task[e["rollout_id"]] = e["instance_id"]
        elif e["kind"] == "rollout_finished" and not e["infrastructure_failure"] and e["reward"] is not None:
            rewards[task[e["rollout_id"]]].append(e["reward"])
    return rewards


def test_screen_a_recorded_training_run(tmp_path: Path) -> None:
    by_hand = _rewards_by_hand(TOY / "events.jsonl")
    ids = sorted(by_hand) + ["never-attempted"]
    data = _dataset(tmp_path / "tasks.jsonl", ids)
    out, report = tmp_path / "screened.jsonl", tmp_path / "report.jsonl"
    res = runner.invoke(app, ["tasks", "screen", "--data", str(data), "--run", str(TOY), "-k", "8",
                              "--output", str(out), "--report", str(report), "--json"])
    got = json.loads(res.stdout)
    tasks = {t["instance_id"]: t for t in got["tasks"]}
    for iid, rewards in by_hand.items():
        solved = sum(r >= 1.0 for r in rewards[:8])
        want = ("kept" if 1 <= solved <= 7 else "always solved" if solved == 8 else "never solved")
        assert (tasks[iid]["solved"], tasks[iid]["decision"]) == (solved, want), (iid, rewards[:8])
    assert tasks["never-attempted"]["decision"] == "too few attempts"
    kept = [iid for iid in ids if tasks[iid]["decision"] == "kept"]
    assert kept and res.exit_code == 0
    assert [json.loads(line)["metadata"]["instance_id"] for line in out.read_text().splitlines()] == kept
    assert [json.loads(line)["instance_id"] for line in report.read_text().splitlines()] == ids
    assert got["summary"]["terminations"] == {"completed": 544} and got["summary"]["band"] == [1, 7]

    # the last 8 attempts of each task: what the policy does at the end of training
    res = runner.invoke(app, ["tasks", "screen", "--data", str(data), "--run", str(TOY), "-k", "8",
                              "--window", "last", "--json"])
    late = {t["instance_id"]: t["solved"] for t in json.loads(res.stdout)["tasks"]}
    assert all(late[i] == sum(r >= 1.0 for r in by_hand[i][-8:]) for i in by_hand)
    assert late != {t["instance_id"]: t["solved"] for t in got["tasks"]}  # the policy learned in between
    assert runner.invoke(app, ["tasks", "screen", "--data", str(data), "--run", str(TOY), "--window", "middle"]
                         ).exit_code == 2

    # a band nothing fits: exit 1, nothing kept; an empty band is bad usage
    res = runner.invoke(app, ["tasks", "screen", "--data", str(data), "--run", str(TOY), "-k", "8",
                              "--min-solved", "8", "--max-solved", "8", "--json"])
    assert res.exit_code in (0, 1) and json.loads(res.stdout)["summary"]["kept"] == sum(
        sum(r >= 1.0 for r in by_hand[i][:8]) == 8 and len(by_hand[i]) >= 8 for i in by_hand)
    res = runner.invoke(app, ["tasks", "screen", "--data", str(data), "--run", str(TOY), "-k", "4",
                              "--min-solved", "3", "--max-solved", "2"])
    assert res.exit_code == 2 and "band" in res.output
    res = runner.invoke(app, ["tasks", "screen", "--data", str(data), "--run", str(tmp_path / "nothing")])
    assert res.exit_code == 2 and "holds no run" in res.output
    # the options of the screen that rolls out mean nothing to a read-only one, and the reverse
    res = runner.invoke(app, ["tasks", "screen", "--data", str(data), "--run", str(TOY), "--harness", "codex"])
    assert res.exit_code == 2 and "--harness only work(s) when the screen rolls out" in " ".join(res.output.split())
    res = runner.invoke(app, ["tasks", "screen", "--data", str(data), "--window", "last"])
    assert res.exit_code == 2 and "--window last reads a training run" in res.output


def test_infrastructure_failures_are_not_attempts(tmp_path: Path) -> None:
    write_synthetic_run(tmp_path / "run", steps=30, groups=4, group_size=4, tasks=20, artifacts=0)
    attempts = read_attempts([tmp_path / "run"])
    assert sum(attempts.infrastructure.values()) > 0  # the double does lose rollouts to the infrastructure
    by_hand = _rewards_by_hand(tmp_path / "run" / "events.jsonl")
    assert dict(attempts.rewards) == dict(by_hand)
    verdicts = {v.instance_id: v for v in screen(sorted(by_hand), attempts, k=4)}
    for iid, v in verdicts.items():
        assert v.attempts == min(4, len(by_hand[iid]))
        assert v.infrastructure_failures == attempts.infrastructure.get(iid, 0)
    # two runs read in order: the second one's attempts come after the first one's
    both = read_attempts([tmp_path / "run", tmp_path / "run"])
    assert all(both.rewards[i] == by_hand[i] * 2 for i in by_hand)


# -- screening that rolls out itself: what it plans, reuses and refuses (no engine, no sandbox) -------------


def _session_config(tmp_path: Path, data: Path, run_root: Path, *overrides: str) -> Any:
    from lego_rl.config.resolve import resolve

    return resolve(None, environ={}, overrides=[
        f'rollout.prompt_data="{data}"', f'paths.run_root="{run_root}"',
        f'sandbox.images="{EXAMPLES_DIR / "images.json"}"', *overrides])


def _examples_dataset(path: Path, ids: list[str]) -> Path:
    """Rows of the example tasks (their archives copied beside ``path``), one per id."""
    import shutil

    (path.parent / "repos").mkdir(parents=True, exist_ok=True)
    lines = []
    for iid in ids:
        row = json.loads(json.dumps(EXAMPLE))
        row["metadata"]["instance_id"] = row["label"] = iid
        lines.append(json.dumps(row))
    shutil.copy(EXAMPLES_DIR / EXAMPLE["metadata"]["repo_archive"], path.parent / EXAMPLE["metadata"]["repo_archive"])
    path.write_text("\n".join(lines) + "\n")
    return path


def _log(run_root: Path, config: dict[str, Any], outcomes: list[tuple[str, str, float | None]]) -> None:
    """A run directory holding ``(rollout_id, instance_id, reward)`` outcomes (None: an infrastructure
    failure; the rollout id ``...-killed`` is started and never finished, as under SIGKILL)."""
    from lego_rl.runstore import RunDir
    from lego_rl.runstore.events import RolloutFinished, RolloutStarted
    from lego_rl.termination import TerminationReason

    run = RunDir.open(run_root, config=config)
    for rid, iid, reward in outcomes:
        run.events.emit(RolloutStarted(rollout_id=rid, instance_id=iid, harness="claude_code"))
        run.rollout_dir(rid)
        if rid.endswith("-killed"):
            continue
        infra = reward is None
        run.events.emit(RolloutFinished(
            rollout_id=rid, reward=reward, infrastructure_failure=infra,
            termination=TerminationReason.SANDBOX_SETUP if infra else TerminationReason.COMPLETED))
    run.close()


def test_a_second_session_tops_up_only_what_is_missing(tmp_path: Path) -> None:
    from lego_rl.config.resolve import config_json
    from lego_rl.compose.sessions.screen_session import ScreenSession

    data = _examples_dataset(tmp_path / "data" / "tasks.jsonl", ["a", "b", "c", "d"])
    run_root = tmp_path / "run"
    r = _session_config(tmp_path, data, run_root)
    fresh = ScreenSession(r, k=3).plan()
    assert fresh.reused == 0 and [(s.rollout_id, s.group_index, s.index) for s in fresh.specs] == [
        (f"{t}-s{i}", g, i) for g, t in enumerate("abcd") for i in range(3)]
    assert not run_root.exists()  # planning writes nothing

    _log(run_root, config_json(r), [
        ("a-s0", "a", 1.0), ("a-s1", "a", 0.0), ("a-s2", "a", 0.0),  # complete
        ("b-s0", "b", 1.0), ("b-s1", "b", None), ("b-killed", "b", None),  # one attempt, two lost
        ("c-s0", "c", 0.0), ("c-s1", "c", 0.0), ("c-s2", "c", 1.0), ("c-s3", "c", 1.0),  # more than k
    ])
    session = ScreenSession(r, k=3)
    planned = session.plan()
    assert planned.reused == 3 + 1 + 3
    # b: 2 more, numbered past every id it used (b-s1 failed in the infrastructure: no attempt, id taken);
    # d: nothing yet
    assert [s.rollout_id for s in planned.specs] == ["b-s2", "b-s3", "d-s0", "d-s1", "d-s2"]
    assert {s.row.metadata.instance_id for s in planned.specs} == {"b", "d"}
    verdicts = {v.instance_id: v for v in session.verdicts()}
    assert [(v.instance_id, v.row) for v in verdicts.values()] == [("a", 1), ("b", 2), ("c", 3), ("d", 4)]
    assert verdicts["a"].decision == "kept" and verdicts["c"].decision == "kept"  # c by its first 3
    assert verdicts["b"].decision == "too few attempts"
    assert verdicts["b"].infrastructure_reasons == {"sandbox_setup": 1}
    # a harness for every task is carried by the specs
    assert {s.row.metadata.agent for s in ScreenSession(r, k=3, harness="codex").plan().specs} == {"codex"}
    assert ScreenSession(r, k=3, ids=["a", "c"]).plan().specs == []


def test_a_directory_of_another_policy_or_of_training_is_refused(tmp_path: Path) -> None:
    import pytest

    from lego_rl.config.resolve import config_json
    from lego_rl.errors import ConfigError
    from lego_rl.compose.sessions.screen_session import ScreenSession

    data = _examples_dataset(tmp_path / "data" / "tasks.jsonl", ["a"])
    run_root = tmp_path / "run"
    _log(run_root, config_json(_session_config(tmp_path, data, run_root)), [("a-s0", "a", 1.0)])
    hotter = _session_config(tmp_path, data, run_root, "rollout.temperature=0.7")
    with pytest.raises(ConfigError, match=r"rollout.temperature was 1.0, is 0.7"):
        ScreenSession(hotter, k=2)
    # what does not change the policy (how many rollouts run at once) is fine
    assert ScreenSession(_session_config(tmp_path, data, run_root, "rollout.concurrency=2"), k=2).plan().reused == 1
    # a screening session's own metrics row (driver.rollout_rows) does not make it a training run ...
    from lego_rl.runstore import StepMetrics
    from lego_rl.runstore import metric_catalog as mc
    from lego_rl.runstore.log import MetricsLog

    log = MetricsLog(run_root / "metrics.jsonl")
    log.append(StepMetrics(step=0, started_at=0.0, finished_at=1.0,
                           values=mc.declared_values(mc.TASKS_SCREEN, {mc.ROLLOUTS: 1.0})))
    assert ScreenSession(_session_config(tmp_path, data, run_root), k=2).plan().reused == 1
    # ... a training step's row does: its rollouts came from weights that changed
    log.append(StepMetrics(step=1, started_at=1.0, finished_at=2.0,
                           values=mc.declared_values(mc.TRAIN, {mc.WEIGHT_VERSION: 1.0})))
    log.close()
    with pytest.raises(ConfigError, match="is a training run"):
        ScreenSession(_session_config(tmp_path, data, run_root), k=2)


def test_rows_that_cannot_be_rolled_out_are_named_and_skipped(tmp_path: Path) -> None:
    from lego_rl.compose.sessions.screen_session import ScreenSession

    data = _examples_dataset(tmp_path / "data" / "tasks.jsonl", ["good", "no-archive", "no-image"])
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    rows[1]["metadata"]["repo_archive"] = "repos/absent.tar.gz"
    rows[2]["metadata"]["image"] = "nowhere:1"
    no_cmd = json.loads(json.dumps(rows[0]))
    no_cmd["metadata"]["instance_id"] = "no-eval-cmd"
    del no_cmd["metadata"]["eval_cmd"]
    data.write_text("\n".join([json.dumps(rows[0]), "{not json", json.dumps(rows[1]), json.dumps(rows[2]),
                               json.dumps(no_cmd), json.dumps(rows[0])]) + "\n")
    session = ScreenSession(_session_config(tmp_path, data, tmp_path / "run"), k=2)
    assert [r.metadata.instance_id for r in session.rows] == ["good"]
    assert {s.row.metadata.instance_id for s in session.plan().specs} == {"good"}
    bad = {b.row: b for b in session.bad}
    assert sorted(bad) == [2, 3, 4, 5, 6]
    assert "JSON" in bad[2].reason
    assert bad[3].instance_id == "no-archive" and "absent.tar.gz does not exist" in bad[3].reason
    assert bad[4].instance_id == "no-image" and "'nowhere:1' is not in" in bad[4].reason
    assert "eval_cmd" in bad[5].reason
    assert "duplicate" in bad[6].reason
    verdicts = session.verdicts()
    assert [(v.row, v.decision) for v in verdicts if v.decision == "bad row"] == [(n, "bad row") for n in bad]
    assert all(v.detail == bad[v.row].reason for v in verdicts if v.row in bad)
