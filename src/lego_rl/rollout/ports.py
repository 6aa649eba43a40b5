"""What generate() needs from the adapter's sessions, as an interface.

generate() opens a session before the CLI starts, reads its state after the CLI exits, and closes it
(saving its turn records into the rollout's folder). The in-process ``adapter.sessions.SessionRegistry``
implements this; a scheduler that talks to an adapter in another process (a Ray actor, another node)
implements the same three calls over its own transport, and generate() does not change.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from lego_rl.trajectory.records import TurnRecord


class SessionView(Protocol):
    """A session's state as generate() reads it."""

    @property
    def id(self) -> str: ...

    @property
    def records(self) -> Sequence[TurnRecord]:
        """Every turn record, main and side, in call order."""
        ...

    @property
    def requests(self) -> int:
        """Model calls admitted so far."""
        ...

    @property
    def infra_failure(self) -> str | None:
        """Why the session failed for infrastructure reasons; None when healthy."""
        ...

    @property
    def termination(self) -> str | None:
        """The last limit the session ran into (``context_limit``, ``request_limit``, ``infra_failure``)."""
        ...


class AdapterSessions(Protocol):
    """Open, read and close adapter sessions (one per rollout, named by the CLI's API key)."""

    def open(
        self,
        session_id: str,
        *,
        template_kwargs: dict[str, Any] | None = None,
        max_requests: int | None = None,
        max_context_tokens: int | None = None,
        max_response_tokens: int | None = None,
        records_dir: Path | None = None,
    ) -> SessionView: ...

    def get(self, session_id: str | None) -> SessionView:
        """The open session's current state."""
        ...

    def close(self, session_id: str, *, out_dir: Path | None = None) -> SessionView:
        """Close the session; with ``out_dir``, save its turn records there first."""
        ...
