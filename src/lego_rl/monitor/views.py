"""The monitor's views as rich renderables, drawn from a ``Snapshot`` (never from the files directly).

Text from the run (task ids, details, transcripts) goes into ``Text`` objects, never into markup: a task
named ``[red]x`` must show as typed, not restyle the screen.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from lego_rl.monitor.compare import Comparison
from lego_rl.monitor.drill import RolloutDetail
from lego_rl.monitor.snapshot import STOPPED_SIGNAL, Point, RolloutBrief, Snapshot
from lego_rl.monitor.stages import StageInfo

BLOCKS = "▁▂▃▄▅▆▇█"
VIEWS = (
    ("o", "overview", "Overview"),
    ("l", "curves", "Curves"),
    ("t", "terminations", "Terminations"),
    ("s", "timing", "Stage timing"),
    ("g", "tasks", "Tasks"),
    ("c", "consistency", "Consistency"),
    ("r", "rollouts", "Rollouts"),
    ("b", "behaviour", "Behaviour"),
    ("p", "pipeline", "Pipeline"),
    ("m", "compare", "Compare"),
)
"""(key, section, title), in the order of the tab bar; ``1``..``9`` select the first nine too."""
LEVEL_STYLE = {"error": "bold red", "warn": "yellow", "info": "dim"}
OUTCOME_STYLE = {"✓": "green", "·": "red", "✗": "yellow"}


def sparkline(
    values: Sequence[float], width: int = 60, lo: float | None = None, hi: float | None = None
) -> str:
    """The last ``width`` values as block characters (min..max of what is shown, or ``lo``..``hi``)."""
    shown = list(values)[-width:]
    if not shown:
        return ""
    low = min(shown) if lo is None else lo
    high = max(shown) if hi is None else hi
    span = high - low
    return "".join(BLOCKS[0 if span <= 0 else min(7, max(0, int((v - low) / span * 7.999)))] for v in shown)


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _dur(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def _curve(
    label: str, points: list[Point], width: int, lo: float | None = 0.0, hi: float | None = None, pad: int = 12
) -> Text:
    t = Text(f"{label:<{pad}}")
    if not points:
        return t.append("no data yet", "dim")
    t.append(sparkline([p.value for p in points], width, lo, hi), "cyan")
    t.append(f"  last {points[-1].value:.3f} (step {points[-1].step})")
    return t


def header(snap: Snapshot, active: str, compare: bool, search: str | None) -> Text:
    r = snap.run
    t = Text()
    t.append("lego monitor ", "bold")
    t.append(r.root)
    t.append(f"  [{r.kind}] ", "dim")
    style = (
        "green"
        if r.status == "running"
        else ("red" if "crash" in r.status or "failed" in r.status else "cyan")
    )
    t.append(r.status, style)
    if r.last_event_at:
        t.append(f"  last event {max(0.0, time.time() - r.last_event_at):.0f}s ago", "dim")
    t.append("\n")
    for i, (key, section, title) in enumerate(VIEWS):
        if section == "compare" and not compare:
            continue
        t.append(f" {i + 1}/{key} {title} ", "reverse bold" if section == active else "")
    if search:
        t.append(f"   search: {search}", "magenta")
    return t


def notes(snap: Snapshot) -> RenderableType:
    t = Text()
    for n in snap.notes:
        t.append(f"{n.level}: ", LEVEL_STYLE.get(n.level, ""))
        t.append(n.text + "\n")
    return t


def footer(detail_open: bool, *, stage: str | None = None, stages: bool = False) -> Text:
    keys = (
        "keys: 1-9, 0 or letter = view  ↑/↓ or j/k = select/scroll  enter = open rollout  / = search  q = quit"
    )
    if stage is not None:
        keys += f"  esc = back to the stages (open: {stage})"
    if detail_open:
        keys = "keys: esc/backspace = back to the list  ↑/↓ = scroll  q = quit"
    if stages:
        keys = "keys: ↑/↓ or j/k = select a stage  enter = open it  q = quit"
    return Text(keys, "dim")


def stages_header(root: str) -> Text:
    t = Text("lego monitor ", "bold")
    t.append(root)
    t.append("  [stages]", "dim")
    t.append("\nthis folder holds no run of its own: one run per stage below (the main job's demos/, sft/, grpo/)")
    return t


def stages(infos: Sequence[StageInfo], selected: int | None) -> RenderableType:
    table = Table(title="stages, in the order they started" + (" (enter opens the selected one)"
                                                               if selected is not None else ""))
    for col in ("stage", "kind", "status", "steps done", "rollouts finished"):
        table.add_column(col)
    for i, s in enumerate(infos):
        table.add_row(Text(s.name), s.kind, s.status, "-" if s.steps_done is None else str(s.steps_done),
                      str(s.rollouts), style="reverse" if i == selected else "")
    return table


def overview(snap: Snapshot, width: int) -> RenderableType:
    o = snap.overview
    if o is None:
        return Text("")
    w = max(10, width - 40)
    t = Text()
    kind = snap.run.kind
    # Steps are numbered from 0; "steps done N/T" counts them, as the CLI's "step N/T" does (docs/monitoring.md).
    done = "-" if o.steps_done is None else str(o.steps_done)
    total = f"/{o.steps_total}" if o.steps_total is not None else ""
    last_step = "" if o.step is None else f" (last: step {o.step})"
    if kind in ("train", "sft") or o.steps_done is not None:
        t.append(f"steps done {done}{total}{last_step}   weight version "
                 f"{'-' if o.weight_version is None else o.weight_version}   ", "bold")
    if kind != "sft":  # SFT trains on recorded demonstrations: it runs no rollout
        t.append(f"rollouts finished {o.rollouts_finished}   ", "bold")
    t.append(f"ETA {_dur(o.eta_s)}\n", "bold")
    if kind == "sft":
        t.append_text(_curve("loss", o.loss, w, None, None)).append("\n")
    elif kind in ("train", "empty"):
        t.append_text(_curve("reward", o.reward, w, 0.0, None)).append("\n")
        t.append_text(_curve("solve rate", o.solve_rate, w, 0.0, 1.0)).append("\n")
        t.append_text(_curve("eval pass@1", o.eval_pass_at_1, w, 0.0, 1.0)).append("\n")
        if o.loss:
            t.append_text(_curve("loss", o.loss, w, None, None)).append("\n")
    if kind not in ("train", "sft"):  # no steps: the rollouts' own rewards
        t.append(f"{'reward':<12}")
        if o.graded:
            t.append(f"mean {o.reward_mean_all:.3f} over {o.graded} graded rollouts, {o.rewarded} rewarded (> 0)\n")
        else:
            t.append("no graded rollout yet\n", "dim")
    flight = ", ".join(f"{h} {n}" for h, n in o.in_flight.items()) or "none"
    if kind != "sft":
        t.append(f"in flight    {flight}\n")
        t.append(f"throughput   {_fmt(o.rollouts_per_min, '.1f')} rollouts/min, ")
    else:
        t.append("throughput   ")
    t.append(f"{_fmt(o.trained_tokens_per_s, ',.0f')} trained tokens/s\n")
    # Policy lag as the loop recorded it; a run that records none (SFT, rollout-check) says so, no guess.
    if kind in ("train", "empty"):  # SFT and runs without steps sample nothing for a trainer: no lag to show
        stale = ", ".join(f"{k} {v:.2f}" for k, v in o.staleness.items()) or "not recorded by this run"
        t.append(f"staleness    {stale}{_mode(o.max_staleness, prefix='; ')}\n")
    for line in o.incidents[-3:]:
        t.append("event        ", "bold")
        t.append(line + "\n", "yellow")
    for b in o.baseline:
        t.append(f"baseline     {b}\n")
    if o.suspect_patches:
        last = o.suspect_patches[-1]
        t.append(f"suspect      {last.value:.0f} in step {last.step}, {sum(p.value for p in o.suspect_patches):.0f} in "
                 "all: patches built to fool comparisons (suspect_patch; grader.log has the evidence)\n", "red")
    if o.tokenisation:  # counters that stay 0 on a healthy run: each one is a wrong training target or tool call
        t.append("tokenisation ", "bold")
        t.append(", ".join(f"{k} {v:.0f}" for k, v in o.tokenisation.items())
                 + " over the run (should be 0: Curves → tokenisation health has them per step)\n", "yellow")
    t.append("last error   ")
    t.append(o.last_error or "none", "red" if o.last_error else "green")
    return t


def _mode(max_staleness: int | None, prefix: str = "") -> str:
    """The loop's mode as its config set it (the policy lag figures say what happened)."""
    if max_staleness is None:
        return ""
    if max_staleness == 0:
        return f"{prefix}synchronous loop (rollout.max_staleness 0)"
    return f"{prefix}asynchronous loop (rollout.max_staleness {max_staleness})"


