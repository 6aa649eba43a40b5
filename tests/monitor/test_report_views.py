"""`lego report`'s views, each against what the run recorded: integer step axes, stage timing under the step
that trained each rollout, training curves from the metrics rows, SFT and rollout-check runs, multi-stage
parents, the rollout drill-down (grader verdict per test), and, measured in headless Chromium, readable task
labels at 100 tasks and no label drawn over another label or a value."""

from __future__ import annotations

import html as html_lib
import json
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from monitor_runs import CHECK, TOY
from support.synthetic_run import write_synthetic_run
from typer.testing import CliRunner

from lego_rl.cli.main import app
from lego_rl.monitor import report_curves
from lego_rl.monitor.snapshot import timing as stage_timing
from lego_rl.monitor.state import RunState
from lego_rl.monitor.svg import line_chart, stacked_bars
from lego_rl.runstore import RunDir, StepMetrics
from lego_rl.runstore import metric_catalog as mc
from lego_rl.runstore.events import (
    BatchTaken,
    RolloutFinished,
    RolloutStarted,
    StageFinished,
    StepFinished,
    StepStarted,
    TrainingFinished,
)

CHROMIUM = shutil.which("chromium-headless-shell") or shutil.which("chromium")
runner = CliRunner()
X_TICK = re.compile(r'<text x="[0-9.]+" y="(\d+)" text-anchor="middle">([^<]*)</text>')


def _report(run: Path, out: Path, *extra: str) -> str:
    res = runner.invoke(app, ["report", str(run), "--html", str(out), *extra])
    assert res.exit_code == 0, res.output
    return out.read_text(encoding="utf-8")


def _x_labels(svg: str) -> list[str]:
    """The x-axis tick labels of one chart (the axis title, ``step``, left out)."""
    return [label for _, label in X_TICK.findall(svg) if label != "step"]


def test_step_axes_carry_integer_ticks_only() -> None:
    two = line_chart("two steps", {"reward": [(0.0, 0.1), (1.0, 0.3)]})
    assert _x_labels(two) == ["0", "1"]
    one = line_chart("one step", {"reward": [(3.0, 0.1)]})
    assert _x_labels(one) == ["3"]
    bars = stacked_bars("bars", [0, 1], {"a": [1.0, 2.0]})
    assert _x_labels(bars) == ["0", "1"]  # the bars' half-step margins carry no -0.5 / 1.5 tick
    long = _x_labels(line_chart("long", {"loss": [(float(s), 1.0) for s in range(500)]}))
    assert long and all(re.fullmatch(r"\d+", t) for t in long) and len(long) <= 8
    # a constant tiny value (lr 1e-6) is drawn on its own scale, not at 0 on a -0.5 .. 0.5 axis
    lr = line_chart("lr", {"lr": [(0.0, 1e-6), (1.0, 1e-6)]})
    assert "1.00e-06" in lr and ">0.5<" not in lr


def _async_run(root: Path) -> Path:
    """Rollouts started while step 0 was open, taken by step 1's batch (the asynchronous scheduler)."""
    run = RunDir.open(root, config={})
    emit = run.events.emit
    emit(StepStarted(ts=10.0, step=0, weight_version=0))
    for i, agent_s in enumerate((5.0, 7.0)):
        rid = f"r{i}"
        emit(RolloutStarted(ts=11.0, rollout_id=rid, instance_id="t", harness="claude_code", group_index=0, index=i))
        emit(StageFinished(ts=12.0, rollout_id=rid, stage="agent", status="ok", duration_s=agent_s))
        emit(RolloutFinished(ts=13.0, rollout_id=rid, termination="completed", reward=float(i), detail="",
                             infrastructure_failure=False, timings={}, turns=2))
    emit(StepFinished(ts=14.0, step=0, admitted_rollouts=0, trained=False, weight_version=0))
    emit(StepStarted(ts=15.0, step=1, weight_version=0))
    emit(BatchTaken(ts=15.0, step=1, rollout_ids=["r0", "r1"], prompt_ids=["t"], started_policies=[0, 0],
                    wait_s=0.0))
    emit(StepFinished(ts=16.0, step=1, admitted_rollouts=2, trained=True, weight_version=1))
    emit(TrainingFinished(ts=17.0, status="completed", steps_done=2))
    run.close()
    return root


