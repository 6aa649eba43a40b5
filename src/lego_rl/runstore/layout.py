"""The run directory: everything a run writes, append-only.

Layout under ``RUN_ROOT``::

    run.lock                 held (flock) by the one process writing the run; names it (runstore.lock)
    config.json              resolved configuration with each value's source (config.resume-N.json on resume)
    events.jsonl             append-only event log, one typed event per line (``RUN_LOG``; runstore.events)
    metrics.jsonl            one row per optimizer step (runstore.metrics; written by the trainer)
    audit/                   train.audit's per-rank and per-engine records, `lego audit`'s reports
    checkpoints/step-<N>/    trainer checkpoints (the backend's format) after step N; ``checkpoints/latest``
                             names the newest complete one (written only after the backend returned)
    sandboxes/<rollout_id>/  per-rollout artifacts, saved *before* sandbox cleanup (``SUNABAKO_ARTIFACTS``):
                             CLI logs, sandbox commands, patch, grader output, turn records, outcome.json
                             and the rollout's training samples (samples.jsonl); an environment rollout's
                             completions and metadata (env-rollout.json); ``RolloutFiles`` names them

Samples live with their rollout, not in a folder of their own: a rollout's samples, turn records and
outcome are read together, and a run that rolls out without training has no steps to file them under.

Nothing here is ever overwritten: a second writer of an existing artifact gets ``FileExistsError``, a log
is only opened for appending, and a run root that already holds a run is refused unless resuming.
``lego monitor`` reads only this directory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lego_rl.errors import ConfigError
from lego_rl.runstore.checkpoints import latest_checkpoint, set_aside_abandoned
from lego_rl.runstore.events import RunResumed, RunStarted, StaleLockTaken, StepsAbandoned
from lego_rl.runstore.files import write_new
from lego_rl.runstore.lock import RunLock
from lego_rl.runstore.log import EventLog, MetricsLog, started_steps_after

log = logging.getLogger(__name__)

_SAFE = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
_HASHED = re.compile(r"-h[0-9a-f]{12}(\.[A-Za-z0-9]{1,10})?\Z")
_EXT = re.compile(r"\.[A-Za-z0-9]{1,10}\Z")
_MAX_KEPT = 128
"""Longest name kept whole; a file name may have 255 bytes, and the folder gets files named after it."""


def is_safe_name(name: str) -> bool:
    """``name`` can name a file as it is: 1-200 of ``[A-Za-z0-9._-]``, not starting or ending with ``.``.

    Every ``safe_name`` result is one (ids built from safe names, such as a rollout's session id, pass too)."""
    return 0 < len(name) <= 200 and all(ch in _SAFE for ch in name) and name.strip(".") == name


def safe_name(name: str) -> str:
    """A file-system safe name for ``name`` (rollout ids, task ids, session ids), distinct for distinct names.

    A name of only ``[A-Za-z0-9._-]``, not starting or ending with ``.``, at most 128 characters, is kept.
    Any other becomes its sanitised form (other characters as ``_``, cut at 128) with ``-h`` and 12 hex
    digits of its SHA-256 before its extension: ``collide/1`` and ``collide_1`` are ``collide_1-h<hash>``
    and ``collide_1``; ``a/b.jsonl`` is ``a_b-h<hash>.jsonl``. Injective because a kept name never ends
    like a hashed one (such a name is hashed too), and two hashed names are equal only when their 48-bit
    hashes are.
    """
    cleaned = "".join(ch if ch in _SAFE else "_" for ch in name).strip(".")
    if cleaned == name and name and len(name) <= _MAX_KEPT and not _HASHED.search(name):
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    ext = _EXT.search(cleaned)
    stem = cleaned[: ext.start()] if ext else cleaned
    return f"{stem[:_MAX_KEPT] or '_'}-h{digest}{ext.group() if ext else ''}"


class RolloutFiles:
    """The names of the files in a rollout's artifact folder (``RunLayout.rollout``): the one place they are
    spelled. The rollout, the adapter and the harness runner write them; the monitor and SFT read them."""

    PATCH = "patch.diff"
    """The agent's patch (workspace after minus before)."""
    GRADER_LOG = "grader.log"
    """The grader's output (or the error that stopped grading)."""
    OUTCOME = "outcome.json"
    """The rollout's summary: termination, reward, timings."""
    SAMPLES = "samples.jsonl"
    """The rollout's training samples, one ``Sample`` per line."""
    ENV_ROLLOUT = "env-rollout.json"
    """An environment rollout's completions (text, bounded) and metadata (``runstore.env_rollouts``)."""
    CLI_EVENTS = "cli-events.jsonl"
    """The CLI's own event log as the harness captured it."""
    TURNS_GLOB = "*.turns.jsonl"
    """Every session's turn records in the folder."""
    REPORT_OUTCOMES = "outcomes.jsonl"
    """In a rollout-check's report folder (beside ``SAMPLES`` of every rollout): each rollout's summary, one a
    line."""

    @staticmethod
    def turns(session_id: str) -> str:
        """The adapter session's turn records, one ``TurnRecord`` per line (runstore.turns)."""
        return f"{session_id}.turns.jsonl"

    @staticmethod
    def session_state(session_id: str) -> str:
        """The adapter session's chain state, for a standalone adapter that restarts."""
        return f"{session_id}.session.json"

    @staticmethod
    def commands(sandbox_label: str) -> str:
        """The commands run in one sandbox (``agent``, ``grader``...), one JSON line each."""
        return f"commands-{sandbox_label}.jsonl"

    @staticmethod
    def harness_events(harness: str) -> str:
        """The CLI's event stream as the harness runner captured it (a second run gets ``.1``... names)."""
        return f"{harness}-events.jsonl"

    @staticmethod
    def harness_command(harness: str) -> str:
        """The command line the harness ran."""
        return f"{harness}-command.txt"

    @staticmethod
    def is_transcript(name: str) -> bool:
        """Whether a file of the folder is a CLI transcript (``<harness>-events*.jsonl`` or ``cli-*``)."""
        return name.startswith("cli-") or (name.endswith(".jsonl") and "-events" in name)


@dataclass(frozen=True)
class RunLayout:
    """Where each part of a run lives; pure paths, nothing is created. ``artifacts`` and ``events`` can be
    moved elsewhere (``paths.artifacts``, ``paths.run_log``)."""

    root: Path
    artifacts_dir: Path | None = None
    run_log: Path | None = None

    @property
    def artifacts(self) -> Path:
        return self.artifacts_dir or self.root / "sandboxes"

    @property
    def events(self) -> Path:
        return self.run_log or self.root / "events.jsonl"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def audit(self) -> Path:
        """``train.audit``'s records: ``rank-<r>.jsonl`` per trainer rank, ``engine-<n>.jsonl`` per engine, and
        ``lego audit``'s reports."""
        return self.root / "audit"

    def config(self, resume: int = 0) -> Path:
        """``config.json``, or the config of the ``resume``-th resume."""
        return self.root / ("config.json" if resume == 0 else f"config.resume-{resume}.json")

    def rollout(self, rollout_id: str) -> Path:
        """A rollout's artifact folder."""
        return self.artifacts / safe_name(rollout_id)

    def holds_run(self) -> bool:
        return self.config().exists() or self.events.exists()


class RunDir:
    """A run's directory, opened for writing."""

    def __init__(self, layout: RunLayout, lock: RunLock | None = None) -> None:
        self.layout = layout
        self.lock = lock
        self.root = layout.root
        self.artifacts = layout.artifacts
        self.events = EventLog(layout.events)
        self._metrics: MetricsLog | None = None

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
        """Create (or, with ``resume``, reopen) a run directory, lock it for this process (``runstore.lock``)
        and record the resolved config.

        :raises RunDirLocked: another live process has the directory open (it is named).
        """
        layout = RunLayout(root, artifacts, run_log)
        if resume and not layout.holds_run():
            raise ConfigError(f"nothing to resume in {root}", parameter="train.resume", value=str(root))
        root.mkdir(parents=True, exist_ok=True)
        lock = RunLock.acquire(root)  # before anything is read or written: the holder would be racing us
        try:
            if layout.holds_run() and not resume:
                what = layout.events if layout.events.exists() else layout.config()
                raise ConfigError(
                    f"{what} already exists: logs are never overwritten. Use a new RUN_ROOT (or a new "
                    "RUN_LOG), or resume the run",
                    parameter="paths.run_root",
                    value=str(root),
                )
            n = 0
            if resume:
                n = 1
                while layout.config(n).exists():
                    n += 1
            write_new(layout.config(n), json.dumps(config, indent=2, default=str), what="run config")
        except BaseException:
            lock.release()
            raise
        run = cls(layout, lock)
        if lock.previous is not None:
            p = lock.previous
            log.warning("%s: the previous holder of its lock, %s, died without releasing it; taken over",
                        root, p.describe())
            run.events.emit(StaleLockTaken(step=run._next_step(), previous_pid=p.pid, previous_host=p.host,
                                           previous_since=p.since))
        run.events.emit(RunResumed(root=str(root)) if resume else RunStarted(root=str(root)))
        return run

    def _next_step(self) -> int | None:
        """The step training continues with: the one after the newest checkpoint's, 0 without one; None when
        the ``latest`` pointer is broken (the resume itself refuses it, naming the pointer)."""
        try:
            latest = latest_checkpoint(self.layout.checkpoints)
        except ConfigError:
            return None
        return 0 if latest is None else latest.step + 1

    @property
    def metrics(self) -> MetricsLog:
        """The per-step metrics log, opened for appending on first use."""
        if self._metrics is None:
            self._metrics = MetricsLog(self.layout.metrics)
        return self._metrics

    def abandon_after(self, step: int | None) -> list[int]:
        """A resume from step ``step``'s checkpoint (None: from no checkpoint, the initial weights, after a
        kill -9 or a second Ctrl-C before any checkpoint was saved): the later steps this run recorded or
        began are abandoned. Their metrics rows move aside (``set_aside_abandoned``) and a ``steps_abandoned``
        event marks their events. The abandoned steps, oldest first (none: nothing happened after it)."""
        if self._metrics is not None:  # its handle would keep appending to the file moved aside
            self._metrics.close()
            self._metrics = None
        last_kept = -1 if step is None else step
        aside = set_aside_abandoned(self.layout.metrics, last_kept)
        # A step begun but never finished (killed mid-step) has events and no row: abandoned as well, or a
        # reader would show it open for ever when the resumed run stops before reaching it.
        steps = sorted(set(aside.steps if aside else []) | started_steps_after(self.layout.events, last_kept))
        if not steps:
            return []
        if step is None:
            log.warning("%s: no checkpoint to resume from; the run starts again from its initial weights%s",
                        self.root, f" and the rows of steps {', '.join(map(str, aside.steps))} were moved to "
                        f"{aside.path.name}" if aside else "")
        self.events.emit(StepsAbandoned(step=last_kept + 1, resumed_from=step, steps=steps,
                                        metrics_set_aside=aside.path.name if aside else None))
        return steps

    def rollout_dir(self, rollout_id: str) -> Path:
        """A fresh artifact directory for one rollout; an existing one is an error, never reused."""
        path = self.layout.rollout(rollout_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(exist_ok=False)
        return path

    def close(self) -> None:
        self.events.close()
        if self._metrics is not None:
            self._metrics.close()
        if self.lock is not None:
            self.lock.release()
