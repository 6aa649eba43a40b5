"""Fault behaviour: a sandbox that dies under a running exec raises SandboxError, never hangs."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from sandbox_helpers import MakeSandbox, host_processes

from lego_rl.errors import SandboxError

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.timeout(600)]


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


async def _wait_for(marker: str) -> list[int]:
    for _ in range(100):
        pids = host_processes(marker)
        if pids:
            return pids
        await asyncio.sleep(0.1)
    raise AssertionError(f"no process with {marker!r} appeared")


async def test_killed_sandbox_process_raises(make_sandbox: MakeSandbox, provider_name: str) -> None:
    if provider_name == "e2b":
        pytest.skip("cannot kill a remote sandbox's processes from here")
    sb = await make_sandbox()
    marker = f"sleep {4000 + uuid.uuid4().int % 5000}7"
    running = asyncio.ensure_future(sb.exec(marker, timeout=120))
    pids = await _wait_for(marker)
    if provider_name == "bwrap":
        victims = [p for p in pids if _ppid(p) == os.getpid()]  # the bwrap process this exec started
    else:
        info = await sb._inner.get_info()  # type: ignore[attr-defined]
        victims = [int(info["status"]["supervisor_pid"]), int(info["status"]["init_pid"])]
    assert victims
    start = time.monotonic()
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(SandboxError):
        res = await asyncio.wait_for(running, 60)
        # a provider may report the death as a failed result only if it says the sandbox is gone
        raise AssertionError(f"exec returned {res} instead of raising")
    assert time.monotonic() - start < 60
    await sb.close()
    assert host_processes(marker) == []
