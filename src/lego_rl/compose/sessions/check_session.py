"""One rollout-check run, from a resolved config: loads the tasks and images, opens the run directory,
starts the serving stack and drives ``run_rollout_check``. Kept apart from the CLI so tests and
notebooks can run it without typer. It prints nothing: progress goes to the run's event log and to
the caller's callbacks, and the CLI renders it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from lego_rl.config.dataset_scan import row_keys
from lego_rl.config.resolve import ResolvedConfig, config_json
from lego_rl.errors import GraderError
from lego_rl.images.importer import load_images_json
from lego_rl.compose.rollout_check import (
    CheckReport,
    run_rollout_check,
    save_report,
    settings_from_config,
)
from lego_rl.driver.rollout_rows import write_session_row
from lego_rl.driver.runner import ProgressFn
from lego_rl.compose.stack import serving_stack
from lego_rl.rollout.generate import RolloutResult, RolloutSpec
from lego_rl.runstore import RunDir
from lego_rl.runstore import metric_catalog as mc
from lego_rl.runstore.events import Baseline, RolloutCheckFinished, ServingReady
from lego_rl.sandbox.base import ImageSpec
from lego_rl.swe.grader import grade
from lego_rl.swe.task_sandbox import task_sandbox_opener
from lego_rl.tasks.model import TaskRow
from lego_rl.tasks.rows import check_ids_unique, finish_selection, load_tasks

BaselineFn = Callable[[Baseline], None]
"""Called with each task's baseline verdict as it is logged."""


class RolloutCheckSession:
    def __init__(self, r: ResolvedConfig, *, ids: Sequence[str] | None = None) -> None:
        self.r = r
        c = r.config
        data = Path(c.rollout.prompt_data or "")
        check_ids_unique(ids)
        rows = load_tasks(data, row_keys(r))  # the keys `lego validate` reads the rows with
        loaded = finish_selection(rows, list(ids) if ids else None, source=str(data))
        loaded.raise_on_issues(str(data))
        self.rows = loaded.rows
        self.dataset_dir = data.resolve().parent
        images_path = Path(c.sandbox.images) if c.sandbox.images else None
        self.images: dict[str, ImageSpec] | None = (
            load_images_json(images_path) if images_path is not None and images_path.exists() else None
        )
        self.run_dir = RunDir.open(
            Path(c.paths.run_root or "runs/unnamed"), config=config_json(r), resume=c.train.resume,
            artifacts=Path(c.paths.artifacts) if c.paths.artifacts else None,
            run_log=Path(c.paths.run_log) if c.paths.run_log else None,
        )
        self._rollouts_started: float | None = None
        """When the serving stack was up and the rollouts began (None: none ran), the start of the metrics row."""

    async def baseline(self, on_result: BaselineFn | None = None) -> list[str]:
        """Grade every unmodified task; the ids that already pass (useless for training).

        Each verdict is logged as a ``baseline`` event and handed to ``on_result``.
        """
        s = settings_from_config(self.r)
        passing: list[str] = []
        sem = asyncio.Semaphore(s.boot_concurrency)

        def report(event: Baseline) -> None:
            self.run_dir.events.emit(event)
            if on_result is not None:
                on_result(event)

        async def one(row: TaskRow) -> None:
            meta = row.metadata
            opener = task_sandbox_opener(meta, s.grader_sandbox, images=self.images,
                                         dataset_dir=self.dataset_dir)
            async with sem:
                try:
                    result = await grade(meta, b"", open_sandbox=opener, timeout=s.grader_timeout_s)
                except GraderError as exc:
                    report(Baseline(instance_id=meta.instance_id, error=str(exc)[:500]))
                    raise
            report(Baseline(instance_id=meta.instance_id, solved=result.solved, reason=result.reason))
            if result.solved:
                passing.append(meta.instance_id)

        # A TaskGroup: a grader error cancels (and awaits) the other baselines rather than leaving them
        # running with their sandboxes after this returns.
        try:
            async with asyncio.TaskGroup() as group:
                for row in self.rows:
                    group.create_task(one(row))
        except* GraderError as failed:
            raise failed.exceptions[0] from None
        return passing

    async def run(self, *, samples: int, harness: str | None, concurrency: int, output: Path | None,
                  progress: ProgressFn | None = None) -> CheckReport:
        """Roll out, save the report and log ``rollout_check_finished``. Cancelled (SIGTERM, Ctrl-C), it
        saves the report of every rollout that finished or was interrupted, then lets the cancellation
        go on."""
        finished: list[RolloutResult] = []

        def track(
            event: Literal["started", "finished"], spec: RolloutSpec, result: RolloutResult | None
        ) -> None:
            if result is not None:
                finished.append(result)
            if progress is not None:
                progress(event, spec, result)

        try:
            try:
                async with serving_stack(self.r.config) as stack:
                    self.run_dir.events.emit(
                        ServingReady(adapter=stack.adapter_url, serving=stack.serving_urls)
                    )
                    self._rollouts_started = time.time()
                    report = await run_rollout_check(
                        self.r, stack, self.run_dir, self.rows, samples_per_task=samples,
                        dataset_dir=self.dataset_dir, images=self.images, harness=harness,
                        concurrency=concurrency, progress=track,
                    )
            except asyncio.CancelledError:
                # Every rollout has cleaned up and reported its outcome by now (the runner awaits them).
                done = sorted(finished, key=lambda res: (res.group_index, res.index))
                self._save(CheckReport(done), output)
                raise
            self._save(report, output)
            return report
        finally:
            self.run_dir.close()

    def _save(self, report: CheckReport, output: Path | None) -> None:
        save_report(report, output or self.run_dir.root / "rollout-check")
        if self._rollouts_started is not None:  # the rollouts ran (a stack that never came up rolled out nothing)
            write_session_row(self.run_dir, mc.ROLLOUT_CHECK, report.results, started_at=self._rollouts_started,
                              finished_at=time.time())
        self.run_dir.events.emit(RolloutCheckFinished(
            rewarded=report.rewarded, rollouts=len(report.results), terminations=dict(report.terminations)
        ))
