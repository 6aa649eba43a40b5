"""Fixtures for workspace, patch and grader tests: a real task image and real sandboxes."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
from swe_data import WORKDIR, build_task_image, provider_options, require_setup

from lego_rl.sandbox.base import ImageSpec, Sandbox
from lego_rl.sandbox.factory import create_sandbox

# sunabako creates copy the whole rootfs (~1 s each here, more with its transient-failure retries).
PROVIDERS = ["bwrap", pytest.param("sunabako", marks=[pytest.mark.slow, pytest.mark.root])]


@pytest.fixture(scope="session")
def task_image() -> Iterator[tuple[ImageSpec, str]]:
    require_setup("bwrap")
    # Not under pytest's tmp dir: that is root-only (0700), and sandbox runtimes that chroot as
    # another user must traverse every directory above an image.
    base = Path(tempfile.mkdtemp(prefix="lego-swe-image-", dir="/var/tmp"))
    base.chmod(0o755)
    try:
        yield build_task_image(base / "rootfs")
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(params=PROVIDERS)
def provider(request: pytest.FixtureRequest) -> str:
    name = str(request.param)
    require_setup(name)
    return name


@pytest.fixture
def opener(provider: str, task_image: tuple[ImageSpec, str]) -> Callable[[], AbstractAsyncContextManager[Sandbox]]:
    spec = task_image[0]
    return lambda: create_sandbox(spec, provider=provider, provider_options=provider_options(provider))


@pytest.fixture
async def agent_sb(opener: Callable[[], AbstractAsyncContextManager[Sandbox]]) -> AsyncIterator[Sandbox]:
    async with opener() as sb:
        yield sb


FOREIGN_UID = 4000000  # no sandbox maps it (sunabako: 60000 + 65536 here)


@pytest.fixture(scope="session")
def acl_image() -> Iterator[ImageSpec]:
    """The task image with POSIX ACLs naming a uid outside every sandbox's uid map on its repository."""
    require_setup("bwrap")
    if shutil.which("setfacl") is None:
        pytest.fail("setfacl is not installed (apt-get install acl; `make system-deps` does)")
    base = Path(tempfile.mkdtemp(prefix="lego-acl-image-", dir="/var/tmp"))
    base.chmod(0o755)
    try:
        spec, _ = build_task_image(base / "rootfs")
        repo = base / "rootfs" / WORKDIR.lstrip("/")
        # Access ACLs on every file and directory, default ACLs on directories: what `git gc` writes
        # during setup inherits them too.
        subprocess.run(["setfacl", "-R", "-m", f"u:{FOREIGN_UID}:rwX,g:{FOREIGN_UID}:rX", str(repo)], check=True)
        subprocess.run(["setfacl", "-R", "-d", "-m", f"u:{FOREIGN_UID}:rwX", str(repo)], check=True)
        listed = subprocess.run(["getfacl", "-p", str(repo / ".git" / "objects")], capture_output=True, text=True)
        assert f"user:{FOREIGN_UID}:rwx" in listed.stdout  # the fixture really has them
        yield spec
    finally:
        shutil.rmtree(base, ignore_errors=True)
