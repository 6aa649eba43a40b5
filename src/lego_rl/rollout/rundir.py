"""The run directory: everything a run writes, append-only.

Layout under ``RUN_ROOT``::

    config.json              resolved configuration with each value's source (config.resume-N.json on resume)
    events.jsonl             append-only event log: one JSON object per stage transition (``RUN_LOG``)
    sandboxes/<rollout_id>/  per-rollout artifacts, saved *before* sandbox cleanup (``SUNABAKO_ARTIFACTS``)
    samples/                 training samples per rollout

Nothing here is ever overwritten: a second writer of an existing artifact gets ``FileExistsError``, an event
log is only opened for appending, and a run root that already holds a run is refused unless resuming.
``lego monitor`` reads only this directory.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from lego_rl.errors import ConfigError

_SAFE = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def safe_name(name: str) -> str:
    """A file-system safe version of ``name`` (rollout ids, task ids)."""
    cleaned = "".join(ch if ch in _SAFE else "_" for ch in name).strip(".")
    return cleaned or "_"


def write_new(path: Path, data: bytes | str) -> Path:
    """Write ``path`` atomically and only if it does not exist yet (never overwrites, never half-written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.link(tmp, path)  # fails with FileExistsError instead of replacing
    finally:
        os.unlink(tmp)
    return path


class EventLog:
    """Append-only JSON-lines log. Each ``emit`` is one line, flushed, safe across threads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def emit(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"ts": round(time.time(), 3), "kind": kind, **fields}
        line = json.dumps(event, default=str, separators=(",", ":"))
        with self._lock:
            self._fh.write(line + "\n")
            self._fh.flush()
        return event

    def close(self) -> None:
        with self._lock:
            self._fh.close()


def read_events(path: Path) -> list[dict[str, Any]]:
    """All complete events of a log (a torn last line from a crash is skipped)."""
    events = []
    if not path.exists():
        return events
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


class RunDir:
    """A run's directory, opened for writing."""

    def __init__(self, root: Path, *, artifacts: Path | None = None, run_log: Path | None = None) -> None:
        self.root = root
        self.artifacts = artifacts or root / "sandboxes"
        self.samples = root / "samples"
        self.events = EventLog(run_log or root / "events.jsonl")

    @classmethod
    def open(
        cls,
        root: Path,
        *,
        config: dict[str, Any],
        resume: bool = False,
        artifacts: Path | None = None,
        run_log: Path | None = None,
    ) -> RunDir:
        """Create (or, with ``resume``, reopen) a run directory and record the resolved config."""
        log = run_log or root / "events.jsonl"
        holds_run = (root / "config.json").exists() or log.exists()
        if holds_run and not resume:
            what = log if log.exists() else root / "config.json"
            raise ConfigError(f"{what} already exists: logs are never overwritten. Use a new RUN_ROOT (or a new "
                              "RUN_LOG), or resume the run", parameter="paths.run_root", value=str(root))
        if resume and not holds_run:
            raise ConfigError(f"nothing to resume in {root}", parameter="train.resume", value=str(root))
        root.mkdir(parents=True, exist_ok=True)
        name = "config.json"
        if resume:
            n = 1
            while (root / f"config.resume-{n}.json").exists():
                n += 1
            name = f"config.resume-{n}.json"
        write_new(root / name, json.dumps(config, indent=2, default=str))
        run = cls(root, artifacts=artifacts, run_log=log)
        run.events.emit("run_resumed" if resume else "run_started", root=str(root))
        return run

    def rollout_dir(self, rollout_id: str) -> Path:
        """A fresh artifact directory for one rollout; an existing one is an error, never reused."""
        path = self.artifacts / safe_name(rollout_id)
        path.mkdir(parents=True, exist_ok=False)
        return path

    def close(self) -> None:
        self.events.close()
