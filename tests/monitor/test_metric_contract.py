"""The monitor reads metrics through their declarations (lego_rl.runstore.metric_catalog), and what it shows as
staleness is the policy lag the loop writes.

The regression: the monitor once read ``staleness*`` keys while the loop wrote ``policy_lag_*``, and the
overview said "staleness 0 (synchronous ...)" for a run whose rows said policy_lag_mean 1.0.
"""

from __future__ import annotations

import ast
import time
from pathlib import Path

from rich.console import Console

import lego_rl
from lego_rl.monitor import views
from lego_rl.monitor.snapshot import build
from lego_rl.monitor.state import RunState
from lego_rl.runstore import RunDir, StepMetrics
from lego_rl.runstore import metric_catalog as mc

READERS = ("read", "read_family", "read_all", "declarations_in", "_policy_lag", "_read")
"""The calls a metrics row's ``values`` may be handed to in a reader (``read_all`` and ``declarations_in`` yield
declarations only; ``_policy_lag`` and the audit's ``_read`` read through ``read``)."""


NOT_METRIC_READS = {
    "driver/metrics_sink.py": "the TensorBoard sink files every value of a row, each through its declaration",
    "serving/kv.py": "a tensor's .values, not a metrics row",
    "train/routing_replay.py": "a tensor's .values, not a metrics row",
}
"""Modules whose ``.values`` uses are not reads of a metric by name, and why."""


def _reader_modules() -> list[Path]:
    """Every module of the package (the monitor, the report, ``lego audit``, the SFT summary... read rows
    back), less ``NOT_METRIC_READS``."""
    src = Path(lego_rl.__file__).parent
    return [p for p in sorted(src.rglob("*.py")) if p.relative_to(src).as_posix() not in NOT_METRIC_READS]


def _call_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        f = node.func
        return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    return None


def raw_metric_reads(source: str) -> list[int]:
    """Lines where a row's ``.values`` is used other than by being handed to a declared-metric reader, directly,
    through a conditional expression, or through a local name used only that way."""
    tree = ast.parse(source)
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node

    def handed_to_reader(node: ast.AST) -> bool:
        while isinstance(parents.get(node), ast.IfExp | ast.BoolOp):
            node = parents[node]
        parent = parents.get(node)
        return _call_name(parent) in READERS and node in parent.args  # type: ignore[union-attr]

    def alias_only_read(node: ast.AST) -> bool:
        while isinstance(parents.get(node), ast.IfExp | ast.BoolOp):
            node = parents[node]
        assign = parents.get(node)
        if not (isinstance(assign, ast.Assign) and len(assign.targets) == 1
                and isinstance(assign.targets[0], ast.Name)):
            return False
        name = assign.targets[0].id
        scope = assign
        while not isinstance(scope, ast.FunctionDef | ast.Module):
            scope = parents[scope]
        uses = [n for n in ast.walk(scope) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)]
        return all(handed_to_reader(u) for u in uses)

    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "values" and isinstance(node.ctx, ast.Load):
            if isinstance(parents.get(node), ast.Call) and parents[node].func is node:  # dict.values()
                continue
            if not (handed_to_reader(node) or alias_only_read(node)):
                bad.append(node.lineno)
    return sorted(bad)


def test_the_checker_flags_the_reads_that_drifted() -> None:
    drifted = (
        "def f(last):\n"
        "    return {k: v for k, v in last.metrics.values.items() if k.startswith('staleness')}\n"
        "def g(m):\n"
        "    return m.values.get('policy_lag_mean')\n"
        "def h(agg):\n"
        "    v = agg.metrics.values if agg.metrics else {}\n"
        "    return v.get('time_train_s')\n"
    )
    assert raw_metric_reads(drifted) == [2, 4, 6]
    fine = (
        "def f(agg, m):\n"
        "    v = agg.metrics.values if agg.metrics else {}\n"
        "    return mc.read(v, mc.TIME_TRAIN_S), mc.read_family(m.values, mc.TOKENS_AGE), list(d.values())\n"
    )
    assert raw_metric_reads(fine) == []


def test_metric_values_are_read_only_through_their_declarations() -> None:
    found = {p.name: raw_metric_reads(p.read_text()) for p in _reader_modules()}
    assert not {k: v for k, v in found.items() if v}, (
        f"metric values read by name (lines per file): {found}; read them with metric_catalog.read(values, "
        "<declaration>) so a name nobody writes cannot be read"
    )


def _train_run(root: Path, lag: float) -> Path:
    run = RunDir.open(root, config={"train": {"num_rollout": {"value": 2, "source": "test"}}})
    for step in range(2):
        values = mc.declared_values(mc.TRAIN, {mc.POLICY_LAG_MEAN: lag * step, mc.POLICY_LAG_MAX: lag * step,
                                               mc.REWARD_MEAN: 0.5, mc.TIME_ROLLOUT_S: 1.0})
        run.metrics.append(StepMetrics(step=step, started_at=time.time(), finished_at=time.time(), values=values))
    run.close()
    return root


def test_staleness_shown_is_the_policy_lag_the_loop_wrote(tmp_path: Path) -> None:
    state = RunState(_train_run(tmp_path / "run", lag=1.0))
    state.refresh()
    snap = build(state, now=time.time(), kl_warn=1e-3)
    assert snap.overview is not None and snap.pipeline is not None
    assert snap.overview.staleness == {"policy_lag_mean": 1.0, "policy_lag_max": 1.0}
    assert snap.pipeline.staleness == snap.overview.staleness
    console = Console(width=120, record=True)
    console.print(views.overview(snap, 120))
    text = console.export_text()
    assert "staleness    policy_lag_mean 1.00, policy_lag_max 1.00" in text
    assert "synchronous" not in text


def test_a_run_that_records_no_policy_lag_is_not_called_synchronous(tmp_path: Path) -> None:
    run = RunDir.open(tmp_path / "sft", config={})
    run.metrics.append(StepMetrics(step=0, started_at=0.0, finished_at=1.0,
                                   values=mc.declared_values(mc.SFT, {mc.LOSS: 8.2})))
    run.close()
    state = RunState(tmp_path / "sft")
    state.refresh()
    snap = build(state, now=time.time(), kl_warn=1e-3, sections=["overview"])
    assert snap.overview is not None and snap.overview.staleness == {}
    console = Console(width=120, record=True)
    console.print(views.overview(snap, 120))
    assert "staleness    not recorded by this run" in console.export_text()
