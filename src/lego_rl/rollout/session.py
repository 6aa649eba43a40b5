"""One rollout-check run, from a resolved config: loads the tasks and images, opens the run directory,
starts the serving stack and drives ``run_rollout_check``. Kept apart from the CLI so tests and
notebooks can run it without typer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from lego_rl.config.dataset_scan import row_keys
from lego_rl.config.resolve import ResolvedConfig, config_json
from lego_rl.errors import GraderError
from lego_rl.images.importer import load_images_json
from lego_rl.rollout.check import CheckReport, ProgressFn, run_rollout_check, save_report, settings_from_config
from lego_rl.rollout.rundir import RunDir
from lego_rl.rollout.stack import serving_stack
from lego_rl.sandbox.base import ImageSpec
from lego_rl.sandbox.factory import create_sandbox
from lego_rl.swe.grader import grade
from lego_rl.swe.seed import seeded_opener
from lego_rl.tasks.rows import check_ids_unique, finish_selection, load_tasks


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

    async def baseline(self, progress_console: Console | None = None) -> list[str]:
        """Grade every unmodified task; the ids that already pass (useless for training)."""
        s = settings_from_config(self.r)
        passing: list[str] = []
        sem = asyncio.Semaphore(self.r.config.sandbox.boot_concurrency)

        async def one(row) -> None:  # type: ignore[no-untyped-def]
            meta = row.metadata

            provider = s.grader_provider or s.provider

            def open_plain():  # type: ignore[no-untyped-def]
                return create_sandbox(meta.image, provider=provider, images=self.images,
                                      provider_options=s.options_for(provider), **s.sandbox_options)

            async with sem:
                try:
                    result = await grade(meta, b"", open_sandbox=seeded_opener(open_plain, meta, self.dataset_dir),
                                         timeout=s.grader_timeout_s)
                except GraderError as exc:
                    self.run_dir.events.emit("baseline", instance_id=meta.instance_id, error=str(exc)[:500])
                    raise
            self.run_dir.events.emit("baseline", instance_id=meta.instance_id, solved=result.solved, reason=result.reason)
            if progress_console is not None:
                verdict = "[red]passes (bad)[/]" if result.solved else "[green]fails (good)[/]"
                progress_console.print(f"baseline {meta.instance_id}: {verdict} — {result.reason}")
            if result.solved:
                passing.append(meta.instance_id)

        await asyncio.gather(*(one(row) for row in self.rows))
        return passing

    async def run(self, *, samples: int, harness: str | None, concurrency: int, output: Path | None,
                  progress: ProgressFn | None = None) -> CheckReport:
        try:
            async with serving_stack(self.r.config) as stack:
                self.run_dir.events.emit("serving_ready", adapter=stack.adapter_url, serving=stack.serving_urls)
                report = await run_rollout_check(
                    self.r, stack, self.run_dir, self.rows, samples_per_task=samples, dataset_dir=self.dataset_dir,
                    images=self.images, harness=harness, concurrency=concurrency, progress=progress,
                )
            save_report(report, output or self.run_dir.root / "rollout-check")
            self.run_dir.events.emit("rollout_check_finished", rewarded=report.rewarded, rollouts=len(report.results),
                                 terminations=json.dumps(dict(report.terminations)))
            return report
        finally:
            self.run_dir.close()
