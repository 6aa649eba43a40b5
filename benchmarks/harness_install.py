"""Harness install cost per sandbox, as ratios against the bare upload of the same archive.

For each native CLI archive in the toolchain (scripts/setup_toolchain.sh) and a fresh bwrap sandbox:
  baseline  upload only: ``write_file`` of the archive into the sandbox (the transfer any install pays)
  install   ``lego_harness_install``: hash check on the host (memoised), upload, sha512sum inside,
            extract, chmod, marker
  reinstall the same install again in the same sandbox (marker hit: a reused snapshot)
  verify    ``--version`` as the agent user
Run as root:  .venv/bin/python benchmarks/harness_install.py
"""

from __future__ import annotations

import asyncio
import os
import time

from lego_rl.harness import Toolchain, get_harness, get_plugin_manager
from lego_rl.sandbox import ImageSpec, create_sandbox

ROOTFS = os.environ.get("LEGO_ROOTFS_CACHE", "/var/cache/lego-rl/rootfs-bookworm")
IMAGE = ImageSpec(name="bench", rootfs=ROOTFS, workdir="/testbed")


async def measure(name: str, toolchain: Toolchain) -> dict[str, float]:
    handle = get_harness(name, environ={}, pm=get_plugin_manager({}))
    [pin] = [p for p in handle.toolchain_pins() if p.role == "native"]
    path = toolchain.resolve(pin)  # hashes once; installs below reuse the memoised hash
    async with create_sandbox(IMAGE, provider="bwrap") as sb:
        t0 = time.perf_counter()
        await sb.write_file("/tmp/upload-only.tgz", path)
        upload = time.perf_counter() - t0
    async with create_sandbox(IMAGE, provider="bwrap") as sb:
        t0 = time.perf_counter()
        await handle.install(sb, toolchain)
        install = time.perf_counter() - t0
        t0 = time.perf_counter()
        await handle.install(sb, toolchain)
        reinstall = time.perf_counter() - t0
        t0 = time.perf_counter()
        await handle.verify(sb, "agent")
        verify = time.perf_counter() - t0
    return {
        "mb": path.stat().st_size / 1e6,
        "upload": upload,
        "install": install,
        "reinstall": reinstall,
        "verify": verify,
    }


async def main() -> None:
    toolchain = Toolchain()
    print(
        f"{'harness':<12} {'archive MB':>10} {'upload s':>9} {'install/upload':>15} {'reinstall/upload':>17} "
        f"{'verify/upload':>14}"
    )
    for name in ("claude_code", "codex", "opencode"):
        m = await measure(name, toolchain)
        print(
            f"{name:<12} {m['mb']:>10.1f} {m['upload']:>9.2f} {m['install'] / m['upload']:>15.2f} "
            f"{m['reinstall'] / m['upload']:>17.3f} {m['verify'] / m['upload']:>14.2f}"
        )


if __name__ == "__main__":
    asyncio.run(main())
