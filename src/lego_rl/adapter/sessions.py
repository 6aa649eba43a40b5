"""Adapter sessions: one per rollout, named by the bearer token the CLI sends.

Rollout code opens a session before it starts a CLI and closes it afterwards, through this Python API
(no HTTP involved). A session carries the per-sample chat-template kwargs and its limits, owns the turn
records of its model calls and the bridging chains used for prefix reuse, and is isolated: the registry
only ever hands out the session a token names. Requests for an unknown or closed session are rejected
with a ``ProtocolError`` (401) that the HTTP edge maps into the client's protocol.

A session opened with ``records_dir`` (a rollout's folder) has each turn record appended and fsynced
there as the turn ends (``RecordJournal``, called by the HTTP edge before the answer is sent), so a
trainer killed mid-rollout leaves every answered turn on disk; ``close(out_dir=records_dir)`` appends
the rest to the same file.

An engine reply we refuse to train on (missing or inconsistent logprobs...) marks the session as an
infrastructure failure: the rollout is then excluded from training, and later requests are refused
(403, which client SDKs do not retry) so the CLI stops instead of producing more unusable turns.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lego_rl.chat.prefix import ChainState
from lego_rl.errors import ProtocolError
from lego_rl.runstore.files import replace_file, write_new
from lego_rl.runstore.layout import RolloutFiles, is_safe_name
from lego_rl.runstore.publish import fsync_path
from lego_rl.trajectory.export import load_turn_records  # noqa: F401  (re-exported: the saved-records reader)
from lego_rl.trajectory.records import TurnRecord

SessionState = Literal["open", "closed"]
Termination = Literal["context_limit", "request_limit", "infra_failure"]


@dataclass
class Session:
    """One rollout's adapter state. Created by ``SessionRegistry.open``; never build one by hand.

    ``template_kwargs`` are merged over the core's ``CHAT_TEMPLATE_KWARGS`` on every turn of this session
    (per-sample options such as ``reasoning_effort``). ``max_requests`` caps the model calls (main and side);
    ``max_context_tokens`` caps prompt + output tokens per call below the core's context window;
    ``max_response_tokens`` caps one call's output below the core's limit.
    """

    id: str
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    max_requests: int | None = None
    max_context_tokens: int | None = None
    max_response_tokens: int | None = None
    opened_at: float = field(default_factory=time.time)
    state: SessionState = "open"
    records: list[TurnRecord] = field(default_factory=list)
    requests: int = 0
    """Model calls admitted so far (main and side, including context-limit stops)."""
    infra_failure: str | None = None
    """Why the session failed for infrastructure reasons (first failure wins); None when healthy."""
    termination: Termination | None = None
    """Last limit the session ran into, for the rollout's termination taxonomy."""
    chains: dict[str, ChainState] = field(default_factory=dict)
    """Bridging state per chain: ``"main"`` and one per side label, so side calls never touch main."""
    notices: set[str] = field(default_factory=set)
    """Warnings already logged for this session (the core logs each kind once per session)."""
    records_dir: Path | None = None
    """Where each turn record is appended (fsynced) as its turn ends; None: kept in memory until closed."""
    journaled: int = 0
    """How many of ``records`` are on disk in the session's journal file."""
    journal_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    """Held while appending: the edge's sync (a worker thread) and ``close`` may meet when a CLI is cut off."""

    def chain(self, label: str | None) -> ChainState:
        """The bridging chain for ``label`` (None = main chain), created on first use."""
        key = "main" if label is None else f"side:{label}"
        if key not in self.chains:
            self.chains[key] = ChainState()
        return self.chains[key]

    def admit_request(self) -> None:
        """Count one model call; refuse it when the session is failed or over its request cap."""
        if self.state != "open":
            raise ProtocolError(f"session {self.id!r} is closed", status=401, kind="authentication_error")
        if self.infra_failure is not None:
            # 403, not 5xx: SDKs retry 5xx (and 408/409/429) with backoff, but the CLI should stop now.
            raise ProtocolError(
                f"session {self.id!r} already failed ({self.infra_failure}); no further requests are served",
                status=403,
                kind="permission_error",
            )
        if self.max_requests is not None and self.requests >= self.max_requests:
            self.termination = "request_limit"
            raise ProtocolError(
                f"session {self.id!r} reached its limit of {self.max_requests} model requests; "
                "raise the session's max_requests to allow more",
                param="max_requests",
            )
        self.requests += 1

    def mark_infra_failure(self, reason: str) -> None:
        """Record an infrastructure failure; the first reason is kept."""
        if self.infra_failure is None:
            self.infra_failure = reason
            self.termination = "infra_failure"

    def main_records(self) -> list[TurnRecord]:
        """Turn records of the main chain, in call order."""
        return [r for r in self.records if r.kind == "main"]


