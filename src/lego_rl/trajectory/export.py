"""Training export: the adapter's saved turn records (JSON lines) become Samples.

The adapter saves one ``TurnRecord`` per line (``TurnRecord.model_dump_json()``). A file may hold
several sessions (a rollout's main session plus sub-agent sessions share nothing but the file); the
caller names the session it wants, or the file must hold exactly one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from lego_rl.errors import TrajectoryError
from lego_rl.termination import TerminationReason
from lego_rl.trajectory.manager import TrajectoryOptions, TrajectoryStats, build_samples
from lego_rl.trajectory.records import TurnRecord
from lego_rl.trajectory.sample import Sample


def load_turn_records(path: str | Path) -> list[TurnRecord]:
    """Read a JSON-lines file of turn records; a bad line is an error naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise TrajectoryError(f"turn record file {path} does not exist")
    records: list[TurnRecord] = []
    with path.open("rb") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                records.append(TurnRecord.model_validate_json(line))
            except ValidationError as exc:
                raise TrajectoryError(f"{path}:{lineno}: not a valid turn record: {exc}") from None
    return records


def samples_from_turn_records_file(
    path: str | Path,
    *,
    rollout_id: str,
    group_index: int,
    index: int,
    reward: float | None,
    termination: TerminationReason | None = None,
    session_id: str | None = None,
    metadata: dict[str, Any] | None = None,
    options: TrajectoryOptions | None = None,
) -> tuple[list[Sample], TrajectoryStats]:
    """Build the Samples of one session saved in ``path`` (see ``build_samples``)."""
    records = load_turn_records(path)
    sessions = sorted({r.session_id for r in records})
    if session_id is None:
        if len(sessions) != 1:
            raise TrajectoryError(
                f"{path} holds {len(sessions)} sessions ({', '.join(sessions) or 'none'}); pass session_id"
            )
        session_id = sessions[0]
    elif session_id not in sessions:
        raise TrajectoryError(f"{path} has no turns of session {session_id!r} (it has: {', '.join(sessions)})")
    chosen = [r for r in records if r.session_id == session_id]
    meta = {"turn_records": str(path), **(metadata or {})}
    return build_samples(
        chosen,
        rollout_id=rollout_id,
        group_index=group_index,
        index=index,
        reward=reward,
        termination=termination,
        metadata=meta,
        options=options,
    )
