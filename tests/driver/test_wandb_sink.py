"""The W&B sink: what ``log.wandb_*`` configures, run offline (real wandb, no network), its transaction log read
back (tests/support/wandb_records.py) and compared with metrics.jsonl and with TensorBoard: the same tags and
values from the same declarations, a distribution as one histogram, one W&B run per launch."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.wandb_records import history, run_file, run_record
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lego_rl.compose.projection import metrics_sinks
from lego_rl.config.resolve import resolve
from lego_rl.driver.metrics_sink import points
from lego_rl.driver.wandb_sink import WandbSink, integer_histogram
from lego_rl.errors import ConfigError
from lego_rl.runstore import RunLayout, StepMetrics
from lego_rl.runstore import metric_catalog as mc
from lego_rl.runstore.log import MetricsLog, follow_metrics
from lego_rl.termination import TerminationReason as TR


def _row(step: int) -> StepMetrics:
    now = time.time()
    values = mc.declared_values(mc.TRAIN, {
        mc.LOSS: 2.0 - step / 4, mc.REWARD_MEAN: step / 10, mc.TIME_STEP_S: 3.5 + step,
        mc.CONSISTENCY_BY_SPLIT["k3_kl"].key("bridged"): 0.01 * (step + 1),
        mc.TOKENS_AGE.key(0): 30.0, mc.TOKENS_AGE.key(2): 10.0 + step})
    return StepMetrics(step=step, started_at=now, finished_at=now, values=values,
                       terminations={TR.COMPLETED: 3, TR.TIME_BUDGET: 1})


def test_points_file_values_under_their_group_and_a_distribution_as_one_histogram() -> None:
    p = points(_row(1))
    assert p.scalars == {"train/loss": 1.75, "rollout/reward_mean": 0.1, "timing/time_step_s": 4.5,
                         "consistency/bridged/k3_kl": 0.02, "rollout/terminations/completed": 3.0,
                         "rollout/terminations/time_budget": 1.0}
    assert p.histograms == {"staleness/tokens_age": {0: 30.0, 2: 11.0}}
    with pytest.raises(mc.UndeclaredMetric, match="tokens_age/x"):
        points(StepMetrics(step=0, started_at=0.0, finished_at=0.0, values={"tokens_age/x": 1.0}))


def test_integer_histogram_has_a_bin_per_integer_and_zeros_between() -> None:
    assert integer_histogram({0: 30.0, 2: 11.0}) == ([30.0, 0.0, 11.0], [-0.5, 0.5, 1.5, 2.5])
    assert integer_histogram({3: 1.0}) == ([1.0], [2.5, 3.5])


def _config(root: Path, *extra: str):  # noqa: ANN202 (a LegoConfig)
    return resolve(None, environ={}, overrides=[
        f'paths.run_root="{root}"', "log.wandb=true", 'log.wandb_mode="offline"', 'log.wandb_project="lego-test"',
        'log.wandb_tags=["smoke", "cpu"]', *extra]).config


@pytest.fixture
def wandb_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """wandb's own settings and caches in the test's directory, never the user's."""
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var.lower()))
    monkeypatch.delenv("WANDB_MODE", raising=False)


@pytest.mark.slow
def test_offline_wandb_holds_what_metrics_jsonl_and_tensorboard_hold(tmp_path: Path, wandb_home: None) -> None:
    root = tmp_path / "exp1"
    layout = RunLayout(root)
    root.mkdir()
    sinks = metrics_sinks(_config(root), layout)
    assert [type(s).__name__ for s in sinks.sinks] == ["TensorBoardSink", "WandbSink"]
    log = MetricsLog(layout.metrics)
    sinks.start(first_step=0)
    sinks.follow(layout.metrics)
    for step in range(3):
        log.append(_row(step))
    sinks.close()  # drains the rows the file holds
    log.close()

    run = run_record(run_file(root / "wandb"))
    assert (run.project, run.display_name, run.run_group, list(run.tags)) == ("lego-test", "exp1", "exp1",
                                                                                ["smoke", "cpu"])
    logged = history(run_file(root / "wandb"))
    rows = list(follow_metrics(layout.metrics).read())
    assert [h["_step"] for h in logged] == [r.step for r in rows] == [0, 1, 2]
    acc = EventAccumulator(str(root / "tensorboard"), size_guidance={"histograms": 0})
    acc.Reload()
    for h, r in zip(logged, rows, strict=True):
        expected = points(r)
        assert {k: v for k, v in h.items() if k in expected.scalars} == expected.scalars
        assert set(h) - set(expected.scalars) == {"_step", "_runtime", "_timestamp", "staleness/tokens_age/_type",
                                                  "staleness/tokens_age/values", "staleness/tokens_age/bins"}
        assert h["staleness/tokens_age/values"] == [30, 0, 10 + r.step]
        assert h["staleness/tokens_age/bins"] == [-0.5, 0.5, 1.5, 2.5]
    # TensorBoard files the same tags (no per-step tag names: a distribution is one histogram).
    assert set(acc.Tags()["scalars"]) == set(points(rows[0]).scalars)
    assert acc.Tags()["histograms"] == ["staleness/tokens_age"]
    assert [(s.step, s.value) for s in acc.Scalars("train/loss")] == [(h["_step"], h["train/loss"]) for h in logged]


@pytest.mark.slow
def test_a_resume_logs_a_new_wandb_run_in_the_same_group(tmp_path: Path, wandb_home: None) -> None:
    root = tmp_path / "exp2"
    root.mkdir()
    (root / "config.resume-1.json").write_text("{}")  # what RunDir.open writes for a resumed launch
    sink = metrics_sinks(_config(root, "log.tensorboard=false", 'log.wandb_name="mine"'), RunLayout(root))
    [w] = sink.sinks
    assert isinstance(w, WandbSink)
    sink.start(first_step=2)
    sink.write(_row(2))
    sink.close()
    path = run_file(root / "wandb")
    run = run_record(path)
    assert (run.display_name, run.run_group) == ("mine-resume1", "exp2")
    assert [h["_step"] for h in history(path)] == [2]


def test_wandb_without_the_package_is_a_config_error_naming_the_key(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"log.wandb = true but the wandb package is not installed") as e:
        metrics_sinks(_config(tmp_path / "x", "log.tensorboard=false"), RunLayout(tmp_path / "x"))
    assert e.value.parameter == "log.wandb"
