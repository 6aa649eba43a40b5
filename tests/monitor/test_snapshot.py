"""Every section's figures checked against the recorded runs' raw lines, computed here independently (plain
json, no monitor code): the events against the trainer's own metrics rows, the task grid against the
rollouts, the stage timings against the stage events."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

from monitor_runs import CHECK, TOY

from lego_rl.monitor.compare import compare
from lego_rl.monitor.drill import detail
from lego_rl.monitor.snapshot import Snapshot, TurnCache, build, search
from lego_rl.monitor.state import RunState


def _raw(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in path.read_text().splitlines()]


def _snap(root: Path, kl_warn: float = 1e-3) -> tuple[RunState, Snapshot]:
    state = RunState(root)
    state.refresh()
    return state, build(state, now=time.time(), kl_warn=kl_warn)


def test_train_run_sections_agree_with_the_metrics_rows_and_events() -> None:
    events, rows = _raw(TOY / "events.jsonl"), _raw(TOY / "metrics.jsonl")
    _, snap = _snap(TOY)
    o, tm, tk, c, p = snap.overview, snap.terminations, snap.tasks, snap.consistency, snap.pipeline
    assert o and tm and tk and c and p
    assert [(pt.step, pt.value) for pt in o.reward] == [(r["step"], r["values"]["reward_mean"]) for r in rows]
    assert [pt.value for pt in o.solve_rate] == [r["values"]["solve_rate"] for r in rows]
    assert o.step == 15 and o.steps_total == 16 and o.weight_version == rows[-1]["values"]["weight_version"]
    assert [pt.value for pt in o.eval_pass_at_1] == [
        e["pass_at_1"] for e in events if e["kind"] == "eval_finished"
    ]
    assert o.in_flight == {} and o.eta_s is None and o.last_error is None
    # the termination mix per step, counted from rollout_finished events, equals what the trainer recorded
    assert [(s.step, s.counts) for s in tm.per_step] == [(r["step"], r["terminations"]) for r in rows]
    finished = [e for e in events if e["kind"] == "rollout_finished"]
    assert sum(t.attempts for t in tk.tasks) == len(finished)
    solved = Counter(
        e["rollout_id"].split("-g")[1].split("-", 1)[1].rsplit("-", 1)[0]
        for e in finished
        if e["reward"] >= 1
    )
    assert {t.instance_id: t.cells.count("✓") for t in tk.tasks if "✓" in t.cells} == dict(solved)
    # a zero-variance group per metrics row count (training steps only)
    assert tk.zero_variance_groups == sum(int(r["values"]["zero_variance_groups"]) for r in rows)
    trained = [r for r in rows if "consistency/k3_kl" in r["values"]]
    assert [s.step for s in c.steps] == [r["step"] for r in trained] and not any(s.warn for s in c.steps)
    assert c.worst[0].overall["k3_kl"] == max(r["values"]["consistency/k3_kl"] for r in trained)
    last = rows[-1]["values"]
    t = last["time_rollout_s"] + last["time_train_s"] + last["time_sync_s"]
    assert abs((p.steps[-1].trainer_idle or 0) - last["time_rollout_s"] / t) < 1e-12


def test_kl_warn_marks_the_steps_above_it() -> None:
    _, snap = _snap(TOY, kl_warn=2.5e-12)
    assert snap.consistency is not None
    assert {s.step for s in snap.consistency.steps if s.warn} == {
        s.step
        for s in snap.consistency.steps
        if max([s.overall["k3_kl"], *(k["k3_kl"] for k in s.by_kind.values())]) > 2.5e-12
    }
    assert 0 < sum(s.warn for s in snap.consistency.steps) < len(snap.consistency.steps)


def test_rollout_check_run_timings_baseline_behaviour_and_drill_down() -> None:
    events = _raw(CHECK / "events.jsonl")
    state, snap = _snap(CHECK)
    assert snap.run.kind == "rollout-check" and snap.run.status == "finished"
    assert snap.overview and snap.overview.baseline == ["lego-example-median: unsolved"]
    stages = {e["stage"]: e["duration_s"] for e in events if e["kind"] == "stage"}
    assert {r.stage: r.p50 for r in snap.timing or []} == stages
    assert all(r.scope == "no step" and r.harness == "claude_code" for r in snap.timing or [])
    [b] = snap.behaviour or []
    assert b.harness == "claude_code" and b.turns_max == 2 and b.tools == {"Bash": 1} and b.records_read == 1
    d = detail(state, "lego-example-median-s0")
    assert d is not None
    assert d.timeline[-1].endswith(
        "finished: completed, reward 1.0, 2 turns: grader: the tests failing at "
        "baseline pass and none regressed"
    )
    assert [t.tools for t in d.turns] == [["Bash"], []]
    assert d.patch and d.patch.startswith("diff --git") and d.grader_log and "SOLVED" in d.grader_log
    assert any("tool_use Bash" in line for line in d.transcript)
    assert detail(state, "no-such-rollout") is None


def test_synthetic_run_infrastructure_failures_examples_and_search(synthetic: Path) -> None:
    events = _raw(synthetic / "events.jsonl")
    state, snap = _snap(synthetic)
    assert snap.terminations is not None
    infra = {
        e["termination"] for e in events if e["kind"] == "rollout_finished" and e["infrastructure_failure"]
    }
    assert set(snap.terminations.infrastructure_reasons) == infra and infra
    for row in snap.terminations.per_step:
        assert row.infrastructure == sum(v for k, v in row.counts.items() if k in infra)
    for reason, items in snap.terminations.examples.items():
        assert 0 < len(items) <= 5 and all(i.termination == reason for i in items)
    cache = TurnCache()
    hits = search(state, "reason:engine_error harness:codex", cache)
    want = [
        e["rollout_id"]
        for e in events
        if e["kind"] == "rollout_finished"
        and e["termination"] == "engine_error"
        and "codex" in next(s["harness"] for s in events if s.get("rollout_id") == e["rollout_id"])
    ]
    assert sorted(h.rollout_id for h in hits) == sorted(want)
    bash = search(state, "tool:bash", cache)
    assert bash
    for hit in bash:  # only rollouts whose turn records hold a Bash call
        d = detail(state, hit.rollout_id)
        assert d is not None and any("Bash" in t.tools for t in d.turns)
    assert search(state, "task:no-such-task", cache) == []


def test_compare_aligns_steps_and_reports_per_task_deltas(synthetic: Path, tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from support.synthetic_run import write_synthetic_run

    other = tmp_path / "b"
    write_synthetic_run(other, steps=30, groups=8, group_size=4, tasks=60, artifacts=0, seed=1)
    a, b = RunState(synthetic), RunState(other)
    a.refresh()
    b.refresh()
    c = compare(a, b, time.time())
    assert [p.step for p in c.reward_a] == [p.step for p in c.reward_b] == list(range(30))
    for d in c.deltas:
        assert d.delta == d.b - d.a == b.tasks[d.instance_id].solve_rate - a.tasks[d.instance_id].solve_rate  # type: ignore[operator]
    assert c.up == sum(d.delta > 0 for d in c.deltas) and c.down == sum(d.delta < 0 for d in c.deltas)
    assert abs(c.deltas[0].delta) == max(abs(d.delta) for d in c.deltas)
    same = compare(a, a, time.time())
    assert same.up == same.down == 0
