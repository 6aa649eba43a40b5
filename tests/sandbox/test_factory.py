"""Provider registry and create_sandbox wiring (no real sandbox needed)."""

from __future__ import annotations

from typing import Any

import pytest

from lego_rl.errors import SandboxError
from lego_rl.sandbox import ExecResult, ImageSpec, Sandbox, SandboxProvider
from lego_rl.sandbox.factory import available_providers, create_sandbox, get_provider, resolve_image


class _RecordingSandbox(Sandbox):
    """Test double for the factory's lifecycle wiring only; real providers are in the contract tests."""

    def __init__(self, image: ImageSpec) -> None:
        self.id, self.image, self.closed = "rec-1", image, 0

    async def exec(self, cmd: Any, **kw: Any) -> ExecResult:
        return ExecResult(0, "", "")

    async def write_file(self, path: str, content: Any, *, user: str | None = None) -> None:
        pass

    async def read_file(self, path: str, *, user: str | None = None) -> bytes:
        return b""

    async def close(self) -> None:
        self.closed += 1


class _RecordingProvider(SandboxProvider):
    name = "recording"

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.options, self.closed = fail, {}, 0

    async def create(self, image: ImageSpec, **options: Any) -> Sandbox:
        if self.fail:
            raise SandboxError("boom")
        self.options = options
        return _RecordingSandbox(image)

    async def aclose(self) -> None:
        self.closed += 1


def test_builtins_are_registered() -> None:
    known = available_providers()
    assert {"bwrap", "sunabako", "e2b"} <= set(known)
    assert known["bwrap"] == "lego_rl.sandbox.bwrap:BwrapProvider"


def test_unknown_provider_lists_known_ones() -> None:
    with pytest.raises(SandboxError) as info:
        get_provider("nosuch")
    assert "'nosuch'" in str(info.value) and "bwrap" in str(info.value) and "sunabako" in str(info.value)


def test_resolve_image_forms(tmp_path) -> None:
    assert resolve_image("host").rootfs is None
    assert resolve_image(str(tmp_path)).rootfs == str(tmp_path)
    spec = ImageSpec(name="x", rootfs="/r", workdir="/testbed")
    assert resolve_image("x", {"x": spec}) is spec
    with pytest.raises(SandboxError, match="relative/dir"):
        resolve_image("relative/dir")
    with pytest.raises(SandboxError, match="not one of the 1 images"):
        resolve_image("docker.io/nope:1", {"x": spec})


async def test_context_closes_sandbox_but_not_a_borrowed_provider() -> None:
    provider = _RecordingProvider()
    async with create_sandbox("host", provider=provider, memory_mb=64) as sb:
        assert isinstance(sb, _RecordingSandbox)
        assert provider.options == {"memory_mb": 64}
    assert sb.closed == 1 and provider.closed == 0


async def test_awaiting_returns_open_sandbox() -> None:
    provider = _RecordingProvider()
    sb = await create_sandbox("host", provider=provider)
    assert sb.closed == 0
    await sb.close()


async def test_provider_options_rejected_for_instances() -> None:
    with pytest.raises(SandboxError, match="provider_options"):
        create_sandbox("host", provider=_RecordingProvider(), provider_options={"a": 1})


async def test_failed_create_propagates() -> None:
    with pytest.raises(SandboxError, match="boom"):
        async with create_sandbox("host", provider=_RecordingProvider(fail=True)):
            pass


def test_bad_provider_options_name_the_provider() -> None:
    with pytest.raises(SandboxError, match="'bwrap' rejected its options \\['colour'\\]"):
        get_provider("bwrap", colour="red")
