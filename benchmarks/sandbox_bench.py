"""Sandbox lifecycle cost per provider: create, a trivial exec, destroy (median and p99).

Baseline, measured in the same run: a plain asyncio subprocess running ``true`` on the host, so the
figures read as "how many plain process spawns does this cost". Run as root, after
scripts/build_rootfs.sh::

    nice .venv/bin/python benchmarks/sandbox_bench.py [--n 30] [--sunabako-n 8] [--providers bwrap,sunabako]

Targets (issue 6): bwrap create+exec+destroy < 50 ms; sunabako create < 1.5 s on ext4.
sunabako create includes the provider's work (guest user ``agent``) and its retries of the known
transient create failure; the number of retries is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
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


async def lifecycle(name: str, n: int, options: dict[str, Any]) -> dict[str, list[float]]:
    provider = get_provider(name, **options)
    image = ImageSpec(name="bookworm", rootfs=ROOTFS, workdir="/testbed")
    out: dict[str, list[float]] = {"create": [], "exec": [], "destroy": [], "total": []}
    failed = 0
    for i in range(n + 1):  # the first round warms caches and is dropped
        try:
            t_create, sb = await timed(partial(provider.create, image))
        except SandboxError as exc:  # every retry used up: count it, keep measuring
            failed += 1
            print(f"{name}: create failed after retries: {str(exc)[:160]}")
            continue
        t_exec, res = await timed(partial(sb.exec, ["true"], user="agent"))
        assert res.ok, res
        t_destroy, _ = await timed(sb.close)
        if i:
            for key, value in zip(out, (t_create, t_exec, t_destroy, t_create + t_exec + t_destroy)):
                out[key].append(value)
    await provider.aclose()
    print(f"{name}: {failed} create(s) failed after all retries")
    return out


def row(label: str, samples: list[float], base: float) -> str:
    med, p99 = statistics.median(samples), pct(samples, 0.99)
    return f"| {label} | {med * 1e3:.1f} | {p99 * 1e3:.1f} | {med / base:.0f}x |"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=30, help="bwrap rounds")
    parser.add_argument("--sunabako-n", type=int, default=8, help="sunabako rounds (each ~1 s)")
    parser.add_argument("--providers", default="bwrap,sunabako")
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
            results = await lifecycle(name, args.sunabako_n, {"state_dir": SUNABAKO_STATE, "allow_test_memory": True})
        else:
            results = await lifecycle(name, args.n, {})
        for step, samples in results.items():
            if samples:
                print(row(f"{name} {step} (n={len(samples)})", samples, base))
    print(f"sunabako transient create retries: {counter.count}")
    print(f"load average at end: {os.getloadavg()[0]:.1f} (2-core box shared with other work)")


if __name__ == "__main__":
    asyncio.run(main())
