"""``RunProviders``: one provider instance per provider name and options for a whole run, closed once.

Real providers (bwrap's constructor touches nothing until a create); the close-failure case uses a TEST
DOUBLE provider registered under its own name, since no shipped provider fails to close on demand."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from lego_rl.errors import SandboxError
from lego_rl.sandbox.base import ImageSpec, Sandbox, SandboxProvider
from lego_rl.sandbox.factory import BUILTIN_PROVIDERS
from lego_rl.swe.task_sandbox import RunProviders, SandboxTarget


class CloseFailsDouble(SandboxProvider):
    """TEST DOUBLE: a provider whose ``aclose`` raises; it creates nothing."""

    name = "close-fails-double"
    closed: list[str] = []

    def __init__(self, tag: str = "") -> None:
        self.tag = tag

    async def create(self, image: ImageSpec, **options: Any) -> Sandbox:
        raise SandboxError("TEST DOUBLE creates nothing")

    async def aclose(self) -> None:
        CloseFailsDouble.closed.append(self.tag)
        raise RuntimeError(f"TEST DOUBLE close of {self.tag} failed")


async def test_one_provider_per_name_and_options_closed_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(BUILTIN_PROVIDERS, "close-fails-double", f"{__name__}:CloseFailsDouble")
    CloseFailsDouble.closed = []
    providers = RunProviders()
    agent = SandboxTarget("bwrap", {"state_dir": "/var/lib/lego-rl/bwrap"}, {"network": "allowlist"})
    grader = SandboxTarget("bwrap", {"state_dir": "/var/lib/lego-rl/bwrap"}, {"network": "none"})
    other = SandboxTarget("bwrap", {"state_dir": "/var/tmp/elsewhere"})
    assert providers.get(agent) is providers.get(grader)  # per-sandbox options do not split the provider
    assert providers.get(other) is not providers.get(agent)
    for tag in ("a", "b"):
        providers.get(SandboxTarget("close-fails-double", {"tag": tag}))
    assert len(providers.providers()) == 4
    with caplog.at_level(logging.WARNING):
        await providers.aclose()  # both failing closes are logged; every provider is still closed
    assert sorted(CloseFailsDouble.closed) == ["a", "b"] and providers.providers() == []
    assert caplog.text.count("closing sandbox provider close-fails-double failed") == 2
    with pytest.raises(SandboxError, match="providers are closed; no new bwrap sandbox"):
        providers.get(agent)
    with pytest.raises(SandboxError, match="unknown sandbox provider 'nope'"):
        RunProviders().get(SandboxTarget("nope"))
