"""The metrics contract between writers and views, both ways, by reading the views' source:

* every declared metric is shown by a view of ``lego monitor`` / ``lego report`` (its declaration is named in
  ``lego_rl.monitor``, or a view draws every declared metric a row holds, as the report's other metrics do) or
  says why not (``Metric.hidden``), and a hidden one is not shown after all;
* every catalog name a view or a benchmark uses exists in the catalog (a view cannot name a metric nobody
  declares, so nobody writes: the monitor once read ``staleness*`` while the loop wrote ``policy_lag_*``);
* benchmarks read a row's values through the declarations, never by string.

That every declaration a run kind always writes is in a real run's rows is tests/driver/test_metric_declarations.py
(train, SFT) and tests/driver/test_rollout_rows.py (rollout-check, tasks screen).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import test_metric_contract as contract

import lego_rl
from lego_rl.runstore import metric_catalog as mc

SRC = Path(lego_rl.__file__).parent
VIEWS = SRC / "monitor"
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
CATALOG_ALIASES = {"mc", "metric_catalog"}
"""How a module names ``lego_rl.runstore.metric_catalog``."""

NOT_METRIC_READS = {"routing_replay_bench.py": "a tensor's .values (sort), not a metrics row"}


def catalog_names(source: str) -> set[str]:
    """Every ``mc.NAME`` / ``metric_catalog.NAME`` a module uses."""
    return {node.attr for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id in CATALOG_ALIASES}


def declarations_named(names: set[str]) -> set[mc.Metric]:
    """The declarations behind catalog names: a metric, or each metric of a named collection
    (``CONSISTENCY_BY_SPLIT``)."""
    out: set[mc.Metric] = set()
    for name in names:
        obj = getattr(mc, name, None)
        if isinstance(obj, mc.Metric):
            out.add(obj)
        elif isinstance(obj, dict):
            out |= {m for m in obj.values() if isinstance(m, mc.Metric)}
    return out


def unshown_or_wrongly_hidden(metrics: tuple[mc.Metric, ...], shown: set[mc.Metric]) -> dict[str, str]:
    problems = {}
    for m in metrics:
        if m not in shown and not m.hidden:
            problems[str(m)] = "written but no view shows it and it does not say why (Metric.hidden)"
        elif m in shown and m.hidden:
            problems[str(m)] = f"declared hidden ({m.hidden}) but a view shows it"
    return problems


def _sources(root: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(root.rglob("*.py"))}


def test_the_check_sees_an_unshown_metric_and_a_stale_hidden_reason() -> None:
    unshown = mc.Metric("x_fresh", unit="", kind=mc.GAUGE, group="train", meaning="m", written_by=[mc.TRAIN])
    hidden = mc.Metric("x_hidden", unit="", kind=mc.GAUGE, group="train", meaning="m", written_by=[mc.TRAIN],
                       hidden="an internal check")
    assert unshown_or_wrongly_hidden((unshown, hidden), set()) == {
        "x_fresh": "written but no view shows it and it does not say why (Metric.hidden)"}
    assert unshown_or_wrongly_hidden((unshown, hidden), {unshown, hidden}) == {
        "x_hidden": "declared hidden (an internal check) but a view shows it"}
    assert declarations_named(catalog_names("v = mc.read(r, mc.KL) + len(mc.CONSISTENCY_BY_SPLIT)")) == {
        mc.KL, *mc.CONSISTENCY_BY_SPLIT.values()}
    assert shown_by_views({"a.py": "mc.read(v, mc.KL)"}) == {mc.KL}
    assert shown_by_views({"a.py": "mc.read(v, mc.KL)", "b.py": "mc.declarations_in(v)"}) == set(mc.METRICS)


GENERIC_READERS = {"declarations_in"}
"""Catalog calls of a view that draws every declared metric a row holds (the report's other metrics,
``report_curves.other_metrics``; tests/monitor/test_report_views.py checks it draws them)."""


def shown_by_views(sources: dict[str, str]) -> set[mc.Metric]:
    names = set().union(*map(catalog_names, sources.values()))
    return set(mc.METRICS) if names & GENERIC_READERS else declarations_named(names)


def test_every_written_metric_is_shown_or_deliberately_hidden() -> None:
    assert unshown_or_wrongly_hidden(mc.METRICS, shown_by_views(_sources(VIEWS))) == {}


@pytest.mark.parametrize("where", [VIEWS, BENCHMARKS], ids=["monitor", "benchmarks"])
def test_views_name_only_what_the_catalog_declares(where: Path) -> None:
    unknown = {f: sorted(n for n in catalog_names(src) if not hasattr(mc, n)) for f, src in _sources(where).items()}
    assert not {f: n for f, n in unknown.items() if n}, "names the metric catalog does not declare"
    for f, src in _sources(where).items():
        for m in declarations_named(catalog_names(src)):
            assert m.written_by, f"{f} reads {m}, which no run kind writes"


def _string_indexed_values(source: str) -> list[int]:
    """Lines of ``row["values"]``: a metrics row parsed as plain JSON, its names then read as strings."""
    return [n.lineno for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and n.slice.value == "values"]


def test_benchmarks_read_metrics_through_their_declarations(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(contract, "READERS", (*contract.READERS, "require"))
    found = {f: contract.raw_metric_reads(src) + _string_indexed_values(src)
             for f, src in _sources(BENCHMARKS).items() if f not in NOT_METRIC_READS}
    assert not {f: lines for f, lines in found.items() if lines}, (
        "benchmarks reading metric values by name (lines per file): read them with metric_catalog.read / require")
    assert _string_indexed_values('v = r["values"]["reward_mean"]') == [1]
