"""Task validation (``lego tasks check``): a task is gradable when the unmodified image fails its
official tests and the reference solution, when the row has one, passes them."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from lego_rl.errors import GraderError
from lego_rl.sandbox.base import ImageSpec
from lego_rl.swe.grader import grade
from lego_rl.swe.task_sandbox import SandboxTarget, task_sandbox_opener
from lego_rl.tasks.model import TaskRow

Verdict = Literal["gradable", "not gradable", "grader error"]


@dataclass
class TaskCheck:
    instance_id: str
    baseline: str
    """``fails`` (good), ``passes`` (the task is already solved: useless for training) or ``error``."""
    reference: str
    """``passes``, ``fails``, ``none`` (no reference in the row) or ``error``."""
    verdict: Verdict
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def check_task(row: TaskRow, *, provider: str = "bwrap", images: Mapping[str, ImageSpec] | None = None,
                     provider_options: Mapping[str, Any] | None = None, timeout: float = 180.0,
                     dataset_dir: Path | None = None,
                     sandbox_options: Mapping[str, Any] | None = None) -> TaskCheck:
    """``dataset_dir`` resolves a row's relative ``repo_archive`` (tasks whose repository ships beside them);
    ``sandbox_options`` (memory_mb, network) should be the ones the rollouts use, so a task checked here
    is graded the same way in training."""
    meta = row.metadata
    target = SandboxTarget(provider, provider_options or {}, sandbox_options or {})
    opener = task_sandbox_opener(meta, target, images=images, dataset_dir=dataset_dir)

    iid = meta.instance_id
    try:
        base = await grade(meta, b"", open_sandbox=opener, timeout=timeout)
    except GraderError as exc:
        return TaskCheck(iid, "error", "-", "grader error", str(exc).splitlines()[0])
    baseline = "passes" if base.solved else "fails"
    reference, detail = "none", ""
    if meta.reference_patch:
        try:
            ref = await grade(meta, meta.reference_patch, open_sandbox=opener, timeout=timeout)
        except GraderError as exc:
            return TaskCheck(iid, baseline, "error", "grader error", str(exc).splitlines()[0])
        reference = "passes" if ref.solved else "fails"
        if not ref.solved:
            detail = f"reference: {ref.reason}"
    if base.solved:
        return TaskCheck(iid, baseline, reference, "not gradable", "the unmodified image already passes")
    if reference == "fails":
        return TaskCheck(iid, baseline, reference, "not gradable", detail)
    return TaskCheck(iid, baseline, reference, "gradable", "" if reference == "passes" else "(no reference patch)")


async def check_tasks(rows: Sequence[TaskRow], *, concurrency: int = 2, **kwargs: Any) -> list[TaskCheck]:
    """Check ``rows`` with at most ``concurrency`` tasks in flight; results in input order."""
    gate = asyncio.Semaphore(concurrency)

    async def one(row: TaskRow) -> TaskCheck:
        async with gate:
            return await check_task(row, **kwargs)

    return list(await asyncio.gather(*(one(r) for r in rows)))
