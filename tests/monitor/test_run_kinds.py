"""Every run kind in the monitor, one step-numbering convention, and the Curves view.

* an asynchronous GRPO run (stage_runs.write_async_train): the rollout opened says the step it started in, and
  separately the step whose batch took it; the task grid files each group under the step that trained it, so
  its zero-variance count agrees with the metrics rows; "steps done 2/2" as the CLI's progress line says;
  the stale lock and the resume override are shown;
* an SFT run: its loss curve, no reward line; a rollout-check run: the demo rollout's reward;
* the main job's folder (demos/, sft/, grpo/): the stages are listed and one opens (``--once``, ``--json`` and
  the live TUI: test_tui_tmux).
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

from monitor_runs import CHECK
from rich.console import Console
from stage_runs import SFT_LOSSES, write_async_train, write_main_job, write_sft
from typer.testing import CliRunner

from lego_rl.cli.main import app
from lego_rl.monitor import views
from lego_rl.monitor.app import Monitor
from lego_rl.monitor.drill import detail
from lego_rl.monitor.snapshot import CURVES, build
from lego_rl.monitor.state import RunState
from lego_rl.runstore import RunDir, StepMetrics
from lego_rl.runstore import metric_catalog as mc


def _ok(args: list[str]) -> str:
    res = CliRunner().invoke(app, ["monitor", *args], env={"COLUMNS": "150"})
    assert res.exit_code == 0, res.output
    return res.output


def _state(root: Path) -> RunState:
    state = RunState(root)
    state.refresh()
    return state


def _text(renderable: object, width: int = 150) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def test_an_async_rollout_says_the_step_it_started_in_and_the_step_that_trained_it(tmp_path: Path) -> None:
    state = _state(write_async_train(tmp_path / "grpo"))
    d = detail(state, "g1-r0")
    assert d is not None
    assert d.timeline[0].endswith("group 1 #0, during step 0"), d.timeline  # not "step 1": it started in step 0
    assert any(line.strip() == "in step 1's batch (sampled from policy 0)" for line in d.timeline), d.timeline
    assert d.rollout.step == 1
    first = detail(state, "g0-r0")
    assert first is not None and first.timeline[0].endswith("during step 0")
    assert any(line.strip() == "in step 0's batch (sampled from policy 0)" for line in first.timeline)


def test_the_task_grid_files_a_group_under_the_step_that_trained_it(tmp_path: Path) -> None:
    root = write_async_train(tmp_path / "grpo")
    state = _state(root)
    # both groups of task-t: step 0's (started and finished in step 0) and step 1's (started in step 0)
    assert state.tasks["task-t"].groups == {0: [0.0, 0.0], 1: [0.0, 0.0]}
    snap = build(state, now=time.time(), kl_warn=1e-3, sections=["tasks", "overview", "pipeline", "curves"])
    assert snap.tasks is not None
    rows = [json.loads(line) for line in (root / "metrics.jsonl").read_text().splitlines()]
    assert snap.tasks.zero_variance_groups == sum(r["values"]["zero_variance_groups"] for r in rows) == 2
    assert snap.tasks.groups == 2


def test_a_finished_two_step_run_says_steps_done_2_of_2_and_its_mode_and_events(tmp_path: Path) -> None:
    state = _state(write_async_train(tmp_path / "grpo"))
    snap = build(state, now=time.time(), kl_warn=1e-3)
    assert snap.overview is not None and snap.pipeline is not None
    assert (snap.overview.step, snap.overview.steps_done, snap.overview.steps_total) == (1, 2, 2)
    text = _text(views.overview(snap, 150))
    assert "steps done 2/2 (last: step 1)" in text and "step 1/2" not in text
    assert "policy_lag_mean 1.00, policy_lag_max 1.00; asynchronous loop (rollout.max_staleness 1)" in text
    assert "stale lock taken over: the previous holder (pid 4242 on node-7)" in text
    assert "run.lock; continuing with step 0" in text
    assert "resume override from step 1: train.lr 1e-06 → 2e-06" in text
    pipe = _text(views.pipeline(snap, 40))
    assert "loop: asynchronous (rollout.max_staleness 1)" in pipe and " synchronous" not in pipe
    assert any("resume override" in n.text for n in snap.notes)


def test_the_curves_view_draws_training_figures_lag_spread_and_termination_mix_on_integer_steps(
    tmp_path: Path,
) -> None:
    state = _state(write_async_train(tmp_path / "grpo"))
    snap = build(state, now=time.time(), kl_warn=1e-3, sections=["curves"])
    series = {s.name: s for s in snap.curves or []}
    assert (series["loss"].steps, series["loss"].figures) == ([0, 1], [0.5, 0.4])
    assert (series["policy_lag_mean"].steps, series["policy_lag_mean"].figures) == ([0, 1], [0.0, 1.0])
    assert series["reward_spread/zero_share"].figures == [1.0, 1.0]
    assert series["termination/completed"].figures == [1.0, 1.0]
    assert "kl" not in series  # not written by this run: no empty curve
    text = _text(views.curves(snap, 150, 100))
    for line in ("loss", "grad_norm", "entropy", "lr", "policy_lag_max", "time_rollout_s", "completed"):
        assert f"  {line} " in text, line
    assert "steps 0-1" in text and "0.5" not in text.split("steps 0-1")[-1]  # integer step spans only


def test_every_declared_metric_has_a_view() -> None:
    shown = {m for _, metrics in CURVES for m in metrics} | set(mc.CONSISTENCY.values())
    shown |= set(mc.CONSISTENCY_BY_SPLIT.values()) | {mc.TOKENS_AGE}
    assert [m for m in mc.METRICS if m not in shown] == []


def test_an_sft_run_shows_its_loss_and_a_rollout_check_run_its_reward(tmp_path: Path) -> None:
    sft = _state(write_sft(tmp_path / "sft"))
    snap = build(sft, now=time.time(), kl_warn=1e-3)
    assert snap.run.kind == "sft" and snap.overview is not None
    assert [p.value for p in snap.overview.loss] == list(SFT_LOSSES)
    text = _text(views.overview(snap, 150))
    assert "steps done 3/3 (last: step 2)" in text and "last 4.000 (step 2)" in text
    assert "reward" not in text and "staleness" not in text  # SFT samples nothing
    check = build(_state(CHECK), now=time.time(), kl_warn=1e-3, sections=["overview"])
    text = _text(views.overview(check, 150))
    assert check.run.kind == "rollout-check"
    assert "reward      mean 1.000 over 1 graded rollouts, 1 rewarded (> 0)" in text and "no data yet" not in text


def test_the_main_jobs_folder_lists_its_stages_once_and_as_json(tmp_path: Path) -> None:
    parent = write_main_job(tmp_path / "main-1")
    out = _ok([str(parent), "--once"])
    assert "holds no run (" not in out and "waiting for the run" not in out
    rows = [line for line in out.splitlines() if line.startswith("│ ")][:3]
    assert [r.split("│")[1].strip() for r in rows] == ["demos", "sft", "grpo"]
    assert "rollout-check" in rows[0] and "sft" in rows[1] and "train" in rows[2]
    assert "stage sft" in out and "last 4.000 (step 2)" in out
    data = json.loads(_ok([str(parent), "--json"]))
    assert [(s["name"], s["kind"], s["steps_done"]) for s in data["stages"]] == [
        ("demos", "rollout-check", None), ("sft", "sft", 3), ("grpo", "train", 2)]
    assert data["stages"][2]["snapshot"]["overview"]["staleness"] == {"policy_lag_mean": 1.0, "policy_lag_max": 1.0}


def test_a_stage_appearing_later_is_picked_up(tmp_path: Path) -> None:
    parent = tmp_path / "main-2"
    parent.mkdir()
    mon = Monitor(parent, kl_warn=1e-3)
    mon.refresh()
    assert not mon.listing_stages  # nothing yet: the folder's own note says so
    write_sft(parent / "sft")
    mon.refresh()
    assert mon.listing_stages and [i.name for i in mon.stage_infos] == ["sft"]
    assert "sft" in _text(mon.render(150, 40))
    mon.key("\r")
    assert mon.stage_open == parent / "sft" and mon.state.kind == "sft"
    mon.key("\x1b")
    assert mon.listing_stages


def _tokenisation_run(root: Path, false_forks: tuple[float, float]) -> Path:
    """Two steps of a train run's metrics rows with the tokenisation figures (no events: the Curves view and the
    Overview read the rows)."""
    run = RunDir.open(root, config={})
    for step, forks in enumerate(false_forks):
        values = {mc.LOSS: 0.5, mc.SEGMENTS_PER_ROLLOUT: 1.0 + forks / 4, mc.SEGMENTS_PER_ROLLOUT_MAX: 1.0 + forks,
                  mc.FALSE_FORKS: forks, mc.REPEATED_PROMPT_TOKENS: 300.0 * forks, mc.RENDER_FALLBACKS: 0.0,
                  mc.PARSE_FAILURES: 0.0}
        run.metrics.append(StepMetrics(step=step, started_at=float(step), finished_at=step + 0.5,
                                       values=mc.declared_values(mc.TRAIN, values)))
    run.close()
    return root


def test_tokenisation_health_has_a_curves_panel_and_a_false_fork_is_an_overview_warning(tmp_path: Path) -> None:
    snap = build(_state(_tokenisation_run(tmp_path / "forked", (0.0, 2.0))), now=time.time(), kl_warn=1e-3)
    assert snap.overview is not None and snap.overview.tokenisation == {"false_forks": 2.0}
    assert "tokenisation false_forks 2 over the run (should be 0" in _text(views.overview(snap, 150))
    series = {s.name: s for s in snap.curves or []}
    assert series["false_forks"].panel == "tokenisation" and series["false_forks"].figures == [0.0, 2.0]
    text = _text(views.curves(snap, 150, 100))
    assert "tokenisation health" in text
    for name in ("segments_per_rollout", "segments_per_rollout_max", "false_forks", "repeated_prompt_tokens",
                 "render_fallbacks", "parse_failures"):
        assert f"  {name} " in text, name
    clean = build(_state(_tokenisation_run(tmp_path / "clean", (0.0, 0.0))), now=time.time(), kl_warn=1e-3)
    assert clean.overview is not None and clean.overview.tokenisation == {}
    assert "tokenisation" not in _text(views.overview(clean, 150))
