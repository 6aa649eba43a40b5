"""Tasks whose repository ships beside the dataset rather than inside the image.

A row may name ``metadata.repo_archive``: a tar archive (``.tar``, ``.tar.gz``) of the repository, with its
``.git``, as a path relative to the dataset file (or absolute). Both the agent sandbox and the grader
sandbox unpack it at the row's ``workdir`` before anything else runs, so the agent's diff and the grader
start from the same commit. The example tasks use this; MiMo and SWE-bench rows do not need it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from lego_rl.errors import SandboxError, TaskDataError
from lego_rl.sandbox.base import Sandbox
from lego_rl.swe.shell import q, run_step
from lego_rl.tasks.model import TaskMetadata

_UPLOAD = "/tmp/.lego-repo-archive"


def repo_archive(meta: TaskMetadata, dataset_dir: Path | None) -> Path | None:
    """Host path of the row's repository archive, or None when the image holds the repository."""
    name = getattr(meta, "repo_archive", None) or (meta.model_extra or {}).get("repo_archive")
    if not name:
        return None
    path = Path(name)
    if not path.is_absolute():
        if dataset_dir is None:
            raise TaskDataError(f"{meta.instance_id}: repo_archive {name!r} is relative but the dataset's folder is unknown")
        path = dataset_dir / path
    if not path.is_file():
        raise TaskDataError(f"{meta.instance_id}: repo_archive {path} does not exist")
    return path


async def seed_repository(sb: Sandbox, archive: Path, workdir: str) -> None:
    """Unpack ``archive`` at ``workdir`` inside ``sb`` (as root); a failure is a ``SandboxError``."""
    await sb.write_file(_UPLOAD, archive)
    await run_step(sb, f"unpacking {archive.name} into {workdir}",
                   f"mkdir -p {q(workdir)} && tar -xf {_UPLOAD} -C {q(workdir)} && rm -f {_UPLOAD}", timeout=300)


def seeded_opener(open_sandbox: Callable[[], Any], meta: TaskMetadata,
                  dataset_dir: Path | None) -> Callable[[], contextlib.AbstractAsyncContextManager[Sandbox]]:
    """Wrap a sandbox opener so every sandbox it opens has the row's repository (when it ships one)."""
    archive = repo_archive(meta, dataset_dir)

    @contextlib.asynccontextmanager
    async def opener() -> AsyncIterator[Sandbox]:
        async with open_sandbox() as sb:
            if archive is not None:
                try:
                    await seed_repository(sb, archive, meta.workdir)
                except OSError as exc:
                    raise SandboxError(f"cannot upload {archive}: {exc}") from exc
            yield sb

    return opener
