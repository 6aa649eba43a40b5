"""A command cancelled while it is being spawned ends within a bound and leaves no process behind.

Issue 18: a rollout cancelled at shutdown hung for over 10 minutes holding its sandbox's overlay mounts.
``asyncio.run`` cancels every leftover task at once, including asyncio's own task that connects a new
child's pipes; asyncio's spawn then kills the child and waits forever for pipes that never connected.
Real processes, no sandbox needed (``ProcessGroup`` is what the bwrap provider runs every exec through).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from lego_rl.sandbox.process import ProcessGroup


def children() -> list[int]:
    """Live (non-zombie) child processes of this test process."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[1]) == os.getpid() and fields[0] != "Z":
                found.append(int(entry))
    return found


async def test_cancelling_every_task_mid_spawn_ends_within_a_bound() -> None:
    group = ProcessGroup()
    before = set(children())
    run = asyncio.create_task(group.run(["sleep", "300"]))
    await asyncio.sleep(0)  # the child is forked; its pipes are being connected
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert len(others) > 1, "expected asyncio's pipe-connecting task next to the run"
    start = time.monotonic()
    for task in others:  # what asyncio.run does to leftover tasks when it shuts down
        task.cancel()
    done, _ = await asyncio.wait({run}, timeout=20)
    if not done:  # the bug: free the task so the test process can end, then fail
        run.cancel()
        await asyncio.wait({run}, timeout=5)
    assert done, "the cancelled command was still being spawned after 20 s"
    assert run.cancelled()
    assert time.monotonic() - start < 15
    assert len(group) == 0
    for _ in range(50):  # the child's exit is reaped by asyncio's watcher shortly after the kill
        if set(children()) <= before:
            break
        await asyncio.sleep(0.1)
    assert set(children()) <= before, f"left running: {sorted(set(children()) - before)}"


async def test_cancelling_the_run_mid_spawn_kills_the_child() -> None:
    group = ProcessGroup()
    before = set(children())
    run = asyncio.create_task(group.run(["sleep", "300"]))
    await asyncio.sleep(0)
    run.cancel()
    done, _ = await asyncio.wait({run}, timeout=20)
    assert done and run.cancelled()
    for _ in range(50):
        if set(children()) <= before:
            break
        await asyncio.sleep(0.1)
    assert set(children()) <= before, f"left running: {sorted(set(children()) - before)}"
