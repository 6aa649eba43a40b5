"""The run directory's lock: one process trains a run directory at a time.

``lego train`` (GRPO or SFT, fresh or ``--resume``), ``lego rollout-check`` and ``lego screen`` take an
exclusive ``flock(2)`` on ``RUN_ROOT/run.lock`` when they open the directory, and hold it until they close
it. The file holds the holder as one JSON object (pid, host, start time), so a second process is refused
with one line naming it instead of both writing metrics rows and checkpoints into one run.

The kernel releases a ``flock`` when its process dies (kill -9 included), so a dead holder never blocks
the next run. A holder that closes cleanly empties the file before unlocking; a taker that finds the file
still naming a holder knows that holder died without closing, and says so (``previous``).

Caveat: a lock is shared by every process that inherits its descriptor through a bare ``fork()``; the
descriptor is opened non-inheritable, so ``subprocess`` children never hold it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lego_rl.errors import RunDirLocked

LOCK_NAME = "run.lock"


@dataclass(frozen=True)
class LockHolder:
    """Who holds (or held) a run directory's lock."""

    pid: int
    host: str
    since: float
    """Unix seconds when the holder took the lock."""

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since))
        return f"pid {self.pid} on {self.host}, since {when}"

    @classmethod
    def parse(cls, text: str) -> LockHolder | None:
        """The holder a lock file names; None for an empty or unreadable file (a clean release)."""
        try:
            d: Any = json.loads(text)
            return cls(pid=int(d["pid"]), host=str(d["host"]), since=float(d["since"]))
        except (ValueError, KeyError, TypeError):
            return None


class RunLock:
    """An exclusive lock on one run directory, held until ``release`` (or the process's death)."""

    def __init__(self, path: Path, fd: int, holder: LockHolder, previous: LockHolder | None) -> None:
        self.path = path
        self._fd: int | None = fd
        self.holder = holder
        self.previous = previous
        """The holder the file still named when this one took it: it died without releasing (kill -9, a
        crash, a lost machine). None after a clean release or on a fresh directory."""

    @classmethod
    def acquire(cls, root: Path) -> RunLock:
        """Take ``root``'s lock without waiting.

        :raises RunDirLocked: another live process holds it; the message names it (pid, host, since when).
        """
        path = root / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # non-inheritable (PEP 446)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            text = _read(fd)
            os.close(fd)
            held = LockHolder.parse(text)
            who = held.describe() if held else "another process (it has not written its name yet)"
            raise RunDirLocked(
                f"{root} is in use by {who}: one process trains a run directory at a time; wait for it to "
                f"finish or stop it (a dead process releases {path} by itself)",
                parameter="paths.run_root", value=str(root)) from None
        except BaseException:
            os.close(fd)
            raise
        previous = LockHolder.parse(_read(fd))
        holder = LockHolder(pid=os.getpid(), host=socket.gethostname(), since=round(time.time(), 3))
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder.__dict__).encode() + b"\n", 0)
        os.fsync(fd)
        return cls(path, fd, holder, previous)

    def release(self) -> None:
        """Empty the file (a clean release names nobody) and unlock; a second call does nothing."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing the last descriptor releases the flock


def read_holder(root: Path) -> LockHolder | None:
    """The holder ``root``'s lock file names, if any (the holder may have died: see ``RunLock.previous``)."""
    try:
        return LockHolder.parse((root / LOCK_NAME).read_text())
    except OSError:
        return None


def _read(fd: int) -> str:
    return os.pread(fd, 4096, 0).decode(errors="replace")