PANELS = (
    ("train", "training"),
    ("rollouts", "rollouts: reward, spread within groups"),
    ("consistency", "consistency per turn kind (rollout vs trainer)"),
    ("terminations", "termination mix (share of each step's rollouts)"),
    ("timing", "stage timing (seconds per step)"),
    ("staleness", "policy lag"),
    ("tokenisation", "tokenisation health (false forks, parse failures and render fallbacks should stay 0)"),
    ("eval", "held-out evaluation (steps that evaluated)"),
)


def curves(snap: Snapshot, width: int, height: int, offset: int = 0) -> RenderableType:
    """Every per-step curve as a sparkline over the whole run with its last value, range and (integer) step
    span: one column per step, or per ``k`` consecutive steps (their mean) when the run has more steps than
    columns."""
    series = snap.curves or []
    if not series:
        if snap.run.kind in ("rollout-check", "tasks-screen"):
            return Text(f"a {snap.run.kind} run has no steps: its rollouts are in Rollouts, Tasks and Terminations")
        return Text("no per-step figures yet: no step has finished")
    w = max(10, min(width - 96, max(len(x.steps) for x in series)))
    lines: list[Text] = []
    for panel, title in PANELS:
        mine = [x for x in series if x.panel == panel]
        if not mine:
            continue
        lines.append(Text(title, "bold"))
        for x in mine:
            cols, k = _columns(x.figures, w)
            name = x.name.removeprefix(f"{panel}/").removeprefix("consistency/").removeprefix("termination/")
            line = Text(f"  {name[:30]:<30} ")
            line.append(f"{sparkline(cols, w):<{w}}", "cyan")
            line.append(f" {_num(x.figures[-1]):>9}  range {_num(min(x.figures))}..{_num(max(x.figures))}  "
                        f"steps {x.steps[0]}-{x.steps[-1]}" + (f", {k}/column" if k > 1 else ""))
            lines.append(line)
    offset = min(offset, max(0, len(lines) - height))
    t = Text(no_wrap=True, overflow="crop")
    for line in lines[offset: offset + max(5, height)]:
        t.append_text(line).append("\n")
    if offset + height < len(lines):
        t.append(f"... {len(lines) - offset - height} more lines (↓ to scroll)", "dim")
    return t


