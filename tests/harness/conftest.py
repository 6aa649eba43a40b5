"""Fixtures for harness tests: real bwrap sandboxes on the test rootfs (see harness_helpers)."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from harness_helpers import ROOTFS, missing

from lego_rl.sandbox import ImageSpec, Sandbox, create_sandbox

MakeSandbox = Callable[..., Awaitable[Sandbox]]


@pytest.fixture
async def make_sandbox() -> AsyncIterator[MakeSandbox]:
    """Real bwrap sandboxes over the test rootfs (no network); all closed at teardown."""
    if os.geteuid() != 0:
        missing("harness sandbox tests need root")
    if shutil.which("bwrap") is None:
        missing("bubblewrap is not installed (apt-get install bubblewrap)")
    if not Path(ROOTFS, ".lego-rootfs-stamp").is_file():
        missing(f"no test rootfs at {ROOTFS}: run scripts/build_rootfs.sh")
    made: list[Sandbox] = []

    async def make(image: ImageSpec | None = None, **options: Any) -> Sandbox:
        spec = image or ImageSpec(name="bookworm-test", rootfs=ROOTFS, workdir="/testbed")
        sb = await create_sandbox(spec, provider="bwrap", **options)
        made.append(sb)
        return sb

    yield make
    for sb in made:
        await sb.close()
