"""Minimal reproduction of sunabako 0.1.2's start-up race ("key must be a string at line 1 column 2").

Only the sunabako binary, no lego code, no SDK: N concurrent ``sunabako create`` calls on a fresh node
with guest users (``uid_range_size`` 65536), repeated R times; prints the share that failed and the
first errors. Each success is stopped and deleted, each failure cancelled. With ``UIDS=1`` (no guest
users) the same run shows no failure. Run as root (the node's state dir is created if absent):

    python3 benchmarks/sunabako_race.py STATE_DIR ROOTFS [N=2] [ROUNDS=3]
    UIDS=1 python3 benchmarks/sunabako_race.py /var/lib/lego-rl/race-1uid /var/cache/lego-rl/rootfs-bookworm

``SUNABAKO_BINARY`` names the binary (default: the one on PATH).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
import uuid
from typing import Any

BIN = os.environ.get("SUNABAKO_BINARY") or shutil.which("sunabako") or "sunabako"


async def call(state: str, *args: str, data: Any = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        BIN, "--state", state, *args, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate(json.dumps(data).encode() if data is not None else None)
    return proc.returncode or 0, out.decode(), err.decode()


async def one(state: str, rootfs: str) -> tuple[bool, float, str]:
    sid, token = "race-" + uuid.uuid4().hex[:12], uuid.uuid4().hex
    spec = {"id": sid, "rootfs": rootfs, "memory_bytes": 512 << 20, "memory_mode": "rss", "runtime": "native",
            "gpus": [], "gpu_mode": "shared", "mounts": [], "network": "none", "env": {}, "pids_max": 256}  # fmt: skip
    start = time.perf_counter()
    rc, _, err = await call(state, "create", "-", "--token", token, data=spec)
    took = time.perf_counter() - start
    if rc:
        await call(state, "cancel-create", sid, token)
    else:
        await call(state, "stop", sid)
        await call(state, "delete", sid)
    return rc == 0, took, err.strip()


async def main(state: str, rootfs: str, n: int, rounds: int) -> None:
    if not os.path.exists(os.path.join(state, "node.json")):
        os.makedirs(state, exist_ok=True)
        config = {"uid_range_size": int(os.environ.get("UIDS", "65536")), "allow_unbounded_memory_for_tests": True}
        rc, _, err = await call(state, "init-node", "-", data=config)
        if rc:
            raise SystemExit(f"init-node failed: {err}")
    results = []
    for _ in range(rounds):
        results += await asyncio.gather(*(one(state, rootfs) for _ in range(n)))
    ok = sorted(t for good, t, _ in results if good)
    bad = [(t, e) for good, t, e in results if not good]
    median = ok[len(ok) // 2] if ok else float("nan")
    print(f"concurrency {n}, attempts {len(results)}, failed {len(bad)} ({100 * len(bad) / len(results):.0f} %), "
          f"successful create median {median:.2f} s, load average {os.getloadavg()[0]:.1f}")
    for took, err in bad[:3]:
        print(f"  after {took:.2f} s: {err[:240]}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 2,
                     int(sys.argv[4]) if len(sys.argv) > 4 else 3))