def test_stage_timing_is_drawn_under_the_step_that_trained_each_rollout(tmp_path: Path) -> None:
    """In the report and the monitor alike (``RunState.stage_times``: the Timing view)."""
    state = RunState(_async_run(tmp_path / "run"))
    state.refresh()
    assert report_curves.stage_series(state) == {"agent": [(1.0, 5.0)]}  # p50 (nearest rank) of 5 and 7
    # the monitor's Timing view files them there too (not under step 0, open when they ran): both agree
    assert state.stage_times == {(1, "claude_code", "agent"): [5.0, 7.0]}
    rows = {(t.scope, t.stage): (t.n, t.p50) for t in stage_timing(state)}
    assert rows == {("all steps", "agent"): (2, 5.0), ("step 1", "agent"): (2, 5.0)}
    html = _report(tmp_path / "run", tmp_path / "r.html")
    timing = re.search(r'<svg[^>]*aria-label="stage p50 seconds per step.*?</svg>', html, flags=re.DOTALL)
    assert timing is not None and _x_labels(timing.group(0)) == ["1"]
    # the group's spread is filed under step 1 as well: rewards 0 and 1, one group with signal
    spread = html[html.index('<section id="rewards">'):html.index('<section id="terminations">')]
    assert "<h3>groups of step 1</h3>" in spread and "0.50" in spread


def test_training_curves_are_the_metrics_rows_values(tmp_path: Path) -> None:
    html = _report(TOY, tmp_path / "toy.html")
    training = html[html.index('<section id="training">'):html.index('<section id="rewards">')]
    rows = [json.loads(line) for line in (TOY / "metrics.jsonl").read_text().splitlines()]
    for title, metric in (("loss (nats/token)", mc.LOSS), ("grad norm (before clipping)", mc.GRAD_NORM),
                          ("entropy (nats)", mc.ENTROPY), ("learning rate", mc.LR),
                          ("importance ratios", mc.RATIO_MEAN)):
        chart = re.search(rf'<svg[^>]*aria-label="{re.escape(title)}".*?</svg>', training, flags=re.DOTALL)
        assert chart is not None, title
        assert f"<title>{metric}</title>{metric}</text>" in chart.group(0)  # its legend names the metric
        points = re.search(r'<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="([^"]+)"',
                           chart.group(0))
        assert points is not None
        trained = [r for r in rows if metric in r["values"]]
        assert len(points.group(1).split()) == len(trained)  # one point per row that holds the metric
    assert "clip_frac_low" in training and "clip_frac_high" in training
    # declared for this run kind, not written by this run: said so, with when it would be
    assert "<code>kl</code>: written when loss.kl_coef &gt; 0" in training
    # every other value the rows hold is drawn somewhere in the report
    other = html[html.index('<section id="metrics">'):]
    for name in ("tokens", "token_weight", "optimizer_steps", "sampled_tokens", "admitted_rollouts"):
        assert f'aria-label="{name}' in other, name


def _sft_run(root: Path, t0: float) -> Path:
    # as `lego train --sft` records it: the SFT steps are train.sft_steps (train.num_rollout counts GRPO steps)
    run = RunDir.open(root, config={"train": {"num_rollout": {"value": 2, "source": "lego.toml"},
                                              "sft_steps": {"value": 3, "source": "--steps"},
                                              "sft_data": {"value": "demos.jsonl", "source": "--sft"}}})
    for step, loss in enumerate((8.2, 6.1, 4.0)):
        run.events.emit(StepStarted(ts=t0 + step, step=step, weight_version=step))
        values = mc.declared_values(mc.SFT, {mc.LOSS: loss, mc.GRAD_NORM: 3.0, mc.LR: 1e-5,
                                             mc.DEMONSTRATIONS: 4.0, mc.EPOCH: 0.0, mc.TIME_TRAIN_S: 0.5})
        run.metrics.append(StepMetrics(step=step, started_at=t0 + step, finished_at=t0 + step + 0.5,
                                       values=values))
        run.events.emit(StepFinished(ts=t0 + step + 0.5, step=step, admitted_rollouts=4, trained=True,
                                     weight_version=step + 1))
    run.events.emit(TrainingFinished(ts=t0 + 3, status="completed", steps_done=3))
    run.close()
    # RunDir.open stamped its own run_started with the clock: date it t0 like the rest of this run
    events = root / "events.jsonl"
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    events.write_text("".join(json.dumps({**e, "ts": t0} if e["kind"] == "run_started" else e) + "\n"
                              for e in lines))
    return root


