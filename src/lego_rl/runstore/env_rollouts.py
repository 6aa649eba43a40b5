"""What an environment rollout leaves in the run directory: its completions' text and the environment's
metadata, bounded, so that a collapse (empty answers, one repeated word, answers cut at the token limit) can
be diagnosed from the run directory and shown by the monitor, not only guessed from a falling reward.

A coding-agent rollout saves its transcript, patch and grader log in its artifact folder
(``RunLayout.rollout``); an environment rollout has none of those, so it writes one file there,
``RolloutFiles.ENV_ROLLOUT``: an ``EnvRolloutRecord``. Its size is bounded whatever the environment returns:
each completion's text keeps its first and last ``TEXT_KEEP`` characters, at most ``MAX_COMPLETIONS``
completions are kept, and the metadata's JSON at most ``METADATA_CHARS`` characters. Every cut is said in
the record (``text_chars``, ``completions_total``, ``metadata_cut``), so a reader never takes a part for the
whole.

Writers: ``compose.train_session.env_rollout_fn``. Readers: ``read_env_rollout`` (one rollout) and
``env_rollouts`` (every one of a run), for the monitor and for scripts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from lego_rl.runstore.files import write_new
from lego_rl.runstore.layout import RolloutFiles, RunLayout
from lego_rl.termination import TerminationReason

TEXT_KEEP = 2000
"""Characters kept from each end of a completion's text: a collapse shows at the start (an empty or repeated
answer) and at the end (a runaway answer cut at the limit), rarely only in the middle."""
MAX_COMPLETIONS = 16
"""Completions kept per rollout (the first ones: a multi-turn environment's opening turns)."""
METADATA_CHARS = 8000
"""Longest metadata JSON kept whole; longer, its start is kept as text."""


def _cut(text: str) -> str:
    if len(text) <= 2 * TEXT_KEEP:
        return text
    return f"{text[:TEXT_KEEP]}[... {len(text) - 2 * TEXT_KEEP} characters cut ...]{text[-TEXT_KEEP:]}"


class EnvCompletionRecord(BaseModel):
    """One completion as kept: its text (bounded) and what ended it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str
    """The visible answer; longer than ``2 * TEXT_KEEP`` characters, its two ends around a marker."""
    text_chars: int
    """The whole text's length: more than ``len(text)`` when it was cut."""
    finish_reason: str
    """``stop`` (an end-of-message token) or ``length`` (cut at the token limit)."""
    output_tokens: int

    @classmethod
    def of(cls, text: str, *, finish_reason: str, output_tokens: int) -> EnvCompletionRecord:
        return cls(text=_cut(text), text_chars=len(text), finish_reason=finish_reason,
                   output_tokens=output_tokens)


class EnvRolloutRecord(BaseModel):
    """One environment rollout: what the policy answered, what the environment made of it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rollout_id: str
    environment: str
    instance_id: str
    """The row's id (``Environment.row_id``)."""
    termination: TerminationReason
    reward: float | None
    detail: str = ""
    """Why an infrastructure failure happened (the engine's error, the environment's exception)."""
    completions: list[EnvCompletionRecord]
    """The first ``MAX_COMPLETIONS`` completions, in order; none when the rollout failed before returning."""
    completions_total: int
    metadata: Any = None
    """The environment's ``EnvOutcome.metadata`` as JSON (values JSON cannot hold as their ``str``)."""
    metadata_cut: str | None = None
    """When that JSON is longer than ``METADATA_CHARS``: its first ``METADATA_CHARS`` characters, and
    ``metadata`` is None."""

    @classmethod
    def of(cls, *, rollout_id: str, environment: str, instance_id: str, termination: TerminationReason,
           reward: float | None, completions: Sequence[EnvCompletionRecord],
           metadata: Mapping[str, Any] | None, detail: str = "") -> EnvRolloutRecord:
        """The bounded record of a rollout (``completions`` already bounded one by one)."""
        dumped = json.dumps(dict(metadata or {}), default=str, ensure_ascii=False)
        whole = len(dumped) <= METADATA_CHARS
        return cls(rollout_id=rollout_id, environment=environment, instance_id=instance_id,
                   termination=termination, reward=reward, detail=detail[:500],
                   completions=list(completions[:MAX_COMPLETIONS]), completions_total=len(completions),
                   metadata=json.loads(dumped) if whole else None,
                   metadata_cut=None if whole else dumped[:METADATA_CHARS])


def write_env_rollout(folder: Path, record: EnvRolloutRecord) -> Path:
    """Write ``record`` into the rollout's folder (made by ``RunDir.rollout_dir``); never overwrites."""
    path = folder / RolloutFiles.ENV_ROLLOUT
    write_new(path, record.model_dump_json(indent=1), what="environment rollout record")
    return path


def read_env_rollout(layout: RunLayout, rollout_id: str) -> EnvRolloutRecord | None:
    """The record of one rollout; None when it has none (a coding-agent rollout, or one still running).

    :raises ValueError: naming the file when it holds no record (a file cut by a crash, or hand-edited).
    """
    path = layout.rollout(rollout_id) / RolloutFiles.ENV_ROLLOUT
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        return EnvRolloutRecord.model_validate_json(text)
    except ValidationError as exc:
        raise _not_a_record(path, exc) from None


def _not_a_record(path: Path, exc: ValidationError) -> ValueError:
    return ValueError(f"{path} is not an environment rollout record: {exc.errors()[0]['msg']}")


def env_rollouts(layout: RunLayout) -> Iterator[EnvRolloutRecord]:
    """Every environment rollout record of a run, by folder name (a run's ids sort by step, then group)."""
    if not layout.artifacts.is_dir():
        return
    for path in sorted(layout.artifacts.glob(f"*/{RolloutFiles.ENV_ROLLOUT}")):
        try:
            yield EnvRolloutRecord.model_validate_json(path.read_text(encoding="utf-8"))
        except ValidationError as exc:
            raise _not_a_record(path, exc) from None
