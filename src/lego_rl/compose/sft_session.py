"""``lego train`` with ``train.sft_data``: the config projected into ``SftSettings``, the demonstrations and
the run directory checked up front, then ``driver.sft.SftRunner`` through the configured trainer backend."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from lego_rl.compose.projection import metrics_sinks, sft_settings
from lego_rl.compose.stack import model_dir
from lego_rl.compose.train_session import BACKENDS, BackendFactory, mark_overrides, overridden_on_resume
from lego_rl.config.resolve import ResolvedConfig, config_json
from lego_rl.driver.sft import SftRunner, load_demonstrations
from lego_rl.errors import ConfigError
from lego_rl.runstore import RunDir, RunLayout, follow_metrics, latest_checkpoint
from lego_rl.runstore import metric_catalog as mc

@dataclass
class SftSummary:
    status: Literal["completed", "stopped"]
    run_root: str
    steps_done: int
    sft_steps: int
    first_loss: float | None
    last_loss: float | None
    checkpoint: str | None
    """The newest checkpoint: a model directory to name in ``model.checkpoint`` of the GRPO run."""

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class SftSession:
    """``lego train`` with ``train.sft_data``: data and run directory checked up front, then the SFT loop."""

    def __init__(self, r: ResolvedConfig, *, backends: dict[str, BackendFactory] | None = None) -> None:
        self.r = r
        c = r.config
        self.settings = sft_settings(c)
        factories = BACKENDS if backends is None else backends
        if c.train.backend not in factories:
            raise ConfigError(f"train.backend = {c.train.backend!r} has no trainer in this install (available: "
                              f"{', '.join(sorted(factories)) or 'none'})", parameter="train.backend",
                              value=c.train.backend)
        self.backend_factory = factories[c.train.backend]
        self.demos = load_demonstrations(Path(c.train.sft_data or ""), micro_batch_tokens=c.train.micro_batch_tokens)

        root = Path(c.paths.run_root or "runs/unnamed")
        self.sink = metrics_sinks(c, RunLayout(root))  # before the run directory: a missing package starts nothing
        self.overridden = overridden_on_resume(r, root)
        self.run_dir = RunDir.open(root, config=config_json(r), resume=c.train.resume,
                                   artifacts=Path(c.paths.artifacts) if c.paths.artifacts else None,
                                   run_log=Path(c.paths.run_log) if c.paths.run_log else None)
        self.runner: SftRunner | None = None
        self._stop_early = False

    def request_stop(self) -> None:
        self._stop_early = True
        if self.runner is not None:
            self.runner.request_stop()

    async def run(self) -> SftSummary:
        c = self.r.config
        try:
            backend, _ = await asyncio.to_thread(self.backend_factory, c, model_dir(c.model.checkpoint))
            runner = SftRunner(self.settings, backend=backend, demos=self.demos, run=self.run_dir)
            if c.train.resume:
                runner.resume()
                mark_overrides(self.run_dir, self.overridden, runner.next_step)
            self.sink.start(runner.next_step)
            runner.on_step = self.sink.write
            self.runner = runner
            if self._stop_early:
                runner.request_stop()
            status = await runner.run()
        finally:
            self.sink.close()
            self.run_dir.close()
        losses = [mc.read(row.values, mc.LOSS) for row in follow_metrics(self.run_dir.layout.metrics).read()]
        latest = latest_checkpoint(self.run_dir.layout.checkpoints)
        ckpt = str(latest.path) if latest is not None else None
        return SftSummary(status=status, run_root=str(self.run_dir.root), steps_done=runner.next_step,
                          sft_steps=self.settings.steps, first_loss=losses[0] if losses else None,
                          last_loss=losses[-1] if losses else None, checkpoint=ckpt)
