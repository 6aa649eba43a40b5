"""Helpers for harness tests: real bwrap sandboxes on the test rootfs, and small real archives.

Sandbox tests need root, bubblewrap and the rootfs of scripts/build_rootfs.sh; the real-CLI install
tests also need the toolchain of scripts/setup_toolchain.sh. A missing set-up fails, naming the
script; LEGO_SKIP_MISSING_SETUP=1 turns that into a skip.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest
from aiohttp import web

ROOTFS = os.environ.get("LEGO_ROOTFS_CACHE", "/var/cache/lego-rl/rootfs-bookworm")


def missing(reason: str) -> None:
    if os.environ.get("LEGO_SKIP_MISSING_SETUP") == "1":
        pytest.skip(reason)
    pytest.fail(f"{reason} (set LEGO_SKIP_MISSING_SETUP=1 to skip instead)")


def make_tgz(
    path: Path, files: dict[str, bytes | str], *, top: str = "package", modes: dict[str, int] | None = None
) -> Path:
    """Write a gzip tarball whose members sit under ``top/`` (like an npm tarball)."""
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            raw = data.encode() if isinstance(data, str) else data
            info = tarfile.TarInfo(f"{top}/{name}" if top else name)
            info.size = len(raw)
            info.mode = (modes or {}).get(name, 0o644)
            tar.addfile(info, io.BytesIO(raw))
    return path


def sri(data: bytes) -> str:
    """Subresource-integrity string of ``data``, as the npm registry publishes it."""
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


class Registry:
    """Serves ``/<name>/<version>`` documents and ``/t/<file>`` tarballs; ``lie`` publishes a wrong hash."""

    def __init__(self) -> None:
        self.tarballs: dict[tuple[str, str], bytes] = {}
        self.lie: set[tuple[str, str]] = set()
        self.downloads = 0
        self.url = ""

    async def doc(self, request: web.Request) -> web.Response:
        key = (request.match_info["name"].replace("%2f", "/"), request.match_info["version"])
        if key not in self.tarballs:
            return web.json_response({"error": "not found"}, status=404)
        data = self.tarballs[key]
        published = sri(b"other bytes") if key in self.lie else sri(data)
        tarball = f"{self.url}/t/{key[0].replace('/', '_')}-{key[1]}.tgz"
        return web.json_response(
            {"name": key[0], "version": key[1], "dist": {"integrity": published, "tarball": tarball}}
        )

    async def tarball(self, request: web.Request) -> web.Response:
        self.downloads += 1
        stem = request.match_info["file"].removesuffix(".tgz")
        for (name, version), data in self.tarballs.items():
            if f"{name.replace('/', '_')}-{version}" == stem:
                return web.Response(body=data)
        return web.Response(status=404)


async def start_registry() -> tuple[Registry, web.AppRunner]:
    """Start a Registry double on 127.0.0.1 (random port); the caller cleans up the runner."""
    reg = Registry()
    app = web.Application()
    app.router.add_get("/t/{file}", reg.tarball)
    app.router.add_get("/{name:[^/]+(?:/[^/]+)?}/{version}", reg.doc)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    reg.url = f"http://127.0.0.1:{port}"
    return reg, runner
