"""Harness install cost per sandbox: a shared read-only tree (mount) against the copy path, same run.

For each native CLI in the toolchain (scripts/setup_toolchain.sh), on fresh bwrap sandboxes:
  copy      the old path (``share=False``): upload the cached plain tar, extract, chmod, mark  (baseline)
  first     shared path, first sandbox of the process: extract on the host if absent, digest check, mount
  shared    shared path, every later sandbox: one mkdir exec and a mount entry (median of --repeat)
  verify    ``--version`` as the agent user through the mount
Run as root:  .venv/bin/python benchmarks/harness_install.py [--repeat 5]
``LEGO_TOOLCHAIN_TREES`` chooses the host tree folder (default /var/cache/lego-rl/toolchain-trees).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from lego_rl.harness import Toolchain, get_harness, get_plugin_manager
from lego_rl.harness.install import install_archive
from lego_rl.harness.toolchain import cached_integrity
from lego_rl.sandbox import ImageSpec, create_sandbox

ROOTFS = os.environ.get("LEGO_ROOTFS_CACHE", "/var/cache/lego-rl/rootfs-bookworm")
IMAGE = ImageSpec(name="bench", rootfs=ROOTFS, workdir="/testbed")


async def measure(name: str, toolchain: Toolchain, repeat: int) -> dict[str, float]:
    handle = get_harness(name, environ={}, pm=get_plugin_manager({}))
    [pin] = [p for p in handle.toolchain_pins() if p.role == "native"]
    path = toolchain.resolve(pin)  # hashes once; installs below reuse the memoised hash
    integrity = cached_integrity(path)
    copies = []
    for _ in range(max(1, repeat // 2)):
        async with create_sandbox(IMAGE, provider="bwrap") as sb:
            t0 = time.perf_counter()
            await install_archive(sb, path, "/opt/lego/bench", integrity=integrity, share=False)
            copies.append(time.perf_counter() - t0)
    shared = []
    verify = 0.0
    for i in range(repeat + 1):
        async with create_sandbox(IMAGE, provider="bwrap") as sb:
            t0 = time.perf_counter()
            await handle.install(sb, toolchain)
            shared.append(time.perf_counter() - t0)
            if i == 0:
                t0 = time.perf_counter()
                await handle.verify(sb, "agent")
                verify = time.perf_counter() - t0
    return {
        "mb": path.stat().st_size / 1e6,
        "copy": statistics.median(copies),
        "first": shared[0],
        "shared": statistics.median(shared[1:]),
        "verify": verify,
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    toolchain = Toolchain()
    print(f"{'harness':<12} {'archive MB':>10} {'copy s':>7} {'first s':>8} {'shared s':>9} "
          f"{'copy/shared':>12} {'verify s':>9}")
    for name in ("claude_code", "codex", "opencode"):
        m = await measure(name, toolchain, args.repeat)
        print(f"{name:<12} {m['mb']:>10.1f} {m['copy']:>7.2f} {m['first']:>8.2f} {m['shared']:>9.3f} "
              f"{m['copy'] / m['shared']:>12.1f} {m['verify']:>9.2f}")


if __name__ == "__main__":
    asyncio.run(main())
