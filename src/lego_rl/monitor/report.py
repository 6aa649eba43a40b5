"""``lego report RUN_DIR --html OUT``: the monitor's views as one self-contained HTML file.

Everything is inline (CSS, SVG drawn by ``monitor.svg``), nothing is fetched: the file opens offline, can be
mailed or attached to an issue. Same data as ``lego monitor --json`` (one ``Snapshot``), drawn as plots and
tables: reward and solve-rate curves, termination stacks, stage timings, the task grid, consistency over
steps, where the step time went, behaviour per harness, and a comparison when a second run is given.
"""

from __future__ import annotations

import time
from html import escape
from pathlib import Path

from lego_rl.monitor.compare import Comparison, compare
from lego_rl.monitor.snapshot import SECTIONS, STAGE_ORDER, STOPPED_SIGNAL, Snapshot, build, quantile
from lego_rl.monitor.state import RunState
from lego_rl.monitor.svg import line_chart, stacked_bars
from lego_rl.runstore import write_new

GRID_TASKS = 2000
"""Tasks drawn in the grid (the rest are counted): a grid of 2,000 rows is already 60k cells."""
CELL = 9
OUTCOME_COLOUR = {"✓": "#2ca02c", "·": "#d62728", "✗": "#f0b400"}
INFRA_COLOURS = ("#f0b400", "#e6a000", "#ffd24d", "#c98a00", "#ffe699", "#b37700")
POLICY_COLOURS = ("#1f77b4", "#6baed6", "#2ca02c", "#9467bd", "#17becf", "#08519c")

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:20px} h2{font-size:17px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:32px}
table{border-collapse:collapse;margin:8px 0} td,th{border:1px solid #ddd;padding:2px 8px;text-align:right}
th{background:#f4f4f4} td.l,th.l{text-align:left} .warn{background:#fde2e2} .note-error{color:#b00}
.note-warn{color:#a60} .note-info{color:#666} .empty{color:#888;font-style:italic} nav a{margin-right:10px}
pre{background:#f7f7f7;padding:6px;overflow:auto;max-height:240px}
"""


def _table(head: list[str], rows: list[list[str]], left: int = 1, classes: list[str] | None = None) -> str:
    th = "".join(f'<th class="{"l" if i < left else ""}">{escape(h)}</th>' for i, h in enumerate(head))
    body = []
    for n, row in enumerate(rows):
        cls = f' class="{classes[n]}"' if classes and classes[n] else ""
        body.append(
            f"<tr{cls}>"
            + "".join(f'<td class="{"l" if i < left else ""}">{escape(c)}</td>' for i, c in enumerate(row))
            + "</tr>"
        )
    return f"<table><tr>{th}</tr>{''.join(body)}</table>"


def _f(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def _overview(s: Snapshot) -> str:
    o = s.overview
    assert o is not None
    curves = line_chart(
        "reward and solve rate per step",
        {
            "reward mean": [(p.step, p.value) for p in o.reward],
            "solve rate": [(p.step, p.value) for p in o.solve_rate],
            "eval pass@1": [(p.step, p.value) for p in o.eval_pass_at_1],
        },
    )
    facts = [
        [
            "latest step",
            "-" if o.step is None else f"{o.step}" + (f" of {o.steps_total}" if o.steps_total else ""),
        ],
        ["weight version", "-" if o.weight_version is None else str(o.weight_version)],
        ["rollouts finished", str(o.rollouts_finished)],
        ["in flight", ", ".join(f"{k} {v}" for k, v in o.in_flight.items()) or "none"],
        ["rollouts / min", _f(o.rollouts_per_min, ".1f")],
        ["trained tokens / s", _f(o.trained_tokens_per_s, ",.0f")],
        ["suspect patches", f"{sum(p.value for p in o.suspect_patches):.0f} (per step: "
         + ", ".join(f"{p.step}: {p.value:.0f}" for p in o.suspect_patches) + ")" if o.suspect_patches else "none"],
        ["last error", o.last_error or "none"],
    ] + [["baseline", b] for b in o.baseline]
    return curves + _table(["", ""], facts)


def _terminations(s: Snapshot) -> str:
    tm = s.terminations
    assert tm is not None
    reasons = sorted(tm.totals, key=lambda r: (r in tm.infrastructure_reasons, r))
    colours, p, i = {}, 0, 0
    for r in reasons:
        if r in tm.infrastructure_reasons:
            colours[r] = INFRA_COLOURS[i % len(INFRA_COLOURS)]
            i += 1
        else:
            colours[r] = POLICY_COLOURS[p % len(POLICY_COLOURS)]
            p += 1
    chart = stacked_bars(
        "terminations per step (infrastructure reasons in yellow)",
        [r.step for r in tm.per_step],
        {r: [float(row.counts.get(r, 0)) for row in tm.per_step] for r in reasons},
        colours=colours,
    )
    totals = _table(
        ["reason", "family", "rollouts"],
        [
            [r, "infrastructure" if r in tm.infrastructure_reasons else "policy", str(tm.totals[r])]
            for r in reasons
        ],
        left=2,
    )
    examples = _table(
        ["reason", "rollout", "task", "harness", "detail"],
        [
            [r, b.rollout_id, b.instance_id, b.harness, b.detail[:160]]
            for r, items in tm.examples.items()
            for b in items[:3]
        ],
        left=5,
    )
    return chart + totals + "<h3>latest examples</h3>" + examples


def _timing(s: Snapshot, state: RunState) -> str:
    merged: dict[str, dict[int, list[float]]] = {}  # stage → step → seconds, all harnesses together
    for (step, _, stage), times in state.stage_times.items():
        if step is not None:
            merged.setdefault(stage, {}).setdefault(step, []).extend(times)
    order = {name: i for i, name in enumerate(STAGE_ORDER)}
    per_stage = {
        stage: [(float(step), quantile(sorted(times), 0.5)) for step, times in sorted(by_step.items())]
        for stage, by_step in sorted(merged.items(), key=lambda kv: (order.get(kv[0], 99), kv[0]))
    }
    chart = line_chart("stage p50 seconds per step (all harnesses)", per_stage, log=True) if per_stage else ""
    rows = [
        [t.scope, t.harness, t.stage, str(t.n), f"{t.p50:.2f}", f"{t.p90:.2f}", f"{t.max:.2f}"]
        for t in s.timing or []
        if not t.scope.startswith("step ")
    ]
    table = _table(["scope", "harness", "stage", "n", "p50 s", "p90 s", "max s"], rows, left=3)
    return chart + (table if rows else '<p class="empty">no stage timings</p>')


def _tasks(s: Snapshot) -> str:
    tk = s.tasks
    assert tk is not None
    if not tk.tasks:
        return '<p class="empty">no finished rollouts</p>'
    shown = tk.tasks[:GRID_TASKS]
    cols = max(t.attempts for t in shown)
    name_w = 7 * min(40, max(len(t.instance_id) for t in shown)) + 60
    w, h = name_w + cols * CELL + 10, len(shown) * CELL + 20
    opening = (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" '
        'role="img" aria-label="task grid" font-size="8">'
    )
    parts = [opening]
    for row_i, t in enumerate(shown):
        y = 10 + row_i * CELL
        rate = "-" if t.solve_rate is None else f"{t.solve_rate:.0%}"
        mark = " ∅" if t.zero_variance_groups else ""
        if t.zero_variance_streak >= STOPPED_SIGNAL:
            mark += f" ∅×{t.zero_variance_streak} in a row"
        if t.retired:
            mark += " retired"
        parts.append(f'<text x="0" y="{y + 7}">{escape(t.instance_id[:40])} {rate}{mark}</text>')
        parts.extend(
            f'<rect x="{name_w + j * CELL}" y="{y}" width="{CELL - 1}" height="{CELL - 1}" '
            f'fill="{OUTCOME_COLOUR.get(c, "#999")}"/>'
            for j, c in enumerate(t.cells)
        )
    parts.append("</svg>")
    head = (
        f"<p>{len(tk.tasks)} tasks; zero-variance groups (no GRPO signal, marked ∅): "
        f"{tk.zero_variance_groups} of {tk.groups}; stopped carrying signal (∅×n: their last n ≥ "
        f"{STOPPED_SIGNAL} groups in a row): {tk.stopped_signal}; retired by the trainer: {len(tk.retired)}. "
        "Cells: green solved, red failed, yellow infrastructure, oldest first.</p>"
    )
    more = f"<p>{len(tk.tasks) - len(shown)} more tasks not drawn.</p>" if len(tk.tasks) > len(shown) else ""
    return head + "\n".join(parts) + more


def _consistency(s: Snapshot) -> str:
    c = s.consistency
    assert c is not None
    if not c.steps:
        return f'<p class="empty">{escape(c.note)}</p>'
    kl = {"overall": [(float(x.step), x.overall["k3_kl"]) for x in c.steps if "k3_kl" in x.overall]}
    for kind in sorted({k for x in c.steps for k in x.by_kind}):
        kl[kind] = [
            (float(x.step), x.by_kind[kind]["k3_kl"]) for x in c.steps if "k3_kl" in x.by_kind.get(kind, {})
        ]
    chart = line_chart(
        f"k3 KL per step (dashed: monitor.kl_warn = {c.kl_warn:g})", kl, log=True, hline=c.kl_warn
    )
    pearson = line_chart(
        "Pearson (rollout vs trainer log-probs) per step",
        {"pearson": [(float(x.step), x.overall["pearson"]) for x in c.steps if "pearson" in x.overall]},
    )
    rows = [
        [
            str(x.step),
            _f(x.overall.get("pearson"), ".5f"),
            _f(x.overall.get("mean_abs_diff"), ".2e"),
            _f(x.overall.get("p99_abs_diff"), ".2e"),
            _f(x.overall.get("k3_kl"), ".2e"),
        ]
        for x in c.worst
    ]
    worst = _table(
        ["step", "pearson", "mean |Δ|", "p99 |Δ|", "k3 KL"],
        rows,
        left=0,
        classes=["warn" if x.warn else "" for x in c.worst],
    )
    return chart + pearson + "<h3>worst steps</h3>" + worst + f"<p>{escape(c.note)}</p>"


def _pipeline(s: Snapshot) -> str:
    p = s.pipeline
    assert p is not None
    if not p.steps:
        return '<p class="empty">no finished step</p>'
    chart = stacked_bars(
        "seconds per step: rollouts, train, sync",
        [x.step for x in p.steps],
        {
            "rollouts": [x.time_rollout_s or 0.0 for x in p.steps],
            "train": [x.time_train_s or 0.0 for x in p.steps],
            "sync": [x.time_sync_s or 0.0 for x in p.steps],
        },
    )
    return chart + f"<p>bottleneck over the last 5 steps: {escape(p.bottleneck or '-')}</p>"


def _behaviour(s: Snapshot) -> str:
    rows = [
        [
            b.harness,
            str(b.rollouts),
            f"{b.turns_mean:.1f}",
            f"{b.turns_p50:.0f}",
            f"{b.turns_p90:.0f}",
            str(b.turns_max),
            " ".join(f"{k}:{v}" for k, v in b.turns_histogram.items()),
            ", ".join(f"{k} {v}" for k, v in b.tools.items()) or "-",
            _f(b.tool_calls_per_turn, ".2f"),
        ]
        for b in s.behaviour or []
    ]
    return (
        _table(
            [
                "harness",
                "rollouts",
                "turns mean",
                "p50",
                "p90",
                "max",
                "turns histogram",
                "tools",
                "calls/turn",
            ],
            rows,
            left=1,
        )
        if rows
        else '<p class="empty">no finished rollouts</p>'
    )


def _compare(c: Comparison) -> str:
    chart = line_chart(
        "reward per step, A vs B",
        {
            "A reward": [(p.step, p.value) for p in c.reward_a],
            "B reward": [(p.step, p.value) for p in c.reward_b],
        },
    )
    rows = [[d.instance_id, f"{d.a:.2f}", f"{d.b:.2f}", f"{d.delta:+.2f}"] for d in c.deltas[:50]]
    return (
        f"<p>A = {escape(c.a)}<br>B = {escape(c.b)}</p>"
        + chart
        + f"<p>{len(c.deltas)} tasks in both: {c.up} up, {c.down} down</p>"
        + _table(["task", "A", "B", "B - A"], rows)
    )


def render_html(state: RunState, snap: Snapshot, comparison: Comparison | None = None) -> str:
    parts = [
        ("overview", "Overview", _overview(snap)),
        ("terminations", "Terminations", _terminations(snap)),
        ("timing", "Stage timing", _timing(snap, state)),
        ("tasks", "Tasks", _tasks(snap)),
        ("consistency", "Consistency", _consistency(snap)),
        ("pipeline", "Pipeline", _pipeline(snap)),
        ("behaviour", "Behaviour", _behaviour(snap)),
    ]
    if comparison is not None:
        parts.append(("compare", "Compare", _compare(comparison)))
    notes = "".join(
        f'<li class="note-{escape(n.level)}">{escape(n.level)}: {escape(n.text)}</li>' for n in snap.notes
    )
    nav = "".join(f'<a href="#{sid}">{title}</a>' for sid, title, _ in parts)
    body = "".join(f'<section id="{sid}"><h2>{title}</h2>{html}</section>' for sid, title, html in parts)
    made = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>lego report: '
        f"{escape(snap.run.root)}</title><style>{CSS}</style></head><body>"
        f"<h1>lego report: {escape(snap.run.root)}</h1>"
        f"<p>{escape(snap.run.kind)} run, {escape(snap.run.status)}; {snap.run.events_read:,} events, "
        f"{snap.run.metrics_rows} metrics rows; written {made}</p>"
        f"<ul>{notes}</ul><nav>{nav}</nav>{body}</body></html>"
    )


def write_report(root: Path, out: Path, *, kl_warn: float, other: Path | None = None) -> Path:
    """Read the run (and ``other``) and write the report to ``out`` (never over an existing file)."""
    state = RunState(root)
    state.refresh()
    now = time.time()
    snap = build(state, now=now, kl_warn=kl_warn, sections=SECTIONS)
    comparison = None
    if other is not None:
        b = RunState(other)
        b.refresh()
        comparison = compare(state, b, now)
    return write_new(out, render_html(state, snap, comparison), what="report")
