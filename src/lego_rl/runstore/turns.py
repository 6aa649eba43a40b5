"""Turn records: what the adapter saves for every model call (``<session>.turns.jsonl`` in a rollout's
artifact folder), what trajectories are built from and what the monitor reads.

A ``TurnRecord`` is written by the adapter core after each engine call. It holds the exact prompt ids
sent to the engine and the exact sampled ids and logprobs that came back; nothing is re-tokenised later.
The model lives in the run store (the floor the adapter, trajectory and the monitor all stand on);
``lego_rl.trajectory.records`` re-exports it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

RenderMode = Literal["full", "bridged"]
TurnKind = Literal["main", "side"]

# Fallback reasons (``TurnRecord.fallback_reason``) the trajectory reads: the adapter's prefix bridge
# (``chat.prefix``) writes these, and a full render for one of them is no tokenisation fault.
NO_PREVIOUS_TURN = "no previous turn in this chain"
HISTORY_CHANGED = "the history does not extend any previous turn (changed or compacted)"
TOOLS_CHANGED = "the tool schemas changed"
KWARGS_CHANGED = "the chat template kwargs changed"
PROMPT_CHANGED: frozenset[str] = frozenset({HISTORY_CHANGED, TOOLS_CHANGED, KWARGS_CHANGED})
"""The client changed the prompt itself (compaction, an edited history, new tools or kwargs): a new segment
after one of these is a real divergence, not a false fork."""


class TurnRecord(BaseModel):
    """One model call inside an adapter session.

    ``prompt_ids`` is the full prompt sent to the engine (not just the new suffix).
    ``render_mode`` is ``bridged`` when the prompt reused the previous turn's prompt+output ids and only
    the new suffix was rendered, ``full`` when the whole history was rendered by the chat template.
    ``bridge_prefix_len`` is the number of leading prompt ids copied verbatim from the previous turn.
    ``kind`` is ``side`` for requests kept out of the main chain (titles, count_tokens, sub-agents).
    """

    session_id: str
    turn: int = Field(ge=0)
    kind: TurnKind = "main"
    side_label: str | None = None
    protocol: Literal["anthropic", "responses", "chat"]
    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]
    render_mode: RenderMode
    bridge_prefix_len: int = 0
    bridge_from_turn: int | None = None
    """For ``bridged`` prompts: the turn whose prompt+output ids were copied (None when not recorded).
    Lets the trajectory manager skip re-comparing that copied prefix (``verify_bridged_prefix=False``)."""
    fallback_reason: str | None = None
    """For ``full`` prompts: why prefix reuse was not possible (``no previous turn in this chain``, ``the
    tool schemas changed``...); a diagnostic for a client whose histories keep forking."""
    repeat_of: int | None = None
    """The turn this call repeats: the client sent the identical request (same history, tools and template
    kwargs on the same chain) again, e.g. a stream retry after a cut-off answer. Each repeat is an extra
    engine call for one client step; a diagnostic, counted per rollout."""
    finish_reason: str
    stop_reason: str | None = None
    """Protocol-level stop reason sent to the client (``tool_use``, ``end_turn``, ``context_limit``...)."""
    parse_failures: int = 0
    tool_calls: int = 0
    weight_versions: list[int] = Field(default_factory=list)
    """Weight version per output id (same length as ``output_ids``, empty when unknown)."""
    nucleus_ids: list[list[int]] | None = None
    nucleus_probs: list[list[float]] | None = None
    routed_experts: list[list[list[int]]] | None = None
    prompt_routed_experts: list[list[list[int]]] | None = None
    started_at: float = 0.0
    render_s: float = 0.0
    engine_s: float = 0.0
    total_s: float = 0.0
    text: str = ""
    """Decoded output: a readable sidecar only, never re-tokenised for training."""


def read_turn_records(path: Path) -> Iterator[TurnRecord]:
    """The records of one ``.turns.jsonl`` file, in order. A line that is not a record (a torn last line
    of a session still being written, or a record from a newer writer) is skipped: the rest still count."""
    with path.open("rb") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                yield TurnRecord.model_validate_json(line)
            except ValidationError:
                continue