def test_an_sft_run_shows_its_loss_curve(tmp_path: Path) -> None:
    html = _report(_sft_run(tmp_path / "sft", 100.0), tmp_path / "sft.html")
    assert "<p>sft run, finished (completed)" in html
    ids = re.findall(r'<section id="([a-z-]+)">', html)
    assert ids == ["overview", "training", "pipeline", "metrics"]  # no rollout views for a run without any
    loss = re.search(r'<svg[^>]*aria-label="loss \(nats/token\)".*?</svg>', html, flags=re.DOTALL)
    assert loss is not None and _x_labels(loss.group(0)) == ["0", "1", "2"]
    assert "8.2" in loss.group(0) or "8" in _y_labels(loss.group(0))
    assert "3 of 3 (latest: step 2" in html
    assert 'aria-label="demonstrations' in html and 'aria-label="epoch' in html


def _y_labels(svg: str) -> list[str]:
    return re.findall(r'<text x="[0-9.]+" y="[0-9.]+" text-anchor="end">([^<]*)</text>', svg)


def test_a_rollout_check_run_shows_its_rewarded_rollout_opened_up(tmp_path: Path) -> None:
    html = _report(CHECK, tmp_path / "check.html")
    ids = re.findall(r'<section id="([a-z-]+)">', html)
    assert ids == ["overview", "rollouts", "terminations", "timing", "tasks", "behaviour"]
    assert "rollouts outside training steps</td><td class=\"\">1; rewarded 1, solved 1, reward mean 1.000" in html
    drill = html[html.index('<details class="rollout" id="rollout-lego-example-median-s0" open>'):]
    assert "lego-example-median-s0: lego-example-median on claude_code, completed, reward 1.0, 2 turns" in drill
    assert "<h4>turns and tool calls</h4>" in drill and "<td class=\"l\">Bash</td>" in drill
    assert "tool_use Bash" in drill  # the CLI transcript's excerpt
    assert "<b>grader verdict:</b> SOLVED (baseline; exit status 1 unused)" in drill
    # the grader's verdict per test, with the baseline beside it (grader.log's per-test sections)
    for test, after, base in (("test_median.MedianTest.test_even", "PASSED", "FAILED"),
                              ("test_median.MedianTest.test_empty", "PASSED", "ERROR"),
                              ("test_mean.MeanTest.test_mean", "PASSED", "PASSED")):
        assert f'<td class="l">{test}</td><td class="ok">{after}</td><td>{base}</td>' in drill
    assert "stats/center.py" in drill  # the patch excerpt


def test_a_multi_stage_parent_gets_a_part_per_stage_in_the_order_they_began(tmp_path: Path) -> None:
    parent = tmp_path / "main-20261202"
    shutil.copytree(TOY, parent / "grpo")  # began at 1796045464
    shutil.copytree(CHECK, parent / "demos")  # began at 1796045435
    _sft_run(parent / "sft", 1796045450.0)
    html = _report(parent, tmp_path / "main.html")
    assert re.findall(r'<section class="stage" id="([a-z]+)">', html) == ["demos", "sft", "grpo"]
    assert "3 stages: demos, sft, grpo" in html
    ids = re.findall(r'<section id="([a-z-]+)">', html)
    assert "demos-rollouts" in ids and "sft-training" in ids and "grpo-consistency" in ids
    assert "sft-tasks" not in ids and "demos-training" not in ids
    assert len(ids) == len(set(ids))  # every link target is unique on the page
    res = runner.invoke(app, ["report", str(parent), "--html", str(tmp_path / "c.html"), "--compare", str(TOY)])
    assert res.exit_code == 2 and "--compare takes single runs" in " ".join(res.output.split())