class SessionRegistry:
    """Open, look up and close sessions. All access by token goes through ``get``."""

    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}
        self._closed: set[str] = set()

    def open(
        self,
        session_id: str,
        *,
        template_kwargs: dict[str, Any] | None = None,
        max_requests: int | None = None,
        max_context_tokens: int | None = None,
        max_response_tokens: int | None = None,
        records_dir: Path | None = None,
    ) -> Session:
        """Open a new session named ``session_id`` (the bearer token the CLI will send); with
        ``records_dir``, its turn records are appended there as they happen (see the module docstring)."""
        # Ids name files (records, logs): only safe names, so ``..`` or ``a/b`` never escape a folder.
        if not is_safe_name(session_id):
            raise ValueError(f"session id {session_id!r} must be a safe name: 1-200 of [A-Za-z0-9._-], "
                             "not starting or ending with '.'")
        if session_id in self._sessions or session_id in self._closed:
            raise ValueError(f"session {session_id!r} already exists (ids are single use)")
        for name, value in (
            ("max_requests", max_requests),
            ("max_context_tokens", max_context_tokens),
            ("max_response_tokens", max_response_tokens),
        ):
            if value is not None and value <= 0:
                raise ValueError(f"session {session_id!r}: {name} must be positive, got {value}")
        session = Session(
            id=session_id,
            template_kwargs=dict(template_kwargs or {}),
            max_requests=max_requests,
            max_context_tokens=max_context_tokens,
            max_response_tokens=max_response_tokens,
            records_dir=Path(records_dir) if records_dir is not None else None,
        )
        self._sessions[session_id] = session
        return session

    def get(self, session_id: str | None) -> Session:
        """The open session named by a request's token; 401 for a missing, unknown or closed one."""
        if not session_id:
            raise ProtocolError(
                "no session: send the rollout's session id as the bearer token / x-api-key "
                "or use a /s/{session}/ path prefix",
                status=401,
                kind="authentication_error",
            )
        session = self._sessions.get(session_id)
        if session is None:
            state = "closed" if session_id in self._closed else "unknown"
            raise ProtocolError(f"{state} session {session_id!r}", status=401, kind="authentication_error")
        return session

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    def open_ids(self) -> list[str]:
        """Ids of the sessions currently open."""
        return list(self._sessions)

    def close(self, session_id: str, *, out_dir: Path | None = None) -> Session:
        """Close a session and return it; with ``out_dir``, save its turn records there first.

        The records go to ``out_dir/<session_id>.turns.jsonl`` (one TurnRecord per line), written
        atomically; an existing file is never overwritten. When ``out_dir`` is the session's
        ``records_dir``, the records not yet journaled are appended to its journal file instead, and its
        status file says closed.
        """
        session = self.get(session_id)
        journal = session.records_dir if out_dir is not None and Path(out_dir) == session.records_dir else None
        if journal is not None:
            append_records(session, journal, create=True)
        elif out_dir is not None:
            save_turn_records(session, out_dir)
        session.state = "closed"
        if journal is not None:
            write_session_status(session, journal)
        del self._sessions[session_id]
        self._closed.add(session_id)
        return session

    def close_all(self, *, out_dir: Path | None = None) -> list[Session]:
        """Close every open session (server shutdown), saving records when ``out_dir`` is given."""
        return [self.close(sid, out_dir=out_dir) for sid in list(self._sessions)]


