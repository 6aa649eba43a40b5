"""Append-only JSON-lines logs and the readers that follow them while they grow.

Writers (``EventLog``, ``MetricsLog``) only ever append whole lines, each flushed at once. Readers
(``JsonlFollower``) serve the monitor, which tails a live run, and resume, which reads a finished one:

* a ``Cursor`` (inode, byte offset, line number) says how far a reader got; a new follower given that
  cursor continues exactly after the last complete line it yielded;
* a partial last line (a writer mid-line, or a crash) is not yielded until its newline arrives;
* a log replaced under its name (rotation, a fresh run in the same place) has another inode, and one
  cut shorter than the cursor was truncated: either way the reader starts again from the top (a file
  truncated and refilled past the cursor between two reads cannot be told from growth: rotate by rename);
* a complete line that does not parse is a ``RunLogError`` naming the file and line number; the cursor
  then points at that line, so everything before it was delivered and nothing is skipped silently.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from pydantic import BaseModel, ValidationError

from lego_rl.errors import LegoError
from lego_rl.runstore.events import LogRepaired, RunEvent, StepStarted, parse_event
from lego_rl.runstore.metrics import StepMetrics, parse_metrics

T = TypeVar("T")
_CHUNK = 1 << 20


class RunLogError(LegoError):
    """A run log line that is not what it should be; the message names the file and the line."""

    def __init__(self, message: str, *, path: Path, line: int) -> None:
        super().__init__(message)
        self.path = path
        self.line = line


class JsonlWriter:
    """Append whole JSON lines to ``path``; safe across threads. Never truncates what others wrote.

    A file that ends in a torn line (a crash mid-write) is repaired on open: the fragment is cut off so
    the next line starts clean, and returned by ``repaired`` for the caller to record.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.repaired = _cut_torn_tail(path)
        self._fh = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, record: BaseModel) -> None:
        line = record.model_dump_json()
        kind = getattr(record, "kind", None)
        if kind is not None:  # "kind" first: a human scanning the log reads it first
            line = json.dumps({"kind": kind, **json.loads(line)}, separators=(",", ":"))
        with self._lock:
            self._fh.write(line + "\n")
            self._fh.flush()

    def close(self) -> None:
        with self._lock:
            self._fh.close()


def _cut_torn_tail(path: Path) -> str | None:
    """Truncate ``path`` after its last newline; the cut text, or None when the file ended cleanly."""
    try:
        fh = path.open("r+b")
    except FileNotFoundError:
        return None
    with fh:
        size = fh.seek(0, os.SEEK_END)
        if size == 0:
            return None
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return None
        start = max(0, size - _CHUNK)
        fh.seek(start)
        tail = fh.read()
        cut = start + tail.rfind(b"\n") + 1 if b"\n" in tail else start
        fh.seek(cut)
        fragment = fh.read()
        fh.truncate(cut)
        return fragment.decode("utf-8", "replace")


class EventLog:
    """The run's event log: typed events in, one line each."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._writer = JsonlWriter(path)
        if self._writer.repaired is not None:
            self.emit(LogRepaired(fragment=self._writer.repaired))

    def emit(self, event: RunEvent) -> RunEvent:
        self._writer.write(event)
        return event

    def close(self) -> None:
        self._writer.close()


class MetricsLog:
    """``metrics.jsonl``: one ``StepMetrics`` row per optimizer step."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._writer = JsonlWriter(path)

    def append(self, row: StepMetrics) -> None:
        self._writer.write(row)

    def close(self) -> None:
        self._writer.close()


@dataclass(frozen=True)
class Cursor:
    """How far a reader got: the file's inode, the byte offset after the last line read and its number."""

    inode: int | None = None
    offset: int = 0
    line: int = 0


class JsonlFollower(Generic[T]):
    """Reads complete lines of a growing JSON-lines file, parsed by ``parse``, from ``cursor`` on."""

    def __init__(self, path: Path, parse: Callable[[bytes], T], cursor: Cursor | None = None) -> None:
        self.path = Path(path)
        self.parse = parse
        self.cursor = cursor or Cursor()

    # The position is kept as plain fields and a ``Cursor`` built only when asked for: a frozen dataclass per
    # line was a sixth of the monitor's first read of a long run (100,000 lines).
    @property
    def cursor(self) -> Cursor:
        return Cursor(self._inode, self._offset, self._line)

    @cursor.setter
    def cursor(self, cur: Cursor) -> None:
        self._inode, self._offset, self._line = cur.inode, cur.offset, cur.line

    def read(self) -> Iterator[T]:
        """Yield each complete line written since the cursor; ``self.cursor`` advances after each one (a line
        that does not parse raises ``RunLogError`` with the cursor still before it)."""
        try:
            fh = self.path.open("rb")
        except FileNotFoundError:
            return
        with fh:
            st = os.fstat(fh.fileno())
            if (self._inode is not None and self._inode != st.st_ino) or st.st_size < self._offset:
                self.cursor = Cursor()  # replaced or truncated: a different file now, read it from the top
            self._inode = st.st_ino
            fh.seek(self._offset)
            parse = self.parse
            pending = b""
            while chunk := fh.read(_CHUNK):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    if raw.strip():
                        try:
                            record = parse(raw)
                        except (ValidationError, ValueError) as exc:
                            number = self._line + 1
                            raise RunLogError(f"{self.path}:{number}: not a valid record: {_short(exc)}",
                                              path=self.path, line=number) from None
                        self._offset += len(raw) + 1
                        self._line += 1
                        yield record
                    else:
                        self._offset += len(raw) + 1
                        self._line += 1

    def skip_line(self) -> bool:
        """Step the cursor over the complete line at it (one that raised ``RunLogError``), for a reader that
        reports a bad line and reads on (the monitor); False when no complete line is there."""
        try:
            fh = self.path.open("rb")
        except FileNotFoundError:
            return False
        with fh:
            fh.seek(self.cursor.offset)
            raw = fh.readline()
        if not raw.endswith(b"\n"):
            return False
        cur = self.cursor
        self.cursor = Cursor(cur.inode, cur.offset + len(raw), cur.line + 1)
        return True

    async def follow(self, *, interval_s: float = 0.5) -> AsyncIterator[T]:
        """Yield records forever as they are written (the monitor's tail); cancel to stop."""
        while True:
            for record in self.read():
                yield record
            await asyncio.sleep(interval_s)


def _short(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc'])) or '(line)'}: {e['msg']}" for e in exc.errors()[:3])
    return str(exc)


def follow_events(path: Path, cursor: Cursor | None = None) -> JsonlFollower[RunEvent]:
    return JsonlFollower(path, parse_event, cursor)


def follow_metrics(path: Path, cursor: Cursor | None = None) -> JsonlFollower[StepMetrics]:
    return JsonlFollower(path, parse_metrics, cursor)


def read_events(path: Path) -> list[RunEvent]:
    """Every complete event of a log (a torn last line from a crash is not an event yet)."""
    return list(follow_events(path).read())


def started_steps_after(path: Path, step: int) -> set[int]:
    """The steps after ``step`` that the log says were begun (``step_started``). Reads the raw lines and
    parses only those naming that kind: a resume calls this once over a log of maybe a million rollout
    events, and a bad line elsewhere is the monitor's to report, not a reason to refuse the resume."""
    found: set[int] = set()
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        return found
    with fh:
        for raw in fh:
            if not raw.endswith(b"\n") or b'"step_started"' not in raw:
                continue
            try:
                event = parse_event(raw)
            except (ValidationError, ValueError):
                continue
            if isinstance(event, StepStarted) and event.step > step:
                found.add(event.step)
    return found
