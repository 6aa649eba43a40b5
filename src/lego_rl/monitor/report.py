"""``lego report RUN_DIR --html OUT``: the monitor's views as one self-contained HTML file.

Everything is inline (CSS, SVG drawn by ``monitor.svg``), nothing is fetched: the file opens offline, can be
mailed or attached to an issue. Same data as ``lego monitor --json`` (one ``Snapshot``) plus the metrics rows,
drawn as plots and tables: reward and solve-rate curves, training curves (``report_curves``), reward spread per
group, the termination mix and stage timings over steps, the task grid, consistency over steps by turn kind,
policy lag, where the step time went, behaviour per harness, rollouts opened up (``report_rollouts``), every
other recorded metric, and a comparison when a second run is given.

Which sections a run gets follows its kind: a training run all of them, an SFT run its curves, a rollout-check
its rollouts. A multi-stage parent (``runs/main-*/`` holding ``demos/``, ``sft/``, ``grpo/``) gets one part
per stage, in the order they began. The size is bounded whatever the run's length (a capped grid, a few
rollouts opened, no per-bar tooltips on long runs): 10,000 rollouts over 500 steps stay under 5 MB.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from html import escape
from pathlib import Path

from lego_rl.monitor import report_curves as curves
from lego_rl.monitor.compare import Comparison, compare
from lego_rl.monitor.report_rollouts import rollouts as rollouts_section
from lego_rl.monitor.snapshot import SECTIONS, STOPPED_SIGNAL, Snapshot, TaskRow, build
from lego_rl.monitor.stages import is_run, stage_dirs
from lego_rl.monitor.state import RunState
from lego_rl.monitor.svg import line_chart, stacked_bars
from lego_rl.runstore import metric_catalog as mc
from lego_rl.runstore import replace_file, write_new

GRID_TASKS = 2000
"""Tasks drawn in the grid (the rest are counted): a grid of 2,000 rows is already 60k cells."""
GRID_FONT = 12
GRID_CHAR_W = 7.6
"""Width budgeted per monospace character at ``GRID_FONT`` px (a 12 px monospace glyph is 7.2 px wide)."""
GRID_ROW = 16
GRID_NAME_CHARS = 48
GRID_CELLS_W = 720
"""Width the cells of the longest row get before they narrow."""
CELL, CELL_MIN = 12, 3
OUTCOME_COLOUR = {"✓": "#2ca02c", "·": "#d62728", "✗": "#f0b400"}
INFRA_COLOURS = ("#f0b400", "#e6a000", "#ffd24d", "#c98a00", "#ffe699", "#b37700")
POLICY_COLOURS = ("#1f77b4", "#6baed6", "#2ca02c", "#9467bd", "#17becf", "#08519c")

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:20px} h2{font-size:17px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:32px}
h3{font-size:15px} h4{font-size:14px;margin:10px 0 4px}
table{border-collapse:collapse;margin:8px 0} td,th{border:1px solid #ddd;padding:2px 8px;text-align:right}
th{background:#f4f4f4} td.l,th.l{text-align:left} .warn{background:#fde2e2} .note-error{color:#b00}
.note-warn{color:#a60} .note-info{color:#666} .empty{color:#888;font-style:italic} nav a{margin-right:10px}
pre{background:#f7f7f7;padding:6px;overflow:auto;max-height:240px} td.ok{color:#2a7d2a} td.bad{color:#b00}
svg{max-width:none;flex:none} .charts{display:flex;flex-wrap:wrap;gap:8px} .grid{overflow-x:auto}
td.t{max-width:440px;overflow-wrap:anywhere;text-align:left} details.rollout{border:1px solid #ddd;padding:4px 8px;margin:6px 0} summary{cursor:pointer}
section.stage{border-left:4px solid #1f77b4;padding-left:12px;margin-top:40px}
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


def _overview(s: Snapshot, state: RunState) -> str:
    o = s.overview
    assert o is not None
    curves_ = line_chart(
        "reward and solve rate per step",
        {
            "reward mean": [(p.step, p.value) for p in o.reward],
            "solve rate": [(p.step, p.value) for p in o.solve_rate],
            "eval pass@1": [(p.step, p.value) for p in o.eval_pass_at_1],
        },
    ) if o.reward or o.solve_rate or o.eval_pass_at_1 else ""
    done = len([a for a in state.steps.values() if a.finished is not None or a.metrics is not None])
    steps = (
        "-" if o.step is None
        else f"{done}" + (f" of {o.steps_total}" if o.steps_total else "") + f" (latest: step {o.step}; steps "
        "are numbered from 0)"
    )
    facts = [
        ["steps finished", steps],
        ["weight version", "-" if o.weight_version is None else str(o.weight_version)],
        ["rollouts finished", str(o.rollouts_finished)],
        ["in flight", ", ".join(f"{k} {v}" for k, v in o.in_flight.items()) or "none"],
        ["rollouts / min", _f(o.rollouts_per_min, ".1f")],
        ["trained tokens / s", _f(o.trained_tokens_per_s, ",.0f")],
        ["policy lag (last step)", ", ".join(f"{k} {v:g}" for k, v in o.staleness.items())
         or "not recorded by this run"],
        ["suspect patches", f"{sum(p.value for p in o.suspect_patches):.0f} (per step: "
         + ", ".join(f"{p.step}: {p.value:.0f}" for p in o.suspect_patches) + ")" if o.suspect_patches else "none"],
        ["last error", o.last_error or "none"],
    ] + [["baseline", b] for b in o.baseline]
    outside = [r for r in state.rollouts.values() if r.step is None and r.termination is not None]
    if outside:  # evaluation and rollout-check rollouts: no step's curve holds their rewards
        rewarded = [r.reward for r in outside if r.reward is not None and not r.infrastructure]
        facts.append(["rollouts outside training steps",
                      f"{len(outside)}; rewarded {len(rewarded)}, solved {sum(x >= 1.0 for x in rewarded)}"
                      + (f", reward mean {sum(rewarded) / len(rewarded):.3f}" if rewarded else "")])
    return curves_ + _table(["", ""], facts)


def _colours(reasons: list[str], infra: set[str]) -> dict[str, str]:
    colours, p, i = {}, 0, 0
    for r in reasons:
        if r in infra:
            colours[r] = INFRA_COLOURS[i % len(INFRA_COLOURS)]
            i += 1
        else:
            colours[r] = POLICY_COLOURS[p % len(POLICY_COLOURS)]
            p += 1
    return colours


def _terminations(s: Snapshot) -> str:
    tm = s.terminations
    assert tm is not None
    infra = set(tm.infrastructure_reasons)
    reasons = sorted(tm.totals, key=lambda r: (r in infra, r))
    reasons += sorted({r for row in tm.per_step for r in row.counts} - set(reasons))
    chart = curves.termination_mix([r.step for r in tm.per_step], [r.counts for r in tm.per_step], reasons,
                                   _colours(reasons, infra)) if tm.per_step else ""
    totals = _table(
        ["reason", "family", "rollouts"],
        [
            [r, "infrastructure" if r in infra else "policy", str(tm.totals.get(r, 0))]
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
    chart = curves.stage_timing(state)
    rows = [
        [t.scope, t.harness, t.stage, str(t.n), f"{t.p50:.2f}", f"{t.p90:.2f}", f"{t.max:.2f}"]
        for t in s.timing or []
        if not t.scope.startswith("step ")
    ]
    table = _table(["scope", "harness", "stage", "n", "p50 s", "p90 s", "max s"], rows, left=3)
    return chart + (table if rows else '<p class="empty">no stage timings</p>')


def _tasks(s: Snapshot) -> str:
    """The task × attempt grid: one row per task, labels at a fixed readable size (monospace, ``GRID_FONT``
    px) whatever the task count, in their own columns left (name, solve rate) and right (marks) of the cells,
    so no label runs into a cell; cells narrow (down to ``CELL_MIN``) when tasks have many attempts."""
    tk = s.tasks
    assert tk is not None
    if not tk.tasks:
        return '<p class="empty">no finished rollouts</p>'
    shown = tk.tasks[:GRID_TASKS]
    cols = max(t.attempts for t in shown)
    cell = max(CELL_MIN, min(CELL, GRID_CELLS_W // max(1, cols)))
    name_chars = min(GRID_NAME_CHARS, max(len(t.instance_id) for t in shown))
    name_w = name_chars * GRID_CHAR_W + 12
    rate_w = 5 * GRID_CHAR_W + 8
    x_cells = name_w + rate_w
    marks = {t.instance_id: _marks(t) for t in shown}
    marks_w = max(len(m) for m in marks.values()) * GRID_CHAR_W + 12
    w, h = x_cells + cols * cell + 8 + marks_w, len(shown) * GRID_ROW + 8
    parts = [
        f'<div class="grid"><svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w:.0f} {h}" width="{w:.0f}" '
        f'height="{h}" role="img" aria-label="task grid" font-size="{GRID_FONT}" font-family="monospace">'
    ]
    for row_i, t in enumerate(shown):
        y = 4 + row_i * GRID_ROW
        name = t.instance_id if len(t.instance_id) <= name_chars else t.instance_id[: name_chars - 1] + "…"
        rate = "-" if t.solve_rate is None else f"{t.solve_rate:.0%}"
        parts.append(
            f'<text x="0" y="{y + GRID_FONT - 2}"><title>{escape(t.instance_id)}</title>{escape(name)}</text>'
            f'<text x="{x_cells - 8:.0f}" y="{y + GRID_FONT - 2}" text-anchor="end">{rate}</text>'
        )
        parts.extend(
            f'<rect x="{x_cells + j * cell:.0f}" y="{y}" width="{max(1, cell - 1)}" height="{GRID_ROW - 3}" '
            f'fill="{OUTCOME_COLOUR.get(c, "#999")}"/>'
            for j, c in enumerate(t.cells)
        )
        if marks[t.instance_id]:
            parts.append(f'<text x="{x_cells + cols * cell + 8:.0f}" y="{y + GRID_FONT - 2}">'
                         f"{escape(marks[t.instance_id])}</text>")
    parts.append("</svg></div>")
    head = (
        f"<p>{len(tk.tasks)} tasks; zero-variance groups (no GRPO signal, marked ∅): "
        f"{tk.zero_variance_groups} of {tk.groups}; stopped carrying signal (∅×n: their last n ≥ "
        f"{STOPPED_SIGNAL} groups in a row): {tk.stopped_signal}; retired by the trainer: {len(tk.retired)}. "
        "Each row: task, solve rate, one cell per attempt (green solved, red failed, yellow infrastructure, "
        "oldest first).</p>"
    )
    more = f"<p>{len(tk.tasks) - len(shown)} more tasks not drawn.</p>" if len(tk.tasks) > len(shown) else ""
    return head + "".join(parts) + more


def _marks(t: TaskRow) -> str:
    mark = "∅" if t.zero_variance_groups else ""
    if t.zero_variance_streak >= STOPPED_SIGNAL:
        mark += f" ∅×{t.zero_variance_streak} in a row"
    if t.retired:
        mark += " retired"
    return mark.strip()


def _consistency(s: Snapshot) -> str:
    c = s.consistency
    assert c is not None
    if not c.steps:
        return f'<p class="empty">{escape(c.note)}</p>'
    kinds = sorted({k for x in c.steps for k in x.by_kind})

    def by_kind(field: str) -> dict[str, list[tuple[float, float]]]:
        """The field overall and per turn kind (bridged, full, first_segment, later_segments)."""
        out = {"overall": [(float(x.step), x.overall[field]) for x in c.steps if field in x.overall]}
        for kind in kinds:
            out[kind] = [(float(x.step), x.by_kind[kind][field]) for x in c.steps if field in x.by_kind.get(kind, {})]
        return out

    chart = line_chart(
        f"k3 KL per step by turn kind (dashed: monitor.kl_warn = {c.kl_warn:g})", by_kind("k3_kl"), log=True,
        hline=c.kl_warn,
    )
    # Pearson sits at 0.99999...: 1 - Pearson on a log scale tells such steps apart (lower is closer)
    pearson = line_chart(
        "1 - Pearson (rollout vs trainer log-probs) per step by turn kind, lower is closer",
        {k: [(x, 1.0 - y) for x, y in v] for k, v in by_kind("pearson").items()}, log=True,
    )
    diffs = "".join(
        line_chart(f"{field} (nats) per step by turn kind", by_kind(field), log=True, small=True)
        for field in ("mean_abs_diff", "p99_abs_diff", "max_abs_diff")
    ) + line_chart("tokens compared per step by turn kind", by_kind("tokens"), small=True)
    charts = chart + pearson + f'<div class="charts">{diffs}</div>'
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
    return charts + "<h3>worst steps</h3>" + worst + f"<p>{escape(c.note)}</p>"


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


COMPARED = (mc.LOSS, mc.ENTROPY, mc.GRAD_NORM, mc.KL, mc.POLICY_LAG_MEAN)
"""Training curves drawn A against B when both runs recorded them."""


def _compare(c: Comparison, a: RunState, b: RunState) -> str:
    """A and B side by side. Run names sit in their own table and the legends say only A or B, so a long
    path never runs into a value; the per-task table has one column per figure."""
    runs = _table(["", "run", "kind", "steps"], [
        ["A", c.a, _kind(a), str(len(curves.rows(a)))],
        ["B", c.b, _kind(b), str(len(curves.rows(b)))],
    ], left=3)
    charts = [
        line_chart("reward mean per step", {"A": [(p.step, p.value) for p in c.reward_a],
                                            "B": [(p.step, p.value) for p in c.reward_b]}, small=True),
        line_chart("solve rate per step", {"A": [(p.step, p.value) for p in c.solve_a],
                                           "B": [(p.step, p.value) for p in c.solve_b]}, small=True),
    ]
    for m in COMPARED:
        sa, sb = curves.series(curves.rows(a), m), curves.series(curves.rows(b), m)
        if sa or sb:
            charts.append(line_chart(f"{m} per step", {"A": sa, "B": sb}, small=True))
    rows = [[d.instance_id, f"{d.a:.2f}", f"{d.b:.2f}", f"{d.delta:+.2f}"] for d in c.deltas[:50]]
    return (
        runs
        + f'<div class="charts">{"".join(charts)}</div>'
        + f"<p>{len(c.deltas)} tasks in both: {c.up} up, {c.down} down (solve rate, largest changes first)</p>"
        + _table(["task", "A solve rate", "B solve rate", "B - A"], rows)
    )


def _kind(state: RunState) -> str:
    """The run's kind as the report names it: an SFT run writes steps like a training run, and is told apart
    by the figures only SFT declares."""
    sft_only = [m for m in mc.written_by(mc.SFT) if mc.TRAIN not in m.written_by]
    data = curves.rows(state)
    if any(curves.series(data, m) for m in sft_only):
        return mc.RunKind.SFT.value
    if state.kind == "empty" and data:  # metrics rows and no step events (a cut or lost events.jsonl)
        return mc.RunKind.TRAIN.value
    return state.kind


Section = tuple[str, str, Callable[[], str]]


def _sections(state: RunState, snap: Snapshot, kind: str) -> list[Section]:
    """The sections of one run, by its kind: (id, title, render)."""
    rkind = mc.RunKind.SFT if kind == mc.RunKind.SFT.value else mc.RunKind.TRAIN
    every: dict[str, Section] = {
        "overview": ("overview", "Overview", lambda: _overview(snap, state)),
        "training": ("training", "Training curves", lambda: curves.training(state, rkind)),
        "rewards": ("rewards", "Reward spread per group", lambda: curves.reward_spread(state)),
        "terminations": ("terminations", "Terminations", lambda: _terminations(snap)),
        "timing": ("timing", "Stage timing", lambda: _timing(snap, state)),
        "tasks": ("tasks", "Tasks", lambda: _tasks(snap)),
        "consistency": ("consistency", "Consistency", lambda: _consistency(snap)),
        "staleness": ("staleness", "Policy lag", lambda: curves.policy_lag(state)),
        "tokenisation": ("tokenisation", "Tokenisation health", lambda: curves.tokenisation(state)),
        "pipeline": ("pipeline", "Pipeline", lambda: _pipeline(snap)),
        "behaviour": ("behaviour", "Behaviour", lambda: _behaviour(snap)),
        "rollouts": ("rollouts", "Rollouts", lambda: rollouts_section(state)),
        "metrics": ("metrics", "Other metrics", lambda: curves.other_metrics(state)),
    }
    names = {
        "sft": ("overview", "training", "pipeline", "metrics"),
        "rollout-check": ("overview", "rollouts", "terminations", "timing", "tasks", "behaviour"),
        "tasks-screen": ("overview", "rollouts", "terminations", "timing", "tasks", "behaviour"),
    }.get(kind, tuple(every))
    return [every[n] for n in names]


def _run_part(state: RunState, snap: Snapshot, prefix: str, extra: list[Section]) -> tuple[str, str]:
    """(navigation links, sections) of one run; ``prefix`` keeps ids apart when a page holds several runs."""
    kind = _kind(state)
    parts = _sections(state, snap, kind) + extra
    notes = "".join(
        f'<li class="note-{escape(n.level)}">{escape(n.level)}: {escape(n.text)}</li>' for n in snap.notes
    )
    nav = "".join(f'<a href="#{prefix}{sid}">{title}</a>' for sid, title, _ in parts)
    head = (f"<p>{escape(kind)} run, {escape(snap.run.status)}; {snap.run.events_read:,} events, "
            f"{snap.run.metrics_rows} metrics rows</p><ul>{notes}</ul>")
    body = "".join(f'<section id="{prefix}{sid}"><h2>{title}</h2>{render()}</section>' for sid, title, render in parts)
    return nav, head + body


def _page(title: str, intro: str, nav: str, body: str) -> str:
    made = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>lego report: '
        f"{escape(title)}</title><style>{CSS}</style></head><body>"
        f"<h1>lego report: {escape(title)}</h1><p>{intro}written {made}</p><nav>{nav}</nav>{body}</body></html>"
    )


def render_html(state: RunState, snap: Snapshot, comparison: Comparison | None = None,
                other: RunState | None = None) -> str:
    extra: list[Section] = []
    if comparison is not None and other is not None:
        extra.append(("compare", "Compare", lambda: _compare(comparison, state, other)))
    nav, body = _run_part(state, snap, "", extra)
    return _page(snap.run.root, "", nav, body)


def render_stages(root: Path, stages: list[tuple[str, RunState, Snapshot]]) -> str:
    """One page for a multi-stage parent: a part per stage, in the order the stages began."""
    navs, bodies = [], []
    for name, state, snap in stages:
        nav, body = _run_part(state, snap, f"{name}-", [])
        navs.append(f'<a href="#{escape(name)}"><b>{escape(name)}</b></a>')
        bodies.append(f'<section class="stage" id="{escape(name)}"><h2>stage {escape(name)}: '
                      f"{escape(str(state.root))}</h2><nav>{nav}</nav>{body}</section>")
    intro = f"{len(stages)} stages: {escape(', '.join(n for n, _, _ in stages))}; "
    return _page(str(root), intro, "".join(navs), "".join(bodies))


class NoRun(ValueError):
    """The directory holds no run and no stages."""


def _read(root: Path, kl_warn: float, now: float) -> tuple[RunState, Snapshot]:
    state = RunState(root)
    state.refresh()
    return state, build(state, now=now, kl_warn=kl_warn, sections=SECTIONS)


def write_report(root: Path, out: Path, *, kl_warn: float, other: Path | None = None, force: bool = False) -> Path:
    """Read the run (and ``other``) and write the report to ``out``.

    :param force: replace ``out`` when it exists (atomically: a reader sees the old or the new report).
    :raises FileExistsError: naming ``out`` when it exists and ``force`` is not given (nothing is written).
    :raises NoRun: ``root`` is neither a run nor a parent of stage runs; or ``other`` is given for a parent.
    """
    if out.exists() and not force:
        raise FileExistsError(f"{out} already exists: give --force to replace it, or another --html path")
    now = time.time()
    stages = stage_dirs(root)
    if stages:
        if other is not None:
            raise NoRun(f"{root} holds stages ({', '.join(p.name for p in stages)}), not one run: --compare "
                        "takes single runs (give a stage's directory)")
        html = render_stages(root, [(p.name, *_read(p, kl_warn, now)) for p in stages])
    elif not is_run(root):
        raise NoRun(f"{root} holds no run (no config.json, no events.jsonl) and no stage directories holding one")
    else:
        state, snap = _read(root, kl_warn, now)
        b = None
        comparison = None
        if other is not None:
            b = RunState(other)
            b.refresh()
            comparison = compare(state, b, now)
        html = render_html(state, snap, comparison, b)
    if force:
        return replace_file(out, html)
    return write_new(out, html, what="report")
