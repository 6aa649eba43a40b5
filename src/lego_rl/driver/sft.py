"""Supervised warm start: cross-entropy on demonstrations through the same trainer backend as GRPO.

A random tiny model never earns a reward through a real CLI, so RL alone cannot be shown on it. SFT on a
few demonstrations (Samples: token ids and loss masks, e.g. the ``samples.jsonl`` of rollouts whose policy
solved the task) moves it to where some rollouts succeed; ``lego train`` then starts from the checkpoint.

* **Data.** ``train.sft_data``: Samples as JSON lines, any number of segments per rollout
  (``rollout_id``). A demonstration is one rollout with all its segments; a line that is not a Sample, a
  rollout with no trained token and a segment longer than ``train.micro_batch_tokens`` are errors naming
  the file and line before anything starts.
* **Step.** ``train.sft_batch_size`` demonstrations from a seeded order (``train.seed``, reshuffled per
  epoch: the RL loop's ``PromptStream`` over rollouts), packed by ``plan_steps`` (one denominator per
  demonstration), one ``TrainerBackend.train_step`` with ``SftLoss`` at temperature 1, no truncation.
  The reported ``loss``/``nll`` is the batch's NLL *before* the update (the forward that is
  differentiated), so a falling curve is the demonstrated tokens' log-probability rising.
* **Run directory.** The run store's: config, events (``step_started``, ``step_finished``,
  ``checkpoint_saved``, ``training_finished``), a ``StepMetrics`` row per step, checkpoints in
  ``checkpoints/step-NNNNNN`` (Hugging Face format: ``model.checkpoint`` of a GRPO run can name one) and
  ``checkpoints/latest``. Resume (``train.resume``) continues from ``latest`` with the same data order.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from pydantic import ValidationError

from lego_rl.errors import ConfigError, TaskDataError
from lego_rl.driver.loop import Prompt, PromptStream, TrainingError
from lego_rl.runstore import RolloutFiles, RunDir, RunLayout, StepMetrics
from lego_rl.runstore import checkpoint_state as ckpt
from lego_rl.runstore import metric_catalog as mc
from lego_rl.runstore.checkpoint_state import SftState
from lego_rl.runstore.events import StepFinished, StepStarted, TrainingFinished
from lego_rl.train.backend import TrainerBackend
from lego_rl.train.batching import plan_steps
from lego_rl.train.losses import SftLoss
from lego_rl.trajectory.sample import Sample

@dataclass(frozen=True)
class Demonstration:
    """One demonstrated rollout: all its segments, and the line each came from (for error messages)."""

    rollout_id: str
    samples: list[Sample]
    lines: list[int]

    @property
    def trained_tokens(self) -> int:
        return sum(s.num_trained_tokens for s in self.samples)


def load_demonstrations(path: Path, *, micro_batch_tokens: int, key: str = "train.sft_data") -> list[Demonstration]:
    """Demonstrations from a Sample JSON-lines file; anything unusable is an error naming file and line."""
    if not path.is_file():
        raise ConfigError(f"{path} does not exist or is not a file", parameter=key, value=str(path))
    by_rollout: dict[str, list[tuple[int, Sample]]] = defaultdict(list)
    seen: dict[tuple[str, int], int] = {}
    with path.open("rb") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                sample = Sample.model_validate_json(line)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(map(str, first["loc"])) or "(line)"
                raise TaskDataError(f"not a Sample ({where}: {first['msg']}; {exc.error_count()} error(s))",
                                    source=str(path), row=lineno) from None
            ident = (sample.rollout_id, sample.segment)
            if ident in seen:
                raise TaskDataError(f"rollout {sample.rollout_id!r} segment {sample.segment} repeats line "
                                    f"{seen[ident]}", source=str(path), row=lineno)
            seen[ident] = lineno
            if len(sample.tokens) > micro_batch_tokens:
                raise TaskDataError(f"segment of {len(sample.tokens)} tokens is longer than train.micro_batch_tokens"
                                    f" = {micro_batch_tokens}; raise it", source=str(path), row=lineno)
            by_rollout[sample.rollout_id].append((lineno, sample))
    demos: list[Demonstration] = []
    for rid, rows in by_rollout.items():
        rows.sort(key=lambda r: r[1].segment)
        demo = Demonstration(rid, [s for _, s in rows], [n for n, _ in rows])
        if demo.trained_tokens == 0:
            raise TaskDataError(f"rollout {rid!r} has no token with loss_mask 1: nothing to learn from it",
                                source=str(path), row=demo.lines[0])
        demos.append(demo)
    if not demos:
        raise ConfigError(f"{path} holds no demonstrations", parameter=key, value=str(path))
    return demos


def collect_demonstrations(run_roots: list[Path], *, min_reward: float | None = 1.0) -> list[Sample]:
    """Samples of the rollouts saved under each run's ``sandboxes/*/samples.jsonl`` whose reward is at
    least ``min_reward`` (None: every rollout), rollout ids prefixed by the run's folder name so that runs
    never collide. The way to turn recorded rollouts (e.g. ``lego rollout-check`` with a scripted or a
    strong policy) into ``train.sft_data``."""
    out: list[Sample] = []
    for root in run_roots:
        artifacts = RunLayout(root).artifacts
        files = sorted(artifacts.glob(f"*/{RolloutFiles.SAMPLES}"))
        if not files:
            raise ConfigError(f"{root} has no {artifacts.name}/*/{RolloutFiles.SAMPLES}: not a run directory with "
                              "saved rollouts",
                              parameter="run_root", value=str(root))
        for f in files:
            with f.open("rb") as fh:
                for lineno, line in enumerate(fh, start=1):
                    if not line.strip():
                        continue
                    try:
                        s = Sample.model_validate_json(line)
                    except ValidationError as exc:
                        raise TaskDataError(f"not a Sample: {exc.errors()[0]['msg']}", source=str(f),
                                            row=lineno) from None
                    if min_reward is not None and (s.reward is None or s.reward < min_reward):
                        continue
                    out.append(s.model_copy(update={"rollout_id": f"{root.name}/{s.rollout_id}"}))
    return out


@dataclass(frozen=True)
class SftSettings:
    steps: int
    batch_size: int
    micro_batch_tokens: int
    checkpoint_every: int
    seed: int
    # No defaults: compose.projection.sft_settings projects them from the config, which holds the one default.


@dataclass
class SftProgress:
    step: int = 0
    total_steps: int = 0
    last_loss: float | None = None
    last_loss_step: int | None = None
    """The step ``last_loss`` belongs to (the step in flight has none yet)."""
    phase: str = "starting"


class SftRunner:
    """The SFT loop over a backend and demonstrations, writing to ``run`` (no config, no printing)."""

    def __init__(self, settings: SftSettings, *, backend: TrainerBackend, demos: list[Demonstration],
                 run: RunDir, on_step: Callable[[StepMetrics], None] | None = None) -> None:
        self.s = settings
        self.backend = backend
        self.demos = demos
        self.run_dir = run
        self.loss = SftLoss()
        self.stream = PromptStream([Prompt(d.rollout_id, d) for d in demos], seed=settings.seed)
        self.next_step = 0
        self.progress = SftProgress(total_steps=settings.steps)
        self.on_step = on_step
        """Called with each ``StepMetrics`` row after it is written (the TensorBoard sink)."""
        self._stop = False
        self._last_checkpoint: int | None = None

    # -- checkpoints --------------------------------------------------------------------------------

    def save_checkpoint(self, step: int) -> Path:
        state = SftState(step=step, seed=self.s.seed, cursor=self.stream.cursor)
        path = ckpt.save_checkpoint(self.run_dir, self.backend, state)
        self._last_checkpoint = step
        return path

    def resume(self) -> int | None:
        """Continue from the run's newest checkpoint (an SFT one, of this seed); the step it holds, or None."""
        state = ckpt.resume_checkpoint(self.run_dir, self.backend, SftState, seed=self.s.seed)
        if state is None:
            return None
        self.stream = PromptStream(self.stream.prompts, seed=self.s.seed, cursor=state.cursor)
        self.next_step = state.step + 1
        self._last_checkpoint = state.step
        return state.step

    # -- steps --------------------------------------------------------------------------------------

    def batch(self) -> list[Sample]:
        """The next ``batch_size`` demonstrations' samples. A demonstration drawn twice in one step (the
        epoch turned inside it) gets a distinct id per draw, so packing never merges the two."""
        out: list[Sample] = []
        for k in range(self.s.batch_size):
            demo: Demonstration = self.stream.next().row
            out.extend(s.model_copy(update={"rollout_id": f"{k}:{s.rollout_id}"}) for s in demo.samples)
        return out

    def step(self, step: int) -> StepMetrics:
        started = time.time()
        self.run_dir.events.emit(StepStarted(step=step, weight_version=self.backend.weight_version))
        t0 = time.monotonic()
        samples = self.batch()
        [opt] = plan_steps(samples, [0.0] * len(samples), max_tokens_per_micro_batch=self.s.micro_batch_tokens)
        old = [torch.zeros(mb.num_tokens) for mb in opt.micro_batches]  # [T] each; SftLoss reads none of them
        res = self.backend.train_step(opt, self.loss, old_logprobs=old, temperature=1.0)
        for k, v in res.metrics.items():
            if not math.isfinite(v):
                raise TrainingError(f"SFT step {step} produced a non-finite {k} = {v}; lower train.lr")
        values = mc.declared_values(mc.SFT, {
            **res.metrics, mc.DEMONSTRATIONS: float(len(opt.rollout_ids)), mc.EPOCH: float(self.stream.cursor.epoch),
            mc.WEIGHT_VERSION: float(res.weight_version), mc.TIME_TRAIN_S: time.monotonic() - t0})
        row = StepMetrics(step=step, started_at=started, finished_at=max(time.time(), started), values=values)
        self.run_dir.metrics.append(row)
        self.run_dir.events.emit(StepFinished(step=step, admitted_rollouts=len(opt.rollout_ids), trained=True,
                                              weight_version=res.weight_version))
        self.progress.last_loss, self.progress.last_loss_step = mc.read(values, mc.LOSS), step
        if self.on_step is not None:
            self.on_step(row)
        return row

    def request_stop(self) -> None:
        self._stop = True

    async def run(self) -> Literal["completed", "stopped"]:
        """Steps ``next_step`` .. ``steps - 1``; each in a worker thread, a stop honoured between steps."""
        last_done = self.next_step - 1
        self.progress.phase = "sft"
        try:
            for step in range(self.next_step, self.s.steps):
                if self._stop:
                    break
                self.progress.step = step
                await asyncio.to_thread(self.step, step)
                last_done, self.next_step = step, step + 1
                if self.s.checkpoint_every and (step + 1) % self.s.checkpoint_every == 0:
                    self.save_checkpoint(step)
        except BaseException as exc:
            self.progress.phase = "failed"
            self.run_dir.events.emit(TrainingFinished(status="failed", steps_done=last_done + 1,
                                                      detail=f"{type(exc).__name__}: {exc}"[:500]))
            raise
        if last_done >= 0 and self._last_checkpoint != last_done:
            self.save_checkpoint(last_done)
        status: Literal["completed", "stopped"] = "stopped" if self._stop else "completed"
        self.progress.phase = status
        self.run_dir.events.emit(TrainingFinished(status=status, steps_done=last_done + 1))
        return status
