"""Helpers for harness tests: real bwrap sandboxes on the test rootfs, and small real archives.

Sandbox tests need root, bubblewrap and the rootfs of scripts/build_rootfs.sh; the real-CLI install
tests also need the toolchain of scripts/setup_toolchain.sh. A missing set-up fails, naming the
script; LEGO_SKIP_MISSING_SETUP=1 turns that into a skip.
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest


ROOTFS = os.environ.get("LEGO_ROOTFS_CACHE", "/var/cache/lego-rl/rootfs-bookworm")


def missing(reason: str) -> None:
    if os.environ.get("LEGO_SKIP_MISSING_SETUP") == "1":
        pytest.skip(reason)
    pytest.fail(f"{reason} (set LEGO_SKIP_MISSING_SETUP=1 to skip instead)")


def make_tgz(path: Path, files: dict[str, bytes | str], *, top: str = "package", modes: dict[str, int] | None = None) -> Path:
    """Write a gzip tarball whose members sit under ``top/`` (like an npm tarball)."""
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            raw = data.encode() if isinstance(data, str) else data
            info = tarfile.TarInfo(f"{top}/{name}" if top else name)
            info.size = len(raw)
            info.mode = (modes or {}).get(name, 0o644)
            tar.addfile(info, io.BytesIO(raw))
    return path
