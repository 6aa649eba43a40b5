"""Sandbox lifecycle cost per provider: create, a trivial exec, destroy (median and p99).

Baseline, measured in the same run: a plain asyncio subprocess running ``true`` on the host, so the
figures read as "how many plain process spawns does this cost". Run as root, after
scripts/build_rootfs.sh::

    nice .venv/bin/python benchmarks/sandbox_bench.py [--n 30] [--sunabako-n 8] [--providers bwrap,sunabako]

Targets (issue 6): bwrap create+exec+destroy < 50 ms; sunabako create < 1.5 s on ext4.
sunabako create includes the provider's work (guest user ``agent``) and its retries of the known
transient create failure; the number of retries is printed.

Issue 16 adds sunabako variants, each measured in the same run against plain ``sunabako`` (ext4 state):
  sunabako-xfs       the node's state on an XFS loop filesystem (reflink=1, made here with mkfs.xfs) and
                     the image staged beside it, so the node's ``cp --reflink=auto`` clones instead of copying
  sunabako-xfs-pool  the same with ``warm_pool`` sandboxes made ahead; each round holds its sandbox for
                     ``--hold`` seconds (the agent's run), during which the pool refills
``--concurrency`` runs that many lifecycles at once (the load a rollout batch puts on the node).

``bwrap-disk`` is bwrap with ``disk_mb`` (``--disk-mb``, default 4096): the writable layer on a loop-mounted
ext4 of that size (mkfs + mount at create, unmount at destroy), measured against plain ``bwrap`` in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from lego_rl.errors import SandboxError
from lego_rl.sandbox import ImageSpec, get_provider

ROOTFS = os.environ.get("LEGO_ROOTFS_CACHE", "/var/cache/lego-rl/rootfs-bookworm")
SUNABAKO_STATE = os.environ.get("LEGO_SUNABAKO_BENCH_STATE", "/var/lib/lego-rl/sunabako-bench")


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class RetryCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "transiently" in record.getMessage():
            self.count += 1


async def timed(fn: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = await fn()
    return time.perf_counter() - start, value


async def baseline(n: int) -> list[float]:
    async def spawn() -> None:
        proc = await asyncio.create_subprocess_exec("true")
        await proc.wait()

    await spawn()  # warm-up
    return [(await timed(spawn))[0] for _ in range(n)]


async def lifecycle(name: str, n: int, options: dict[str, Any], *, concurrency: int = 1,
                    hold: float = 0.0, create_options: dict[str, Any] | None = None) -> dict[str, list[float]]:
    provider = get_provider(name.split("-")[0], **options)
    image = ImageSpec(name="bookworm", rootfs=ROOTFS, workdir="/testbed")
    out: dict[str, list[float]] = {"create": [], "exec": [], "destroy": [], "total": []}
    failed = 0

    async def one(keep: bool) -> None:
        nonlocal failed
        try:
            t_create, sb = await timed(partial(provider.create, image, **(create_options or {})))
        except SandboxError as exc:  # every retry used up: count it, keep measuring
            failed += 1
            print(f"{name}: create failed after retries: {str(exc)[:160]}")
            return
        t_exec, res = await timed(partial(sb.exec, ["true"], user="agent"))
        assert res.ok, res
        await asyncio.sleep(hold)
        try:
            t_destroy, _ = await timed(sb.close)
        except SandboxError as exc:
            print(f"{name}: destroy failed: {str(exc)[:160]}")
            return
        if keep:
            for key, value in zip(out, (t_create, t_exec, t_destroy, t_create + t_exec + t_destroy)):
                out[key].append(value)

    await one(False)  # the first round warms caches (and stages the image) and is dropped
    pool = getattr(provider, "pool", None)
    if pool is not None:
        await pool.wait_filled()
    for _ in range(max(1, n // concurrency)):
        await asyncio.gather(*(one(True) for _ in range(concurrency)))
    await provider.aclose()
    print(f"{name}: {failed} create(s) failed after all retries; load average {os.getloadavg()[0]:.1f}")
    return out


def xfs_state(base: str) -> str:
    """An XFS (reflink=1) loop filesystem mounted at ``base``/mnt, made once; returns a node state dir in it."""
    mnt = os.path.join(base, "mnt")
    if not os.path.ismount(mnt):
        os.makedirs(mnt, exist_ok=True)
        os.chmod(base, 0o755)
        img = os.path.join(base, "fs.img")
        with open(img, "wb") as fh:
            fh.truncate(8 << 30)
        subprocess.run(["mkfs.xfs", "-q", "-f", "-m", "reflink=1", img], check=True)
        subprocess.run(["mount", "-o", "loop", img, mnt], check=True)
    return os.path.join(mnt, "node")


def row(label: str, samples: list[float], base: float) -> str:
    med, p99 = statistics.median(samples), pct(samples, 0.99)
    return f"| {label} | {med * 1e3:.1f} | {p99 * 1e3:.1f} | {med / base:.0f}x |"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=30, help="bwrap rounds")
    parser.add_argument("--sunabako-n", type=int, default=8, help="sunabako rounds (each ~1 s)")
    parser.add_argument("--providers", default="bwrap,sunabako")
    parser.add_argument("--concurrency", type=int, default=1, help="sunabako lifecycles at once")
    parser.add_argument("--hold", type=float, default=3.0, help="seconds each pooled sandbox is held")
    parser.add_argument("--pool", type=int, default=2, help="warm_pool size of sunabako-xfs-pool")
    parser.add_argument("--xfs", default="/var/tmp/lego-bench-xfs", help="where the XFS loop filesystem goes")
    parser.add_argument("--disk-mb", type=int, default=4096, help="disk cap of the bwrap-disk variant")
    args = parser.parse_args()
    counter = RetryCounter()
    logging.getLogger("lego_rl.sandbox.sunabako_provider").addHandler(counter)

    base_samples = await baseline(max(args.n, 30))
    base = statistics.median(base_samples)
    print(f"baseline: asyncio subprocess `true`, median {base * 1e3:.2f} ms, p99 {pct(base_samples, .99) * 1e3:.2f} ms")
    print("| provider / step | median ms | p99 ms | median vs baseline |")
    print("|---|---|---|---|")
    for name in args.providers.split(","):
        if name == "sunabako":
            results = await lifecycle(name, args.sunabako_n, {"state_dir": SUNABAKO_STATE, "allow_test_memory": True},
                                      concurrency=args.concurrency)
        elif name.startswith("sunabako-xfs"):
            opts: dict[str, Any] = {"state_dir": xfs_state(args.xfs), "allow_test_memory": True, "stage_rootfs": True}
            if name == "sunabako-xfs-pool":
                opts["warm_pool"] = args.pool
            results = await lifecycle(name, args.sunabako_n, opts, concurrency=args.concurrency,
                                      hold=args.hold if name.endswith("pool") else 0.0)
        elif name == "bwrap-disk":
            results = await lifecycle(name, args.n, {}, create_options={"disk_mb": args.disk_mb})
        else:
            results = await lifecycle(name, args.n, {})
        for step, samples in results.items():
            if samples:
                print(row(f"{name} {step} (n={len(samples)})", samples, base))
        if name.startswith("sunabako"):
            print(f"{name}: transient create retries (start-up race): {counter.count}")
            counter.count = 0
    print(f"load average at end: {os.getloadavg()[0]:.1f} (2-core box shared with other work)")


if __name__ == "__main__":
    asyncio.run(main())
