"""Metrics sinks: TensorBoard and W&B views of a run's metrics rows, both fed from the metric declarations.

The run store's ``metrics.jsonl`` stays the record; a sink is a view of it. ``points(row)`` turns one
``StepMetrics`` row into what every sink files, through the declarations (``runstore.metric_catalog``): each
value becomes a scalar under its group (``train/loss``, ``rollout/reward_mean``, ``timing/time_step_s``,
``consistency/k3_kl``...) at ``step = row.step``; a distribution (tokens per age) becomes one histogram
(``staleness/tokens_age``), never one tag per member (a tag per age would add a tag every step); termination
counts are ``rollout/terminations/<reason>``. So TensorBoard and W&B cannot disagree on a name or a value.

A sink is fed two ways:

* ``write(row)``: the caller hands each row over as it writes it (the SFT runner);
* ``follow(path)`` then ``drain()``: rows are read back from ``metrics.jsonl`` as it grows (the GRPO loop,
  whose row writing this module does not touch), so what a sink shows is exactly what the file holds.

On resume a sink starts at the first step to run: TensorBoard purges points of steps that an interrupted run
logged after its last checkpoint (they are redone); W&B opens a new run in the same group (``wandb_sink``).
Rows already in ``metrics.jsonl`` are not written a second time.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lego_rl.errors import ConfigError
from lego_rl.runstore import JsonlFollower, RunLayout, StepMetrics, follow_metrics
from lego_rl.runstore import metric_catalog as mc

TENSORBOARD_DIR = "tensorboard"
TERMINATIONS_TAG = "rollout/terminations/{reason}"
"""Where a step's count of one termination reason is filed."""


def tensorboard_dir(layout: RunLayout) -> Path:
    return layout.root / TENSORBOARD_DIR


@dataclass(frozen=True)
class SinkPoints:
    """One row as every sink files it."""

    step: int
    walltime: float
    scalars: dict[str, float]
    """Tag -> value (declared values under their group, then termination counts)."""
    histograms: dict[str, dict[int, float]]
    """Tag -> {integer value: count} (a distribution's members)."""


def points(row: StepMetrics, run_kind: mc.RunKind = mc.TRAIN) -> SinkPoints:
    """``row`` as tagged scalars and histograms; ``UndeclaredMetric`` for a name no declaration covers."""
    scalars: dict[str, float] = {}
    members: dict[mc.Metric, dict[int, float]] = {}
    for name, value in row.values.items():
        metric = mc.declaration(name)
        if metric is None:
            raise mc.UndeclaredMetric(name, run_kind, None)
        if metric.kind is mc.DISTRIBUTION:
            members.setdefault(metric, {})[int(str(metric.member(name)))] = value
        else:
            scalars[mc.tag(metric, name)] = value
    for reason, count in row.terminations.items():
        scalars[TERMINATIONS_TAG.format(reason=reason.value)] = float(count)
    histograms = {mc.tag(m): counts for m, counts in members.items() if sum(counts.values()) > 0}
    return SinkPoints(step=row.step, walltime=row.finished_at, scalars=scalars, histograms=histograms)


class RowSink:
    """Rows in, points out: the feeding (``write``, ``follow``/``drain``) every sink shares. A subclass
    implements ``start``, ``put`` and ``_close``."""

    _follower: JsonlFollower[StepMetrics] | None = None
    _started = False

    def start(self, first_step: int) -> None:
        """Open the sink; ``first_step`` > 0 is a resume."""
        raise NotImplementedError

    def put(self, p: SinkPoints) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError

    def write(self, row: StepMetrics) -> None:
        if not self._started:
            raise RuntimeError(f"{type(self).__name__}.write before start()")
        self.put(points(row))

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
        if self._started:
            self.drain()
            self._close()
            self._started = False


class TensorBoardSink(RowSink):
    """Scalars and histograms of ``StepMetrics`` rows into an event file under ``RUN_ROOT/tensorboard``."""

    def __init__(self, layout: RunLayout) -> None:
        if importlib.util.find_spec("tensorboard") is None:
            raise ConfigError("the tensorboard package is not installed (lego train writes TensorBoard scalars "
                              "into the run directory): pip install 'lego-rl[train]' or pip install tensorboard, "
                              "or set log.tensorboard = false", parameter="log.tensorboard")
        self.layout = layout
        self.dir = tensorboard_dir(layout)
        self._writer: Any = None

    def start(self, first_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: points of steps at or after the first one to run belong to a run that was interrupted.
        self._writer = SummaryWriter(log_dir=str(self.dir), purge_step=first_step or None)
        self._started = True

    def put(self, p: SinkPoints) -> None:
        at = {"global_step": p.step, "walltime": p.walltime}
        for tag, value in p.scalars.items():
            self._writer.add_scalar(tag, value, **at)
        for tag, counts in p.histograms.items():
            self._histogram(tag, counts, at)
        self._writer.flush()

    def _histogram(self, tag: str, counts: dict[int, float], at: dict[str, Any]) -> None:
        """Integer values with their counts as one histogram: a bucket per value, edges half-way between."""
        values = sorted(counts)
        self._writer.add_histogram_raw(
            tag, min=values[0], max=values[-1], num=sum(counts.values()),
            sum=sum(v * c for v, c in counts.items()), sum_squares=sum(v * v * c for v, c in counts.items()),
            bucket_limits=[v + 0.5 for v in values], bucket_counts=[counts[v] for v in values], **at)

    def _close(self) -> None:
        self._writer.close()
        self._writer = None


class Sinks(RowSink):
    """Every configured sink behind one: each row is turned into points once and handed to each."""

    def __init__(self, sinks: list[RowSink]) -> None:
        self.sinks = sinks

    def start(self, first_step: int) -> None:
        for s in self.sinks:
            s.start(first_step)
        self._started = True

    def put(self, p: SinkPoints) -> None:
        for s in self.sinks:
            s.put(p)

    def _close(self) -> None:
        for s in self.sinks:
            s.close()
