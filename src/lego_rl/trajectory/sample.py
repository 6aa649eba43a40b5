"""Training samples: one ``Sample`` per trajectory segment, and their atomic save/load.

A rollout (one agent run) yields one or more segments. Every token list of a ``Sample`` is aligned with
``tokens``: ``loss_mask[i]`` is 1 where ``tokens[i]`` was sampled by the policy and is trained here,
``rollout_logprobs[i]`` is the engine's logprob of that token (0.0 on context), ``weight_versions[i]`` the
weight version that produced it (-1 on context). Nucleus spans and routed experts, when requested, are
also per token; context positions carry empty lists. Prompt routing snapshots (R3) are *not* merged
into the token stream, because a prompt's routes can differ between turns even for identical token
prefixes: each turn's snapshot stays a separate record that covers ``tokens[:prompt_len]``.

Files are written with the run store's ``write_new`` (temp file, fsync, then a hard link that refuses to
replace an existing path), so a reader never sees a half-written file and an existing file is never
overwritten.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from lego_rl.errors import TrajectoryError
from lego_rl.runstore.files import write_new
from lego_rl.termination import TerminationReason
from lego_rl.trajectory.records import RenderMode

SampleFormat = Literal["jsonl", "parquet"]


class PromptRoutingSnapshot(BaseModel):
    """Routed experts of one turn's prompt: ``routes[i]`` is ``[layer][top_k]`` for ``tokens[i]``."""

    model_config = ConfigDict(extra="forbid")

    rollout_id: str
    group_index: int
    turn: int
    prompt_len: int = Field(ge=0)
    routes: list[list[list[int]]]

    @model_validator(mode="after")
    def _covers_prompt(self) -> PromptRoutingSnapshot:
        if len(self.routes) != self.prompt_len:
            raise ValueError(f"routes has {len(self.routes)} entries but prompt_len is {self.prompt_len}")
        return self


class TurnSpan(BaseModel):
    """Where one turn's sampled output sits in a Sample: ``tokens[start:end]``, and how its prompt was built.

    ``render_mode`` is the turn record's: ``bridged`` (the prompt reused the previous turn's exact ids) or
    ``full`` (the whole history was rendered by the chat template). The consistency metrics split by it, so a
    template drift that only re-rendered turns suffer is told apart from numeric noise that all turns share.
    """

    model_config = ConfigDict(extra="forbid")

    turn: int = Field(ge=0)
    start: int = Field(ge=0)
    end: int = Field(ge=0)
    render_mode: RenderMode

    @model_validator(mode="after")
    def _ordered(self) -> TurnSpan:
        if self.end < self.start:
            raise ValueError(f"turn {self.turn} span ends at {self.end} before it starts at {self.start}")
        return self


class Sample(BaseModel):
    """One training segment of one agent run (shapes: every per-token list has ``len(tokens)``)."""

    model_config = ConfigDict(extra="forbid")

    rollout_id: str
    """The agent run; the unit of optimizer scheduling and loss averaging."""
    group_index: int
    """The prompt group (GRPO statistics are computed within it)."""
    index: int
    """The run's index within its group."""
    segment: int = Field(default=0, ge=0)
    num_segments: int = Field(default=1, ge=1)
    session_id: str = ""
    tokens: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    weight_versions: list[int] = Field(default_factory=list)
    """Per token; -1 on context and where unknown. Empty when no version was recorded at all."""
    nucleus_ids: list[list[int]] | None = None
    nucleus_probs: list[list[float]] | None = None
    routed_experts: list[list[list[int]]] | None = None
    prompt_routing: list[PromptRoutingSnapshot] = Field(default_factory=list)
    turns: list[int] = Field(default_factory=list)
    """Turn numbers whose sampled output contributes to this segment."""
    turn_spans: list[TurnSpan] = Field(default_factory=list)
    """Each contributing turn's output span and render mode, in token order. Empty in samples saved before
    this field existed (their turns then count as neither bridged nor full in the consistency split)."""
    reward: float | None = None
    """The run's full outcome reward (identical on every segment of a run)."""
    termination: TerminationReason | None = None
    text: str = ""
    """Decoded outputs, a readable sidecar only: never re-tokenised for training."""
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _aligned(self) -> Sample:
        self.check_alignment()
        return self

    def check_alignment(self, *, mask_values: bool = True) -> None:
        """Raise ``ValueError`` unless every per-token column has ``len(tokens)`` entries (and, with
        ``mask_values``, the loss mask holds only 0 and 1)."""
        n = len(self.tokens)
        per_token: dict[str, list[Any] | None] = {
            "loss_mask": self.loss_mask,
            "rollout_logprobs": self.rollout_logprobs,
            "weight_versions": self.weight_versions or None,
            "nucleus_ids": self.nucleus_ids,
            "nucleus_probs": self.nucleus_probs,
            "routed_experts": self.routed_experts,
        }
        for name, values in per_token.items():
            if values is not None and len(values) != n:
                raise ValueError(f"{name} has {len(values)} entries but tokens has {n}")
        if mask_values and not set(self.loss_mask) <= {0, 1}:
            raise ValueError(f"loss_mask must hold only 0 and 1, got {sorted(set(self.loss_mask))}")
        if (self.nucleus_ids is None) != (self.nucleus_probs is None):
            raise ValueError("nucleus_ids and nucleus_probs must be given together")
        if self.segment >= self.num_segments:
            raise ValueError(f"segment {self.segment} out of range for num_segments {self.num_segments}")
        for span in self.turn_spans:
            if span.end > n:
                raise ValueError(f"turn {span.turn} span [{span.start}, {span.end}) runs past the {n} tokens")
        for snap in self.prompt_routing:
            if snap.prompt_len > n:
                raise ValueError(f"prompt routing of turn {snap.turn} covers {snap.prompt_len} > {n} tokens")

    @property
    def num_trained_tokens(self) -> int:
        """Number of positions with loss mask 1."""
        return sum(self.loss_mask)


