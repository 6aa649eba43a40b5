"""Fixtures for harness tests: real bwrap sandboxes on the test rootfs (see harness_helpers)."""

from __future__ import annotations

import os
import shutil
import sys
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


SUNABAKO_TEST_STATE = os.environ.get("LEGO_SUNABAKO_TEST_STATE", "/var/lib/lego-rl/sunabako-test")


@pytest.fixture
async def make_sunabako() -> AsyncIterator[MakeSandbox]:
    """Real sunabako sandboxes (native runtime, test memory mode) over the same rootfs; closed at teardown."""
    binary = shutil.which("sunabako") or str(Path(sys.executable).with_name("sunabako"))
    if os.geteuid() != 0:
        missing("sunabako sandboxes need root")
    if not Path(binary).exists():
        missing("the sunabako binary is not installed (pip install 'lego-rl[sunabako]')")
    if not Path(ROOTFS, ".lego-rootfs-stamp").is_file():
        missing(f"no test rootfs at {ROOTFS}: run scripts/build_rootfs.sh")
    made: list[Sandbox] = []
    options = {"state_dir": SUNABAKO_TEST_STATE, "test_memory": True, "binary": binary}

    async def make(image: ImageSpec | None = None, **kw: Any) -> Sandbox:
        spec = image or ImageSpec(name="bookworm-test", rootfs=ROOTFS, workdir="/testbed")
        sb = await create_sandbox(spec, provider="sunabako", provider_options=options, **kw)
        made.append(sb)
        return sb

    yield make
    for sb in made:
        await sb.close()
