"""TensorBoard scalars of a run, written into ``RUN_ROOT/tensorboard/`` from its metrics rows.

The run store's ``metrics.jsonl`` stays the record; TensorBoard is a view of it, written through the metric
declarations (``runstore.metric_catalog``): each value of a ``StepMetrics`` row becomes a scalar under its
group (``train/loss``, ``rollout/reward_mean``, ``timing/time_step_s``, ``consistency/k3_kl``...) at
``global_step = row.step``; a distribution (tokens per age) becomes one histogram (``staleness/tokens_age``),
not one tag per member; termination counts are ``rollout/terminations/<reason>``. Two ways in:

* ``write(row)``: the caller hands each row over as it writes it (the SFT runner);
* ``follow(path)`` then ``drain()``: rows are read back from ``metrics.jsonl`` as it grows (the GRPO loop,
  whose row writing this module does not touch), so what TensorBoard shows is exactly what the file holds.

On resume the writer starts with ``purge_step`` at the first step to run, so points of steps that an
interrupted run logged after its last checkpoint (and that are now redone) are hidden, and rows already
in ``metrics.jsonl`` are not written a second time.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from lego_rl.errors import ConfigError
from lego_rl.runstore import JsonlFollower, RunLayout, StepMetrics, follow_metrics
from lego_rl.runstore import metric_catalog as mc

TENSORBOARD_DIR = "tensorboard"


def tensorboard_dir(layout: RunLayout) -> Path:
    return layout.root / TENSORBOARD_DIR


class TensorBoardSink:
    """Scalars of ``StepMetrics`` rows into an event file under ``RUN_ROOT/tensorboard``."""

    def __init__(self, layout: RunLayout) -> None:
        if importlib.util.find_spec("tensorboard") is None:
            raise ConfigError("the tensorboard package is not installed (lego train writes TensorBoard scalars "
                              "into the run directory): pip install 'lego-rl[train]' or pip install tensorboard",
                              parameter="train")
        self.layout = layout
        self.dir = tensorboard_dir(layout)
        self._writer: Any = None
        self._follower: JsonlFollower[StepMetrics] | None = None

    def start(self, first_step: int) -> None:
        """Open the event file; ``first_step`` > 0 is a resume (later points of a previous run are purged)."""
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(self.dir), purge_step=first_step or None)

    def write(self, row: StepMetrics) -> None:
        if self._writer is None:
            raise RuntimeError("TensorBoardSink.write before start()")
        at = {"global_step": row.step, "walltime": row.finished_at}
        histograms: dict[mc.Metric, dict[str, float]] = {}
        for name, value in row.values.items():
            metric = mc.declaration(name)
            if metric is None:
                raise mc.UndeclaredMetric(name, mc.TRAIN, None)
            if metric.kind is mc.DISTRIBUTION:
                histograms.setdefault(metric, {})[str(metric.member(name))] = value
            else:
                self._writer.add_scalar(mc.tag(metric, name), value, **at)
        for metric, counts in histograms.items():
            self._histogram(mc.tag(metric), {int(k): v for k, v in counts.items()}, at)
        for reason, count in row.terminations.items():
            self._writer.add_scalar(f"rollout/terminations/{reason.value}", count, **at)
        self._writer.flush()

    def _histogram(self, tag: str, counts: dict[int, float], at: dict[str, Any]) -> None:
        """Integer values with their counts as one histogram: a bucket per value, edges half-way between."""
        values = sorted(counts)
        n = sum(counts.values())
        if n <= 0:
            return
        self._writer.add_histogram_raw(
            tag, min=values[0], max=values[-1], num=n, sum=sum(v * c for v, c in counts.items()),
            sum_squares=sum(v * v * c for v, c in counts.items()), bucket_limits=[v + 0.5 for v in values],
            bucket_counts=[counts[v] for v in values], **at)

    def follow(self, path: Path) -> None:
        """Tail ``path`` (metrics.jsonl) from its current end: rows already there were written before."""
        self._follower = follow_metrics(path)
        for _ in self._follower.read():
            pass

    def drain(self) -> int:
        """Write the rows appended since the last drain; how many."""
        if self._follower is None:
            return 0
        n = 0
        for row in self._follower.read():
            self.write(row)
            n += 1
        return n

    def close(self) -> None:
        if self._writer is not None:
            self.drain()
            self._writer.close()
            self._writer = None
