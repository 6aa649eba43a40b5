"""Helpers for the sandbox contract tests: every provider available on this machine, real.

Providers and what they need:
* bwrap: root, bubblewrap, the debootstrap rootfs (scripts/build_rootfs.sh).
* sunabako: root, the sunabako binary from the venv, the same rootfs; a test node state dir is
  initialised with the test memory mode (allow_unbounded_memory_for_tests + memory_mode="rss").
* e2b: E2B_API_KEY (a remote service; skipped without a key).

A missing local set-up fails the tests, naming the script to run; set LEGO_SKIP_MISSING_SETUP=1 to
turn that into a skip instead.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from lego_rl.sandbox import ImageSpec, Sandbox

ROOTFS = os.environ.get("LEGO_ROOTFS_CACHE", "/var/cache/lego-rl/rootfs-bookworm")
SUNABAKO_TEST_STATE = os.environ.get("LEGO_SUNABAKO_TEST_STATE", "/var/lib/lego-rl/sunabako-test")
IMAGE_ENV = {"LEGO_IMAGE_VAR": "from-image"}

MakeSandbox = Callable[..., Awaitable[Sandbox]]


def _missing(reason: str) -> None:
    if os.environ.get("LEGO_SKIP_MISSING_SETUP") == "1":
        pytest.skip(reason)
    pytest.fail(f"{reason} (set LEGO_SKIP_MISSING_SETUP=1 to skip instead)")


def _require_rootfs() -> None:
    if os.geteuid() != 0:
        _missing("sandbox contract tests need root")
    if not Path(ROOTFS, ".lego-rootfs-stamp").is_file():
        _missing(f"no test rootfs at {ROOTFS}: run scripts/build_rootfs.sh")


def provider_options(name: str) -> dict[str, Any]:
    if name == "sunabako":
        return {"state_dir": SUNABAKO_TEST_STATE, "allow_test_memory": True, "binary": _sunabako_binary()}
    return {}


def _sunabako_binary() -> str:
    return shutil.which("sunabako") or str(Path(sys.executable).with_name("sunabako"))


def check_available(name: str) -> None:
    if name == "bwrap":
        _require_rootfs()
        if shutil.which("bwrap") is None:
            _missing("bubblewrap is not installed (apt-get install bubblewrap)")
    elif name == "sunabako":
        _require_rootfs()
        if not Path(_sunabako_binary()).exists():
            _missing("the sunabako binary is not installed (pip install 'lego-rl[sunabako]')")
    elif name == "e2b":
        if not os.environ.get("E2B_API_KEY"):
            pytest.skip("e2b: no E2B_API_KEY in the environment (remote service)")
        pytest.importorskip("e2b")


def image_for(name: str, workdir: str = "/testbed") -> ImageSpec:
    if name == "e2b":
        return ImageSpec(name=os.environ.get("LEGO_E2B_TEMPLATE", "base"), workdir="/home/user", env=IMAGE_ENV)
    return ImageSpec(name="bookworm-test", rootfs=ROOTFS, workdir=workdir, env=IMAGE_ENV)


def host_processes(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker`` (our sandboxes run on this host)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if marker.encode() in cmdline:
                pids.append(int(entry.name))
    return pids
