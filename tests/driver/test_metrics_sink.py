"""TensorBoard scalars from metrics rows: values as in metrics.jsonl under their declared group (read back with
tensorboard's own EventAccumulator), a distribution as one histogram, rows tailed from the file as the loop
appends them, and a resume that neither rewrites old rows nor keeps points of redone steps."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lego_rl.driver.metrics_sink import TensorBoardSink
from lego_rl.runstore import RunLayout, StepMetrics
from lego_rl.runstore import metric_catalog as mc
from lego_rl.runstore.log import MetricsLog
from lego_rl.termination import TerminationReason


def row(step: int, loss: float) -> StepMetrics:
    now = time.time()
    return StepMetrics(step=step, started_at=now, finished_at=now, values={"loss": loss, "reward_mean": step / 10},
                       terminations={TerminationReason.COMPLETED: 3, TerminationReason.TIME_BUDGET: 1})


def scalars(root: Path, name: str) -> list[tuple[int, float]]:
    acc = EventAccumulator(str(root / "tensorboard"))
    acc.Reload()
    return [(p.step, p.value) for p in acc.Scalars(name)]


def test_tailed_rows_become_scalars_with_the_rows_names(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    log = MetricsLog(layout.metrics)
    log.append(row(0, 2.5))  # written before the sink started following: a previous run's, not rewritten
    sink = TensorBoardSink(layout)
    sink.start(first_step=1)
    sink.follow(layout.metrics)
    assert sink.drain() == 0
    log.append(row(1, 2.0))
    log.append(row(2, 1.25))
    assert sink.drain() == 2
    log.append(row(3, 0.5))
    sink.close()  # drains what is left
    log.close()
    assert scalars(tmp_path, "train/loss") == [(1, 2.0), (2, 1.25), (3, 0.5)]
    assert scalars(tmp_path, "rollout/reward_mean") == [(1, pytest.approx(0.1)), (2, pytest.approx(0.2)),
                                                        (3, pytest.approx(0.3))]
    assert scalars(tmp_path, "rollout/terminations/time_budget") == [(1, 1.0), (2, 1.0), (3, 1.0)]


def test_tags_follow_the_declarations_and_a_distribution_is_one_histogram(tmp_path: Path) -> None:
    now = time.time()
    values = mc.declared_values(mc.TRAIN, {mc.TIME_STEP_S: 4.0, "consistency/bridged/k3_kl": 0.01,
                                           mc.TOKENS_AGE.key(0): 30.0, mc.TOKENS_AGE.key(2): 10.0})
    sink = TensorBoardSink(RunLayout(tmp_path))
    sink.start(first_step=0)
    sink.write(StepMetrics(step=0, started_at=now, finished_at=now, values=values))
    sink.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"histograms": 0})
    acc.Reload()
    tags = acc.Tags()
    assert sorted(tags["scalars"]) == ["consistency/bridged/k3_kl", "timing/time_step_s"]
    assert tags["histograms"] == ["staleness/tokens_age"]
    [h] = acc.Histograms("staleness/tokens_age")
    assert (h.step, h.histogram_value.num, h.histogram_value.sum) == (0, 40.0, 20.0)
    assert list(h.histogram_value.bucket) == [30.0, 10.0]
    other = TensorBoardSink(RunLayout(tmp_path / "b"))
    other.start(first_step=0)
    with pytest.raises(mc.UndeclaredMetric, match="staleness_mean"):
        other.write(StepMetrics(step=0, started_at=now, finished_at=now, values={"staleness_mean": 1.0}))
    other.close()


def test_resume_purges_points_of_redone_steps(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    first = TensorBoardSink(layout)
    first.start(first_step=0)
    for step, loss in enumerate([3.0, 2.0, 1.0]):
        first.write(row(step, loss))
    first.close()
    # The run stopped with its last checkpoint after step 0: steps 1 and 2 are redone.
    again = TensorBoardSink(layout)
    again.start(first_step=1)
    again.write(row(1, 2.5))
    again.close()
    assert scalars(tmp_path, "train/loss") == [(0, 3.0), (1, 2.5)]


def test_write_before_start_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="before start"):
        TensorBoardSink(RunLayout(tmp_path)).write(row(0, 1.0))
