"""Opening a task's sandbox: the one path the agent sandbox, the grader and ``lego tasks check`` share.

A task's sandbox is its image (looked up in the images.json mapping), created by a provider with that
provider's constructor options and the per-sandbox options (memory, network), with the task's
repository unpacked at its workdir when the row ships one (``seed.seeded_opener``). Built in one place
so that no caller can forget a piece (the task checker once created sandboxes without the memory and
network options the rollouts got).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lego_rl.sandbox.base import ImageSpec, Sandbox
from lego_rl.sandbox.factory import create_sandbox
from lego_rl.swe.seed import seeded_opener
from lego_rl.tasks.model import TaskMetadata

SandboxOpener = Callable[[], contextlib.AbstractAsyncContextManager[Sandbox]]


@dataclass(frozen=True)
class SandboxTarget:
    """Where and how a task's sandboxes are created (one for the agent, one for the grader)."""

    provider: str
    """Provider name (``sunabako``, ``bwrap``, ``e2b`` or one registered by a plugin)."""
    provider_options: Mapping[str, Any] = field(default_factory=dict)
    """Options of the provider's constructor (node, state dir, API key...)."""
    sandbox_options: Mapping[str, Any] = field(default_factory=dict)
    """Options of each sandbox (``memory_mb``, ``network``)."""


def task_sandbox_opener(
    meta: TaskMetadata,
    target: SandboxTarget,
    *,
    images: Mapping[str, ImageSpec] | None = None,
    dataset_dir: Path | None = None,
) -> SandboxOpener:
    """A function opening a fresh sandbox of the task's image, seeded with its repository, per call."""

    def open_plain() -> contextlib.AbstractAsyncContextManager[Sandbox]:
        return create_sandbox(
            meta.image,
            provider=target.provider,
            images=images,
            provider_options=target.provider_options,
            **target.sandbox_options,
        )

    return seeded_opener(open_plain, meta, dataset_dir)