def test_the_drill_down_is_bounded_on_a_long_run(synthetic: Path, tmp_path: Path) -> None:
    html = _report(synthetic, tmp_path / "syn.html")
    opened = html.count('<details class="rollout"')
    state = RunState(synthetic)
    state.refresh()
    assert 1 <= opened <= 12 and opened >= min(12, len(state.examples))
    listed = html[html.index('<section id="rollouts">'):html.index('<section id="metrics">')]
    assert listed.count("<tr>") <= 30 + 1 + 12 * 40  # the list, and each opened rollout's bounded tables


MEASURE = """
<script>
const out = {texts: [], overlaps: [], outside: [], onCells: [], scale: []};
const box = (e) => e.getBoundingClientRect();
const hit = (a, b) => Math.min(a.right, b.right) - Math.max(a.left, b.left) > 1 &&
                      Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 1;
for (const svg of document.querySelectorAll('svg')) {
  const s = box(svg), vb = svg.viewBox.baseVal;
  out.scale.push(s.width / vb.width);
  const texts = [...svg.querySelectorAll('text')].filter(t => t.textContent.trim());
  const boxes = texts.map(box);
  const label = svg.getAttribute('aria-label');
  boxes.forEach((b, i) => {
    if (b.left < s.left - 1 || b.right > s.right + 1 || b.top < s.top - 1 || b.bottom > s.bottom + 1)
      out.outside.push([label, texts[i].textContent]);
    for (let j = i + 1; j < boxes.length; j++)
      if (hit(b, boxes[j])) out.overlaps.push([label, texts[i].textContent, texts[j].textContent]);
  });
  if (label === 'task grid') {
    out.texts = boxes.map(b => b.height);
    const cells = [...svg.querySelectorAll('rect')].map(box);
    boxes.forEach((b, i) => { if (cells.some(c => hit(b, c))) out.onCells.push(texts[i].textContent); });
  }
}
document.body.setAttribute('data-measured', JSON.stringify(out));
</script>
"""


def _measure(page: Path) -> dict[str, list]:  # type: ignore[type-arg]
    """What Chromium lays out: text boxes per SVG (a script added to a copy of the page measures them)."""
    assert CHROMIUM is not None
    probe = page.with_name("probe-" + page.name)
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    dom = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--proxy-server=http://127.0.0.1:9",
         "--window-size=1200,900", "--dump-dom", probe.as_uri()],
        check=True, capture_output=True, text=True, timeout=120,
    ).stdout
    found = re.search(r'data-measured="([^"]*)"', dom)
    assert found is not None, dom[-2000:]
    return json.loads(html_lib.unescape(found.group(1)))  # type: ignore[no-any-return]


@pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium: apt-get install chromium-headless-shell")
def test_chromium_draws_readable_task_labels_at_100_tasks_and_no_label_over_another(
    tmp_path: Path, copy_run: Callable[[Path], Path]
) -> None:
    run = tmp_path / "hundred"
    write_synthetic_run(run, steps=12, groups=10, group_size=4, tasks=100, artifacts=4)
    page = tmp_path / "hundred.html"
    _report(run, page, "--compare", str(copy_run(TOY)))
    m = _measure(page)
    assert len(m["texts"]) >= 200  # a name and a solve rate per task (and the marks)
    assert min(m["texts"]) >= 12  # px as drawn: the old grid's 8-unit font drew about 6 px
    assert all(abs(s - 1.0) < 0.01 for s in m["scale"])  # no chart is shrunk to fit the page
    assert m["onCells"] == []  # no task label runs into the grid's cells
    assert m["overlaps"] == [] and m["outside"] == []  # compare legends, ticks, titles: apart and inside


def test_the_report_reads_in_time_proportional_to_the_run(tmp_path: Path) -> None:
    """Guard against a quadratic view: the 100-task run's report takes well under a second per 1,000
    rollouts (the slow scale test measures 10,000)."""
    run = tmp_path / "r"
    write_synthetic_run(run, steps=12, groups=10, group_size=4, tasks=100, artifacts=4)
    t0 = time.process_time()
    _report(run, tmp_path / "r.html")
    assert time.process_time() - t0 < 5.0