# ----------------------------------------------------------------------------------------------- files

_ROUTES = pa.list_(pa.list_(pa.list_(pa.int64())))
PARQUET_SCHEMA = pa.schema(
    [
        ("rollout_id", pa.string()),
        ("group_index", pa.int64()),
        ("index", pa.int64()),
        ("segment", pa.int64()),
        ("num_segments", pa.int64()),
        ("session_id", pa.string()),
        ("tokens", pa.list_(pa.int64())),
        ("loss_mask", pa.list_(pa.int8())),
        ("rollout_logprobs", pa.list_(pa.float64())),
        ("weight_versions", pa.list_(pa.int64())),
        ("nucleus_ids", pa.list_(pa.list_(pa.int64()))),
        ("nucleus_probs", pa.list_(pa.list_(pa.float64()))),
        ("routed_experts", _ROUTES),
        (
            "prompt_routing",
            pa.list_(
                pa.struct(
                    [
                        ("rollout_id", pa.string()),
                        ("group_index", pa.int64()),
                        ("turn", pa.int64()),
                        ("prompt_len", pa.int64()),
                        ("routes", _ROUTES),
                    ]
                )
            ),
        ),
        ("turns", pa.list_(pa.int64())),
        (
            "turn_spans",
            pa.list_(
                pa.struct(
                    [("turn", pa.int64()), ("start", pa.int64()), ("end", pa.int64()), ("render_mode", pa.string())]
                )
            ),
        ),
        ("reward", pa.float64()),
        ("termination", pa.string()),
        ("text", pa.string()),
        ("metadata", pa.string()),  # JSON: free-form dicts have no fixed parquet schema
    ]
)


def _format_of(path: Path, fmt: SampleFormat | None) -> SampleFormat:
    if fmt is not None:
        return fmt
    if path.suffix == ".jsonl":
        return "jsonl"
    if path.suffix == ".parquet":
        return "parquet"
    raise ValueError(f"cannot tell the sample format of {path}: use a .jsonl or .parquet suffix or pass fmt")


def save_samples(samples: Iterable[Sample], path: str | Path, *, fmt: SampleFormat | None = None) -> Path:
    """Write ``samples`` to ``path`` (JSON lines or parquet) atomically; refuse to overwrite."""
    path = Path(path)
    kind = _format_of(path, fmt)

    def fill(fh: BinaryIO) -> None:
        if kind == "jsonl":
            for s in samples:
                fh.write(s.model_dump_json().encode())
                fh.write(b"\n")
            return
        rows = []
        for s in samples:
            row = s.model_dump(mode="json")
            row["metadata"] = json.dumps(row["metadata"], sort_keys=True)
            rows.append(row)
        pq.write_table(pa.Table.from_pylist(rows, schema=PARQUET_SCHEMA), fh)

    return write_new(path, fill, what="saved samples")


def load_samples(path: str | Path, *, fmt: SampleFormat | None = None) -> list[Sample]:
    """Read samples written by ``save_samples``; a bad row is a ``TrajectoryError`` naming its line."""
    path = Path(path)
    kind = _format_of(path, fmt)
    out: list[Sample] = []
    if kind == "jsonl":
        with path.open("rb") as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    out.append(Sample.model_validate_json(line))
                except ValidationError as exc:
                    raise TrajectoryError(f"{path}:{lineno}: not a valid sample: {exc}") from None
        return out
    for rowno, row in enumerate(pq.read_table(path).to_pylist(), start=1):
        try:
            row["metadata"] = json.loads(row["metadata"] or "{}")
            out.append(Sample.model_validate(row))
        except (ValidationError, json.JSONDecodeError) as exc:
            raise TrajectoryError(f"{path} row {rowno}: not a valid sample: {exc}") from None
    return out
