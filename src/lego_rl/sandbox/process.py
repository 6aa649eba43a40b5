"""Run one host process for a sandbox: timeout, whole-tree kill, partial output kept.

Shared by providers whose exec is a host process (bwrap). The child starts in its own session so a
timeout or a cancellation can SIGKILL the whole process group; providers that start a PID namespace
(bwrap ``--unshare-pid --die-with-parent``) make that kill reach every descendant, including ones that
left the group with ``setsid``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass
from typing import IO

from lego_rl.errors import SandboxError

_READ_CHUNK = 1 << 16
_SPAWN_S = 60.0
"""A fork+exec and two pipe connections take milliseconds; past this the spawn is stuck, not slow."""
_SPAWN_GRACE_S = 5.0


@dataclass(frozen=True)
class ProcessResult:
    """Raw outcome: ``returncode`` is negative when the process itself died of a signal."""

    returncode: int
    stdout: bytes
    stderr: bytes
    duration_s: float
    timed_out: bool
    killed: bool
    """True when we killed it: on timeout, or because the owner called ``kill_all``."""
    truncated: bool = False
    """Output beyond ``max_output`` bytes per stream was read and dropped."""


class ProcessGroup:
    """The live host processes of one sandbox, so ``close()`` can kill what is still running."""

    def __init__(self) -> None:
        self._procs: set[asyncio.subprocess.Process] = set()
        self._killed: set[int] = set()

    def __len__(self) -> int:
        return len(self._procs)

    def kill_all(self) -> None:
        for proc in list(self._procs):
            self._killed.add(proc.pid)
            _kill_tree(proc)

    async def wait_all(self, timeout: float = 5.0) -> None:
        procs = list(self._procs)
        if procs:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), timeout)

    async def run(
        self,
        argv: list[str],
        *,
        stdin: bytes | IO[bytes] | None = None,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        max_output: int | None = None,
    ) -> ProcessResult:
        """Run ``argv`` to completion (or timeout), collecting stdout/stderr as bytes.

        ``max_output`` caps what is kept of each stream (the rest is drained and dropped), so a
        command printing gigabytes cannot exhaust this process's memory.
        """
        start = time.monotonic()
        feed = stdin if isinstance(stdin, bytes) else None
        proc = await _spawn(
            argv,
            stdin=(asyncio.subprocess.PIPE if isinstance(stdin, bytes)
                   else stdin or asyncio.subprocess.DEVNULL),
            env=env,
        )
        self._procs.add(proc)
        out, err = bytearray(), bytearray()
        assert proc.stdout is not None and proc.stderr is not None
        readers: list[asyncio.Future[bool | None]] = [
            asyncio.ensure_future(_drain(proc.stdout, out, max_output)),
            asyncio.ensure_future(_drain(proc.stderr, err, max_output)),
        ]
        if feed is not None:
            readers.append(asyncio.ensure_future(_feed(proc, feed)))
        timed_out = False
        try:
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except TimeoutError:
                timed_out = True
                self._killed.add(proc.pid)
                _kill_tree(proc)
                await proc.wait()
            # Pipes close when the last holder dies; the PID namespace guarantees that happens.
            await asyncio.wait_for(asyncio.gather(*readers), 10)
        except BaseException:
            # Cancelled (or the drain hung): never leave the tree running behind us.
            self._killed.add(proc.pid)
            _kill_tree(proc)
            for task in readers:
                task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(proc.wait(), 5)
            raise
        finally:
            self._procs.discard(proc)
        killed = proc.pid in self._killed
        self._killed.discard(proc.pid)
        assert proc.returncode is not None
        truncated = any(task.result() for task in readers[:2])
        return ProcessResult(
            proc.returncode, bytes(out), bytes(err), time.monotonic() - start, timed_out, killed, truncated
        )


async def _spawn(
    argv: list[str], *, stdin: int | IO[bytes], env: dict[str, str] | None
) -> asyncio.subprocess.Process:
    """``create_subprocess_exec`` (own session, piped output), bounded and safe to cancel.

    asyncio's spawn can wait forever: when the task connecting its pipes is cancelled (``asyncio.run``
    cancels every task at once when it shuts down), the transport kills the child and then waits for
    pipes that were never connected (``base_subprocess._try_finish``, Python 3.11/3.12), so a cancelled
    rollout hung holding its sandbox. The spawn runs as a task of its own: a cancellation of ours waits
    for it briefly and kills what it started; a spawn stuck past ``_SPAWN_S`` is cancelled again, which
    releases asyncio's wait (the child was already killed), and reported.
    """
    spawn = asyncio.ensure_future(asyncio.create_subprocess_exec(
        *argv, stdin=stdin, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
        start_new_session=True,
    ))
    try:
        done, _ = await asyncio.wait({spawn}, timeout=_SPAWN_S)
    except asyncio.CancelledError:
        await _abandon(spawn)
        raise
    if not done:
        await _abandon(spawn)
        raise SandboxError(f"starting {argv[0]!r} did not finish within {_SPAWN_S:g} s (asyncio spawn stuck)")
    return spawn.result()


async def _abandon(spawn: asyncio.Future[asyncio.subprocess.Process]) -> None:
    """Let a spawn we no longer want finish (bounded), then kill and reap what it started."""
    if not spawn.done():
        await asyncio.wait({spawn}, timeout=_SPAWN_GRACE_S)
    if not spawn.done():
        spawn.cancel()
        await asyncio.wait({spawn}, timeout=_SPAWN_GRACE_S)
    if spawn.done() and not spawn.cancelled() and spawn.exception() is None:
        proc = spawn.result()
        _kill_tree(proc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), _SPAWN_GRACE_S)


def _kill_tree(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


async def _drain(stream: asyncio.StreamReader, sink: bytearray, limit: int | None) -> bool:
    """Read to EOF; keep at most ``limit`` bytes. Returns whether anything was dropped."""
    dropped = False
    while chunk := await stream.read(_READ_CHUNK):
        room = len(chunk) if limit is None else max(0, limit - len(sink))
        if room < len(chunk):
            dropped = True
        sink += chunk[:room]
    return dropped


async def _feed(proc: asyncio.subprocess.Process, data: bytes) -> None:
    assert proc.stdin is not None
    try:
        proc.stdin.write(data)
        await proc.stdin.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the command did not read all of its input; its exit status tells the story
    finally:
        proc.stdin.close()