@pytest.mark.parametrize("kind", [mc.TRAIN, mc.SFT])
def test_every_metric_a_run_can_write_is_drawn(tmp_path: Path, kind: mc.RunKind) -> None:
    """A row holding every metric declared for the run kind (a member of each family) leaves nothing undrawn:
    each name is a legend entry, or (consistency, tokens by age...) its field titles a chart and its member a
    legend."""
    run = RunDir.open(tmp_path / "all", config={})
    names = [name for m in mc.written_by(kind)
             for name in ([m.key(c) for c in (m.choices or ("0", "1"))] if m.is_family else [str(m)])]
    for step in range(2):
        # The same value for every name, one per step, in (0, 1): Pearson is drawn as 1 - r on a log scale, and
        # nothing depends on where a metric sits in the catalog (declarations may be added anywhere).
        value = 0.25 + step / 2
        run.metrics.append(StepMetrics(step=step, started_at=float(step), finished_at=step + 0.5,
                                       values=mc.declared_values(kind, dict.fromkeys(names, value))))
    run.close()
    html = _report(tmp_path / "all", tmp_path / "all.html")
    assert f"<p>{kind.value} run," in html
    legends = set(re.findall(r"<title>([^<]+)</title>[^<]+</text>", html))
    titles = set(re.findall(r'aria-label="([^"]+)"', html))
    for m in mc.written_by(kind):
        if m in mc.CONSISTENCY.values() or m in mc.CONSISTENCY_BY_SPLIT.values():
            field = str(m).rsplit("/", 1)[1]
            shown_as = {"k3_kl": "k3 KL", "pearson": "Pearson", "tokens": "tokens compared"}.get(field, field)
            assert any(t.startswith(shown_as) or f" {shown_as} " in t for t in titles), m
            assert {"overall", *mc.CONSISTENCY_SPLITS} <= legends
        elif m is mc.TOKENS_AGE:
            assert {"age 0", "age 1"} <= legends
        elif m in (mc.REWARD_MEAN, mc.SOLVE_RATE):
            assert {"reward mean", "solve rate"} <= legends
        elif m in (mc.TIME_ROLLOUT_S, mc.TIME_TRAIN_S, mc.TIME_SYNC_S):
            assert {"rollouts", "train", "sync"} & legends
        else:
            assert str(m) in legends, m
    assert "undeclared names" not in html
    if CHROMIUM is not None and kind is mc.TRAIN:  # every chart there is: no label over another or cut off
        m = _measure(tmp_path / "all.html")
        assert m["overlaps"] == [] and m["outside"] == [] and all(abs(s - 1.0) < 0.01 for s in m["scale"])


def test_the_tokenisation_section_draws_each_figure_and_warns_of_a_false_fork(tmp_path: Path) -> None:
    run = RunDir.open(tmp_path / "run", config={})
    for step, (forks, failures) in enumerate([(0.0, 0.0), (3.0, 1.0)]):
        values = {mc.SEGMENTS_PER_ROLLOUT: 1.0 + forks, mc.SEGMENTS_PER_ROLLOUT_MAX: 1.0 + forks,
                  mc.FALSE_FORKS: forks, mc.REPEATED_PROMPT_TOKENS: 100 * forks, mc.RENDER_FALLBACKS: 0.0,
                  mc.PARSE_FAILURES: failures}
        run.metrics.append(StepMetrics(step=step, started_at=float(step), finished_at=step + 0.5,
                                       values=mc.declared_values(mc.TRAIN, values)))
    run.close()
    html = _report(tmp_path / "run", tmp_path / "r.html")
    section = html[html.index('<section id="tokenisation">'):html.index('<section id="pipeline">')]
    assert "over the run: false_forks 3, parse_failures 1 (each should be 0" in section
    legends = set(re.findall(r"<title>([^<]+)</title>[^<]+</text>", section))
    assert {"segments_per_rollout", "segments_per_rollout_max", "false_forks", "parse_failures",
            "render_fallbacks", "repeated_prompt_tokens"} <= legends
    assert "false_forks" not in html[html.index('<section id="metrics">'):]  # drawn once, not again in "other"
