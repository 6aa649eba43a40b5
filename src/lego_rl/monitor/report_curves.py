"""The report's per-step curves: training (loss, grad norm, entropy, lr, KL, clip fractions, importance
ratios), policy lag, group reward spread, termination mix and stage timing over steps, and every other metric
the run recorded.

Metrics rows are read through their declarations (``metric_catalog.read`` / ``read_family``), never by a
name written here: a chart cannot ask for a metric nobody writes. Whatever a row holds that no chart here
names is still drawn (``other_metrics``), so nothing the run recorded is missing from the report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from statistics import pstdev

from lego_rl.monitor.snapshot import STAGE_ORDER, quantile
from lego_rl.monitor.state import RunState
from lego_rl.monitor.svg import line_chart, stacked_bars
from lego_rl.runstore import StepMetrics
from lego_rl.runstore import metric_catalog as mc

TIPS_UP_TO = 100
"""Steps up to which each bar carries a tooltip (beyond, they would make most of a long run's report)."""


@dataclass(frozen=True)
class Chart:
    title: str
    metrics: tuple[mc.Metric, ...]
    log: bool = False


TRAINING = (
    Chart("loss (nats/token)", (mc.LOSS, mc.PG_LOSS, mc.NLL)),
    Chart("grad norm (before clipping)", (mc.GRAD_NORM,), log=True),
    Chart("entropy (nats)", (mc.ENTROPY,)),
    Chart("learning rate", (mc.LR,)),
    Chart("KL to the reference policy (nats)", (mc.KL,)),
    Chart("clipped / capped token fractions", (mc.CLIP_FRAC_LOW, mc.CLIP_FRAC_HIGH, mc.DUAL_CLIP_FRAC,
                                               mc.TIS_CLAMPED_FRAC, mc.MIS_MASKED_FRAC)),
    Chart("importance ratios", (mc.RATIO_MEAN, mc.IS_WEIGHT_MEAN, mc.SC_CORRECTION)),
)
GROUP_COUNTS = Chart("group counts the trainer recorded", (
    mc.ZERO_ADVANTAGE_GROUPS, mc.ALL_SOLVED_GROUPS, mc.ALL_FAILED_GROUPS, mc.ZERO_VARIANCE_GROUPS,
    mc.REPLACED_GROUPS, mc.STALE_GROUPS))
POLICY_LAG = Chart("policy lag (steps)", (mc.POLICY_LAG_MEAN, mc.POLICY_LAG_MAX))
CROSSED = Chart("crossed weight versions, stale tokens dropped", (
    mc.ROLLOUTS_CROSSED_VERSION, mc.TURNS_CROSSED_VERSION, mc.TOKENS_DROPPED_STALE))
SEGMENTS = Chart("segments per rollout (1: one chain)", (mc.SEGMENTS_PER_ROLLOUT, mc.SEGMENTS_PER_ROLLOUT_MAX))
TOKENISATION_COUNTS = Chart("tokenisation counters (false forks, parse failures, fallbacks: should be 0)", (
    mc.FALSE_FORKS, mc.PARSE_FAILURES, mc.RENDER_FALLBACKS, mc.REPEATED_PROMPT_TOKENS))
SHOWN_ELSEWHERE: frozenset[mc.Metric] = frozenset({
    mc.REWARD_MEAN, mc.SOLVE_RATE,  # overview curves
    mc.TIME_ROLLOUT_S, mc.TIME_TRAIN_S, mc.TIME_SYNC_S,  # pipeline stacks
    *mc.CONSISTENCY.values(), *mc.CONSISTENCY_BY_SPLIT.values(),  # consistency section
    mc.TOKENS_AGE,  # policy-lag section's age stacks
})
"""Declarations the report draws outside this module's ``Chart`` lists."""
CHARTED: frozenset[mc.Metric] = frozenset(
    m for c in (*TRAINING, GROUP_COUNTS, POLICY_LAG, CROSSED, SEGMENTS, TOKENISATION_COUNTS) for m in c.metrics) | SHOWN_ELSEWHERE


Rows = Sequence[StepMetrics]


def rows(state: RunState) -> list[StepMetrics]:
    """Every metrics row, in step order."""
    return [a.metrics for _, a in sorted(state.steps.items()) if a.metrics is not None]


def series(data: Rows, metric: mc.Metric) -> list[tuple[float, float]]:
    return [(float(row.step), v) for row in data if (v := mc.read(row.values, metric)) is not None]


def _chart(data: Rows, chart: Chart, *, small: bool = True) -> str | None:
    lines = {str(m): pts for m in chart.metrics if (pts := series(data, m))}
    if not lines:
        return None
    log = chart.log and all(y > 0 for pts in lines.values() for _, y in pts)
    return line_chart(chart.title, lines, log=log, small=small)


def _absent(charts: Sequence[Chart], data: Rows, kind: mc.RunKind) -> str:
    """The declared metrics of ``charts`` this run kind writes but this run did not, with when they are."""
    missing = [m for c in charts for m in c.metrics
               if kind in m.written_by and not series(data, m)]
    if not missing:
        return ""
    items = "".join(f"<li><code>{escape(m)}</code>: written when {escape(m.when or 'every step')}</li>"
                    for m in missing)
    return f'<p class="empty">not recorded by this run:</p><ul class="empty">{items}</ul>'


def _grid(charts: Sequence[str | None]) -> str:
    drawn = [c for c in charts if c]
    return f'<div class="charts">{"".join(drawn)}</div>' if drawn else ""


def training(state: RunState, kind: mc.RunKind) -> str:
    data = rows(state)
    if not data:
        return '<p class="empty">no metrics rows: no step has finished</p>'
    grid = _grid([_chart(data, c) for c in TRAINING])
    return (grid or '<p class="empty">no training figures in the metrics rows</p>') + _absent(TRAINING, data, kind)


def policy_lag(state: RunState) -> str:
    data = rows(state)
    ages: dict[str, dict[int, float]] = {}
    for row in data:
        for age, n in mc.read_family(row.values, mc.TOKENS_AGE).items():
            ages.setdefault(age, {})[row.step] = n
    charts = [_chart(data, POLICY_LAG), _chart(data, CROSSED)]
    steps = [row.step for row in data]
    if ages:
        order = sorted(ages, key=int)
        totals = [sum(ages[a].get(s, 0.0) for a in order) or 1.0 for s in steps]
        charts.append(stacked_bars(
            "sampled tokens by age in policies (share per step)", steps,
            {f"age {a}": [ages[a].get(s, 0.0) / t for s, t in zip(steps, totals, strict=True)] for a in order},
            y_max=1.0, tips=len(steps) <= TIPS_UP_TO))
    body = _grid(charts)
    if not body:
        return ('<p class="empty">no policy lag recorded: only training steps record it (0 means every rollout '
                "sampled the weights of the step that trained it)</p>")
    return body


def tokenisation(state: RunState) -> str:
    """How the adapter's prompts became training segments, per step; a warning line when a counter that
    stays 0 on a healthy run (false forks, parse failures, render fallbacks) did not."""
    data = rows(state)
    body = _grid([_chart(data, SEGMENTS), _chart(data, TOKENISATION_COUNTS)])
    if not body:
        return ('<p class="empty">no tokenisation figures: written by steps where some rollout recorded turns '
                "(an environment run records none)</p>")
    totals = {str(m): sum(y for _, y in series(data, m)) for m in (mc.FALSE_FORKS, mc.PARSE_FAILURES,
                                                                    mc.RENDER_FALLBACKS)}
    bad = ", ".join(f"{k} {v:.0f}" for k, v in totals.items() if v)
    warn = (f'<p class="note-warn">over the run: {escape(bad)} (each should be 0: a false fork trains a prompt '
            "twice, a parse failure hands a tool call back to the CLI as text)</p>" if bad else "")
    return warn + body


def _groups(state: RunState) -> dict[int, dict[tuple[str, int], list[float]]]:
    """step → (task, group index) → admitted rewards, each rollout under the step whose figures include it."""
    out: dict[int, dict[tuple[str, int], list[float]]] = {}
    for r in state.rollouts.values():
        step = r.counted_in if r.counted_in is not None else r.step
        if step is None or r.termination is None or r.infrastructure or r.reward is None:
            continue
        out.setdefault(step, {}).setdefault((r.instance_id, r.group_index), []).append(r.reward)
    return out


def reward_spread(state: RunState) -> str:
    """Per step: the spread of rewards inside each group (a group of equal rewards carries no GRPO signal)."""
    groups = _groups(state)
    steps = sorted(groups)
    counts_chart = _chart(rows(state), GROUP_COUNTS)
    if not steps:
        return (_grid([counts_chart]) + '<p class="empty">no rewarded rollouts in training steps: no spread '
                "inside groups to draw</p>")
    mean_std, max_std = [], []
    kinds: dict[str, list[float]] = {"rewards spread (signal)": [], "equal: all solved": [],
                                     "equal: none solved": [], "equal: other": []}
    for s in steps:
        stds = [pstdev(r) if len(r) > 1 else 0.0 for r in groups[s].values()]
        mean_std.append((float(s), sum(stds) / len(stds)))
        max_std.append((float(s), max(stds)))
        counts = dict.fromkeys(kinds, 0.0)
        for r in groups[s].values():
            if len(set(r)) > 1:
                counts["rewards spread (signal)"] += 1
            elif r[0] >= 1.0:
                counts["equal: all solved"] += 1
            elif r[0] <= 0.0:
                counts["equal: none solved"] += 1
            else:
                counts["equal: other"] += 1
        for k in kinds:
            kinds[k].append(counts[k])
    kinds = {k: v for k, v in kinds.items() if any(v)}
    colours = {"rewards spread (signal)": "#2ca02c", "equal: all solved": "#9467bd",
               "equal: none solved": "#d62728", "equal: other": "#7f7f7f"}
    charts = [
        line_chart("reward std inside a group (from rollout_finished)",
                   {"mean over groups": mean_std, "largest group": max_std}, small=True),
        counts_chart,
    ]
    last = steps[-1]
    table = "".join(
        f'<tr><td class="l">{escape(task)}</td><td>{g}</td><td>{len(r)}</td>'
        f"<td>{sum(r) / len(r):.2f}</td><td>{pstdev(r) if len(r) > 1 else 0.0:.2f}</td>"
        f'<td class="l">{escape(" ".join(f"{x:g}" for x in r[:16]))}</td></tr>'
        for (task, g), r in sorted(groups[last].items())[:30]
    )
    return (
        stacked_bars("groups per step by reward spread", steps, kinds, colours=colours,
                     tips=len(steps) <= TIPS_UP_TO)
        + _grid(charts)
        + f"<h3>groups of step {last}</h3><table><tr><th class=\"l\">task</th><th>group</th><th>rollouts</th>"
        f"<th>reward mean</th><th>reward std</th><th class=\"l\">rewards</th></tr>{table}</table>"
    )


def termination_mix(steps: Sequence[int], counts: Sequence[dict[str, int]], reasons: Sequence[str],
                     colours: dict[str, str]) -> str:
    """Each step's rollouts by termination reason, as shares of the step (the mix, whatever the batch size)."""
    totals = [sum(c.values()) or 1 for c in counts]
    return stacked_bars(
        "termination mix per step (share of the step's rollouts; infrastructure reasons in yellow)",
        list(steps),
        {r: [c.get(r, 0) / t for c, t in zip(counts, totals, strict=True)] for r in reasons},
        colours=colours, y_max=1.0, tips=len(steps) <= TIPS_UP_TO,
    )


def stage_series(state: RunState) -> dict[str, list[tuple[float, float]]]:
    """stage → (step, p50 seconds) per step, every rollout under the step whose figures include it (the
    asynchronous scheduler may train a rollout in a later step than the one open when it started)."""
    merged: dict[str, dict[int, list[float]]] = {}
    for r in state.rollouts.values():
        step = r.counted_in if r.counted_in is not None else r.step
        if step is None:
            continue
        for stage, (status, seconds) in r.stages.items():
            if status != "interrupted":  # a stage cut short says nothing about how long it takes
                merged.setdefault(stage, {}).setdefault(step, []).append(seconds)
    order = {name: i for i, name in enumerate(STAGE_ORDER)}
    return {
        stage: [(float(step), quantile(sorted(times), 0.5)) for step, times in sorted(by_step.items())]
        for stage, by_step in sorted(merged.items(), key=lambda kv: (order.get(kv[0], 99), kv[0]))
    }


def stage_timing(state: RunState) -> str:
    per_stage = stage_series(state)
    if not per_stage:
        return ""
    return line_chart("stage p50 seconds per step (all harnesses)", per_stage, log=True)


def other_metrics(state: RunState) -> str:
    """Every declared metric the rows hold that no other chart draws, one small chart each."""
    data = rows(state)
    seen: dict[mc.Metric, None] = {}
    undeclared: set[str] = set()
    for row in data:
        declared, unknown = mc.declarations_in(row.values)
        seen.update((m, None) for m in declared if m not in CHARTED)
        undeclared.update(unknown)
    charts = [line_chart(f"{m} ({m.unit})" if m.unit else str(m), {str(m): series(data, m)}, small=True)
              for m in sorted(seen, key=lambda m: (m.group, str(m)))]
    note = (f'<p class="note-warn">undeclared names in the metrics rows (not drawn): '
            f'{escape(", ".join(sorted(undeclared)))}</p>' if undeclared else "")
    return (_grid(charts) or '<p class="empty">no other metrics recorded</p>') + note
