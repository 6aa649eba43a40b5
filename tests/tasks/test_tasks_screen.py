"""`lego tasks screen --run`: pass rates from recorded rollouts, the band, the screened dataset and report.

The attempts come from the real recorded `lego train` run of the monitor's tests (first_letter, 8 samples per
prompt) and, where infrastructure failures matter, from the synthetic run (support.synthetic_run, a TEST
DOUBLE for a long coding-agent run: ~8 % of its rollouts are infrastructure failures).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from support.synthetic_run import write_synthetic_run
from typer.testing import CliRunner

from lego_rl.cli.main import app
from lego_rl.tasks.screen import read_attempts, screen

TOY = Path(__file__).resolve().parents[1] / "monitor" / "runs" / "toy-train"
EXAMPLE = json.loads((Path(__file__).resolve().parents[2] / "examples" / "tasks" / "tasks.jsonl").read_text()
                     .splitlines()[0])
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
