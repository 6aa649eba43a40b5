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

_READ_CHUNK = 1 << 16


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
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=(asyncio.subprocess.PIPE if isinstance(stdin, bytes)
                   else stdin or asyncio.subprocess.DEVNULL),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,
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