def turn_records_path(out_dir: Path, session_id: str) -> Path:
    """Where ``save_turn_records`` writes a session's records."""
    return Path(out_dir) / RolloutFiles.turns(session_id)


def save_turn_records(session: Session, out_dir: Path) -> Path:
    """Write the session's turn records as JSONL, atomically; an existing file is ``FileExistsError``."""
    text = "".join(record.model_dump_json() + "\n" for record in session.records)
    return write_new(turn_records_path(out_dir, session.id), text, what="turn records")


def append_records(session: Session, folder: Path, *, create: bool = False) -> list[TurnRecord]:
    """Append the session's records not yet on disk to ``folder/<session>.turns.jsonl`` and fsync it (and
    the folder, when the file is new); the records written. The file is created exclusively by the first
    append (an existing file of another run is never appended to); ``create`` makes it even with no record.
    """
    with session.journal_lock:
        new = session.records[session.journaled:]
        if not new and not (create and session.journaled == 0):
            return []
        first = session.journaled == 0
        with open(turn_records_path(folder, session.id), "x" if first else "a", encoding="utf-8") as fh:
            fh.write("".join(record.model_dump_json() + "\n" for record in new))
            fh.flush()
            os.fsync(fh.fileno())
        if first:
            fsync_path(folder)
        session.journaled += len(new)
        return new


def session_status_path(folder: Path, session_id: str) -> Path:
    return Path(folder) / RolloutFiles.session_state(session_id)


def write_session_status(session: Session, folder: Path) -> None:
    """``folder/<session>.session.json``, atomically: state, failure reason, termination, counts, holder pid."""
    status = {"session": session.id, "state": session.state, "infra_failure": session.infra_failure,
              "termination": session.termination, "records": len(session.records), "requests": session.requests,
              "opened_at": session.opened_at, "updated_at": time.time(),
              "pid": os.getpid()}  # which process holds the session (``lego adapter --workers``)
    replace_file(session_status_path(folder, session.id), json.dumps(status) + "\n")


class RecordJournal:
    """Turn records appended to ``<folder>/<session>.turns.jsonl`` as they happen, for a process that may
    die at any moment (``kill -9`` loses nothing answered). The folder is the session's ``records_dir``
    (a rollout's folder) or else ``out_dir`` (the standalone ``lego adapter``'s); a session with neither
    is not journaled.

    fsync policy: ``sync`` appends every record not yet written and fsyncs the file (and, on the file's
    creation, the folder) before returning; the server calls it after each turn and before the answer
    is sent, so every answered turn is on disk. ``<folder>/<session>.session.json`` (written atomically on
    open, failure and close) holds the session's state, failure reason, termination and record count.
    No file exists for a session that was never opened (requests are validated before opening).
    """

    def __init__(self, out_dir: Path | None = None) -> None:
        self.out_dir = Path(out_dir) if out_dir is not None else None
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        self._status: dict[str, tuple[Any, ...]] = {}

    def folder(self, session: Session) -> Path | None:
        """Where the session's records go, None when it is not journaled."""
        return session.records_dir or self.out_dir

    def records_path(self, session_id: str) -> Path:
        assert self.out_dir is not None
        return turn_records_path(self.out_dir, session_id)

    def status_path(self, session_id: str) -> Path:
        assert self.out_dir is not None
        return session_status_path(self.out_dir, session_id)

    def sync(self, session: Session) -> list[int]:
        """Append and fsync the session's new records, refresh its status; the turns written."""
        folder = self.folder(session)
        if folder is None:
            return []
        new = append_records(session, folder)
        self.write_status(session)
        return [r.turn for r in new]

    def write_status(self, session: Session) -> None:
        """The session's status file, rewritten only when something in it changed."""
        folder = self.folder(session)
        state = (session.state, session.infra_failure, session.termination, len(session.records), session.requests)
        if folder is None or self._status.get(session.id) == state:
            return
        write_session_status(session, folder)
        self._status[session.id] = state