def _columns(values: Sequence[float], width: int) -> tuple[list[float], int]:
    """``values`` in at most ``width`` columns: each the mean of ``k`` consecutive values (k = 1 when they fit)."""
    k = max(1, -(-len(values) // width))
    return [sum(values[i:i + k]) / len(values[i:i + k]) for i in range(0, len(values), k)], k


def _num(v: float) -> str:
    return f"{v:.3g}" if v == 0 or 1e-3 <= abs(v) < 1e5 else f"{v:.2e}"


def terminations(snap: Snapshot, height: int, selected: int | None = None) -> RenderableType:
    tm = snap.terminations
    if tm is None:
        return Text("")
    reasons = list(tm.totals)
    table = Table(title="termination mix per step (infrastructure reasons in yellow)", expand=False)
    table.add_column("step", justify="right")
    for reason in reasons:
        table.add_column(
            reason, justify="right", style="yellow" if reason in tm.infrastructure_reasons else ""
        )
    table.add_column("policy", justify="right")
    table.add_column("infra", justify="right", style="yellow")
    for row in tm.per_step[-max(3, height // 3) :]:
        table.add_row(
            str(row.step),
            *(str(row.counts.get(r, "")) for r in reasons),
            str(row.policy),
            str(row.infrastructure),
        )
    table.add_row("all", *(str(tm.totals[r]) for r in reasons), "", "", style="bold")
    ex = Text(
        "\nlatest examples"
        + (" (↑/↓ pick a reason, enter lists its rollouts)" if selected is not None else "")
        + "\n",
        "bold",
    )
    for n, (reason, items) in enumerate(tm.examples.items()):
        for i, b in enumerate(items[:2]):
            mark = "▶ " if n == selected and i == 0 else "  "
            ex.append(mark)
            ex.append(
                f"{reason:<24}",
                ("reverse " if n == selected else "") + ("yellow" if b.infrastructure else ""),
            )
            ex.append(f"{b.rollout_id}  {b.instance_id}  {b.harness}  ")
            ex.append((b.detail or "")[:120] + "\n", "dim")
    return Group(table, ex)


def timing(snap: Snapshot, height: int) -> RenderableType:
    rows = snap.timing or []
    table = Table(title="stage seconds per harness (all steps, the latest step, rollouts outside steps)")
    for col in ("scope", "harness", "stage"):
        table.add_column(col)
    for col in ("n", "p50", "p90", "max"):
        table.add_column(col, justify="right")
    for r in rows[: max(5, height - 6)]:
        table.add_row(r.scope, r.harness, r.stage, str(r.n), f"{r.p50:.2f}", f"{r.p90:.2f}", f"{r.max:.2f}")
    if not rows:
        return Text("no stage timings yet: no rollout has finished a stage")
    return table


def tasks(snap: Snapshot, width: int, height: int, offset: int) -> RenderableType:
    tk = snap.tasks
    if tk is None or not tk.tasks:
        return Text("no finished rollouts yet")
    name_w = min(40, max(len(t.instance_id) for t in tk.tasks))
    cells_w = max(8, width - name_w - 30)
    t = Text(no_wrap=True, overflow="crop")
    t.append(
        f"{len(tk.tasks)} tasks; zero-variance groups {tk.zero_variance_groups}/{tk.groups} (no GRPO signal: "
        "marked ∅);  ✓ solved  · failed  ✗ infrastructure\n",
        "bold",
    )
    if tk.stopped_signal or tk.retired:
        t.append(f"{tk.stopped_signal} stopped carrying signal (their last {STOPPED_SIGNAL}+ groups ∅ in a row: "
                 f"∅×n); {len(tk.retired)} retired\n", "magenta")
    rows = tk.tasks[offset : offset + max(3, height - 4)]
    for row in rows:
        t.append(f"{row.instance_id[:name_w]:<{name_w}} ")
        t.append(f"{_fmt(row.solve_rate, '>4.0%') if row.solve_rate is not None else '   -'} ")
        t.append("∅" if row.zero_variance_groups else " ", "magenta")
        t.append(" ")
        cells = row.cells[-cells_w:]
        for ch in cells:
            t.append(ch, OUTCOME_STYLE.get(ch, ""))
        t.append(f" {row.attempts}", "dim")
        if row.zero_variance_streak >= STOPPED_SIGNAL:
            t.append(f" ∅×{row.zero_variance_streak}", "magenta")
        if row.retired:
            t.append(" retired", "red")
        t.append("\n")
    if offset + len(rows) < len(tk.tasks):
        t.append(f"... {len(tk.tasks) - offset - len(rows)} more (↓ to scroll)", "dim")
    return t


def consistency(snap: Snapshot, height: int, selected: int | None = None) -> RenderableType:
    c = snap.consistency
    if c is None:
        return Text("")
    if not c.steps:
        return Text(c.note)
    kinds = sorted({k for s in c.steps for k in s.by_kind})
    table = Table(title=f"rollout vs trainer log-probs per step (k3 KL > {c.kl_warn:g} in red)")
    table.add_column("step", justify="right")
    for col in ("pearson", "mean|Δ|", "p99|Δ|", "k3 KL"):
        table.add_column(col, justify="right")
    for k in kinds:
        table.add_column(f"{k} KL", justify="right")
    for s in c.steps[-max(3, height // 2 - 4) :]:
        o = s.overall
        table.add_row(
            str(s.step),
            _fmt(o.get("pearson"), ".5f"),
            _fmt(o.get("mean_abs_diff"), ".2e"),
            _fmt(o.get("p99_abs_diff"), ".2e"),
            _fmt(o.get("k3_kl"), ".2e"),
            *(_fmt(s.by_kind.get(k, {}).get("k3_kl"), ".2e") for k in kinds),
            style="red" if s.warn else "",
        )
    worst = Text("\nworst steps by k3 KL: ", "bold")
    for n, s in enumerate(c.worst):
        worst.append(
            ("  " if n else "") + f"step {s.step} ({s.overall.get('k3_kl', 0.0):.2e})",
            "reverse" if n == selected else "",
        )
    if selected is not None:
        worst.append("   (↑/↓ pick a step, enter lists its rollouts)", "dim")
    worst.append("\n" + c.note, "dim")
    return Group(table, worst)


def rollouts(
    items: list[RolloutBrief] | None, height: int, selected: int, query: str | None
) -> RenderableType:
    items = items or []
    title = f"rollouts matching '{query}'" if query else "latest finished rollouts"
    table = Table(title=f"{title} ({len(items)}; enter opens the selected one)")
    for col in ("rollout", "task", "harness", "step", "termination", "reward", "turns"):
        table.add_column(col)
    start = max(0, selected - max(3, height - 8) + 1)
    for i, b in enumerate(items[start : start + max(3, height - 8)], start):
        table.add_row(
            Text(b.rollout_id),
            Text(b.instance_id),
            Text(b.harness),
            "-" if b.step is None else str(b.step),
            Text(b.termination or "running", "yellow" if b.infrastructure else ""),
            _fmt(b.reward, ".2f"),
            str(b.turns),
            style="reverse" if i == selected else "",
        )
    if not items:
        return Text(f"no rollouts {'match ' + repr(query) if query else 'finished yet'}")
    return table


def drill_lines(d: RolloutDetail) -> list[tuple[str, str]]:
    """The drill-down as (text, style) lines, for scrolling."""
    lines: list[tuple[str, str]] = [(f"rollout {d.rollout.rollout_id}   folder {d.folder}", "bold")]
    lines += [("timeline", "bold")] + [(x, "") for x in d.timeline]
    for p in d.problems:
        lines.append((p, "red"))
    if d.note:
        lines.append((d.note, "dim"))
    if d.artifacts:
        lines.append(("artifacts: " + ", ".join(f"{k} ({v:,} B)" for k, v in d.artifacts.items()), "dim"))
    if d.turns:
        lines.append(("turns (tool calls)", "bold"))
        for tb in d.turns:
            tools = ",".join(tb.tools) or "-"
            line = f"  turn {tb.turn} {tb.render_mode:<8} {tb.output_tokens:>5} tokens  tools {tools}  "
            line += repr(tb.text[:100])
            lines.append((line, ""))
    if d.transcript:
        lines.append(("CLI transcript (tail)", "bold"))
        lines += [("  " + x[:220], "") for x in d.transcript]
    if d.patch is not None:
        lines.append(("patch.diff", "bold"))
        lines += [
            ("  " + x, "green" if x.startswith("+") else "red" if x.startswith("-") else "")
            for x in d.patch.splitlines()[:200]
        ]
    if d.grader_log is not None:
        lines.append(("grader.log (tail)", "bold"))
        lines += [("  " + x, "") for x in d.grader_log.splitlines()[-60:]]
    return lines


def drill(lines: list[tuple[str, str]], offset: int, height: int, wrap: bool = False) -> RenderableType:
    """``height`` lines from ``offset``; on screen each is cut at the edge (a wrapped line would push the rest
    off), in a printed snapshot (``wrap``) nothing is lost."""
    t = Text(no_wrap=not wrap, overflow="fold" if wrap else "crop")
    for text, style in lines[offset : offset + max(5, height)]:
        t.append(text + "\n", style)
    return t


def behaviour(snap: Snapshot) -> RenderableType:
    rows = snap.behaviour or []
    if not rows:
        return Text("no finished rollouts yet")
    table = Table(
        title="behaviour per harness (turns over all finished rollouts; tools and output lengths from "
        "the latest rollouts' turn records)"
    )
    for col in (
        "harness",
        "rollouts",
        "turns mean/p50/p90/max",
        "turns histogram",
        "tools",
        "calls/turn",
        "output tokens p50/p90",
    ):
        table.add_column(col)
    for b in rows:
        hist = " ".join(f"{k}:{v}" for k, v in b.turns_histogram.items())
        tools = ", ".join(f"{k} {v}" for k, v in b.tools.items()) or (
            "-" if b.records_read else "no turn records"
        )
        table.add_row(
            Text(b.harness),
            str(b.rollouts),
            f"{b.turns_mean:.1f}/{b.turns_p50:.0f}/{b.turns_p90:.0f}/{b.turns_max}",
            hist,
            Text(tools),
            _fmt(b.tool_calls_per_turn, ".2f"),
            f"{_fmt(b.output_tokens_p50, '.0f')}/{_fmt(b.output_tokens_p90, '.0f')}",
        )
    return table


def pipeline(snap: Snapshot, height: int) -> RenderableType:
    p = snap.pipeline
    if p is None or not p.steps:
        return Text("no finished step yet")
    table = Table(title="where each step's time went (waiting for rollouts, train, weight sync)")
    for col in (
        "step",
        "rollout s",
        "train s",
        "sync s",
        "trainer idle",
        "rollout idle",
        "excluded",
        "refills",
        "weights",
    ):
        table.add_column(col, justify="right")
    for s in p.steps[-max(3, height - 8) :]:
        table.add_row(
            str(s.step),
            _fmt(s.time_rollout_s, ".1f"),
            _fmt(s.time_train_s, ".1f"),
            _fmt(s.time_sync_s, ".2f"),
            _fmt(s.trainer_idle, ".0%"),
            _fmt(s.rollout_idle, ".0%"),
            str(s.excluded),
            str(s.refills),
            "-" if s.weight_version is None else str(s.weight_version),
        )
    t = Text(f"\nbottleneck (last 5 steps): {p.bottleneck or '-'}", "bold")
    if p.mode:
        t.append(f"\nloop: {p.mode}")
    t.append("\npolicy lag (last step): " + (", ".join(f"{k} {v:.2f}" for k, v in p.staleness.items())
                                            or "not recorded by this run"))
    return Group(table, t)


def compare(c: Comparison | None, width: int, height: int) -> RenderableType:
    if c is None:
        return Text("start with --compare OTHER_RUN to compare two runs")
    w = max(10, (width - 40))
    t = Text(f"A = {c.a}\nB = {c.b}\n", "bold")
    for label, a, b in (("reward", c.reward_a, c.reward_b), ("solve rate", c.solve_a, c.solve_b)):
        hi = max([p.value for p in a + b], default=1.0)
        # pad 14: "solve rate A" is 12 characters, and a label must not run into its sparkline
        t.append_text(_curve(f"{label} A", a, w, 0.0, hi, pad=14)).append("\n")
        t.append_text(_curve(f"{label} B", b, w, 0.0, hi, pad=14)).append("\n")
    t.append(
        f"\nper-task solve rate B - A ({len(c.deltas)} tasks in both; up {c.up}, down {c.down}, "
        f"median up {_fmt(c.median_up, '+.3f')}, median down {_fmt(c.median_down, '+.3f')})\n",
        "bold",
    )
    for d in c.deltas[: max(3, height - 14)]:
        t.append(f"{d.instance_id[:48]:<48} {d.a:5.2f} → {d.b:5.2f}  ")
        t.append(f"{d.delta:+.2f}\n", "green" if d.delta > 0 else "red" if d.delta < 0 else "")
    return t
