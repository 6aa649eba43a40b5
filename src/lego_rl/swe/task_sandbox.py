"""Opening a task's sandbox: the one path the agent sandbox, the grader and ``lego tasks check`` share.

A task's sandbox is its image (looked up in the images.json mapping), created by a provider with that
provider's constructor options and the per-sandbox options (memory, network), with the task's
repository unpacked at its workdir when the row ships one (``seed.seeded_opener``). Built in one place
so that no caller can forget a piece (the task checker once created sandboxes without the memory and
network options the rollouts got).

A run shares its providers (``RunProviders``): one provider instance per provider name and constructor
options for all the run's sandboxes, closed once when the run ends. That is what lets a sunabako warm pool
(``sandbox.warm_pool``) serve the run's rollouts: a provider opened per sandbox would make, and close, its
pool around that one sandbox.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lego_rl.errors import SandboxError
from lego_rl.sandbox.base import ImageSpec, Sandbox, SandboxProvider
from lego_rl.sandbox.factory import create_sandbox, get_provider
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


log = logging.getLogger(__name__)


class RunProviders:
    """The providers of one run: one instance per provider name and constructor options, made on first
    use and closed (warm pools emptied) by ``aclose``. Use as ``async with RunProviders() as providers``."""

    def __init__(self) -> None:
        self._made: dict[tuple[str, str], SandboxProvider] = {}
        self._closed = False

    def get(self, target: SandboxTarget) -> SandboxProvider:
        """The run's provider for ``target`` (made now if it is the first sandbox of that kind)."""
        if self._closed:
            raise SandboxError(f"the run's sandbox providers are closed; no new {target.provider} sandbox")
        key = (target.provider, repr(sorted((k, repr(v)) for k, v in target.provider_options.items())))
        provider = self._made.get(key)
        if provider is None:
            provider = self._made[key] = get_provider(target.provider, **dict(target.provider_options))
        return provider

    def providers(self) -> list[SandboxProvider]:
        return list(self._made.values())

    async def aclose(self) -> None:
        """Close every provider (a failing one is logged: the others are still closed)."""
        self._closed = True
        while self._made:
            _, provider = self._made.popitem()
            try:
                await provider.aclose()
            except Exception as exc:  # noqa: BLE001 - closing the rest matters more than one failure
                log.warning("closing sandbox provider %s failed: %s", provider.name, exc)

    async def __aenter__(self) -> RunProviders:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def task_sandbox_opener(
    meta: TaskMetadata,
    target: SandboxTarget,
    *,
    images: Mapping[str, ImageSpec] | None = None,
    dataset_dir: Path | None = None,
    providers: RunProviders | None = None,
) -> SandboxOpener:
    """A function opening a fresh sandbox of the task's image, seeded with its repository, per call.

    With ``providers`` the sandbox comes from the run's shared provider (and its warm pool); without, a
    provider is made for the one sandbox and closed with it."""

    def open_plain() -> contextlib.AbstractAsyncContextManager[Sandbox]:
        if providers is not None:
            return create_sandbox(meta.image, provider=providers.get(target), images=images,
                                  **target.sandbox_options)
        return create_sandbox(
            meta.image,
            provider=target.provider,
            images=images,
            provider_options=target.provider_options,
            **target.sandbox_options,
        )

    return seeded_opener(open_plain, meta, dataset_dir)
