"""W&B view of a run's metrics rows: the same points as TensorBoard (``metrics_sink.points``), logged with
``wandb`` (the optional ``wandb`` extra).

Each row is one ``run.log`` call at ``step = row.step`` holding every scalar under its declared tag and each
distribution as one ``wandb.Histogram``. W&B's step only goes forward and a logged step cannot be rewritten,
so a resume does not continue the earlier W&B run (its points of redone steps would stay): every launch of a
run directory is its own W&B run, in a group named after the run directory (``log.wandb_group``), the first
named ``log.wandb_name`` (default: the run directory's name), each resume ``<name>-resume<k>``. Offline mode
(``log.wandb_mode = "offline"``) writes ``RUN_ROOT/wandb/offline-run-*/`` for ``wandb sync`` later.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lego_rl.driver.metrics_sink import RowSink, SinkPoints
from lego_rl.errors import ConfigError
from lego_rl.runstore import RunLayout

WANDB_DIR = "wandb"
MAX_BINS = 512
"""W&B refuses a histogram of more bins; ages past it are summed into the last bin (never seen: the age is
bounded by rollout.max_staleness plus the length of a partial rollout)."""


@dataclass(frozen=True)
class WandbSettings:
    """What ``log.wandb_*`` configure (projected by ``compose``)."""

    project: str
    mode: Literal["online", "offline"]
    name: str | None = None
    group: str | None = None
    entity: str | None = None
    tags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    """The run's resolved config, shown as the W&B run's config."""


def wandb_dir(layout: RunLayout) -> Path:
    return layout.root / WANDB_DIR


class WandbSink(RowSink):
    """Points of ``StepMetrics`` rows into one W&B run per launch (see the module docstring)."""

    def __init__(self, layout: RunLayout, settings: WandbSettings) -> None:
        if importlib.util.find_spec("wandb") is None:
            raise ConfigError("log.wandb = true but the wandb package is not installed: pip install "
                              "'lego-rl[wandb]', or set log.wandb = false", parameter="log.wandb", value=True)
        self.layout = layout
        self.settings = settings
        self.dir = wandb_dir(layout)
        self.run: Any = None

    def start(self, first_step: int) -> None:
        import wandb

        s = self.settings
        name = s.name or self.layout.root.name
        if first_step > 0:
            # A resume: a new W&B run beside the earlier ones (its redone steps' points stay theirs).
            launches = sum(1 for _ in self.layout.root.glob("config.resume-*.json"))
            name = f"{name}-resume{max(launches, 1)}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=s.project, entity=s.entity, name=name, group=s.group or self.layout.root.name,
                              tags=list(s.tags), mode=s.mode, dir=str(self.layout.root), config=s.config,
                              settings=wandb.Settings(console="off", silent=True, x_disable_stats=True,
                                                      x_disable_meta=True))
        self._started = True

    def put(self, p: SinkPoints) -> None:
        import numpy as np
        import wandb

        data: dict[str, Any] = dict(p.scalars)
        for tag, counts in p.histograms.items():
            bins, edges = integer_histogram(counts)
            data[tag] = wandb.Histogram(np_histogram=(np.asarray(bins), np.asarray(edges)))
        self.run.log(data, step=p.step)

    def _close(self) -> None:
        import wandb

        self.run.finish()
        self.run = None
        # finish() can return before wandb's service process has written the run's last records (seen offline:
        # a .wandb file without its run record); teardown waits for it. A later start() sets it up again.
        wandb.teardown()


def integer_histogram(counts: dict[int, float]) -> tuple[list[float], list[float]]:
    """(counts, edges) as numpy.histogram returns them: one bin per integer from the least to the largest
    value, edges half-way between, absent values counting 0."""
    lo, hi = min(counts), max(counts)
    hi = min(hi, lo + MAX_BINS - 1)
    bins = [0.0] * (hi - lo + 1)
    for v, c in counts.items():
        bins[min(v, hi) - lo] += c
    return bins, [lo - 0.5 + i for i in range(len(bins) + 1)]
