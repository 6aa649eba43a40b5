"""``first_letter``: the built-in verifiable environment, registered by entry point like a user's would be.

Task: "Answer with a word that starts with the letter X." The reward is read off the text: 1.0 when the
answer's first non-blank character is X (case-insensitive), else 0.0. No sandbox, no CLI, no grader.

Why this task: it is checkable from the text alone, and the random tiny model (``lego:tiny``) already
earns it now and then (about 5-10 % per letter at T=1, measured), so GRPO groups carry signal from the
first step. A task the untrained model never solves (exact arithmetic) would give all-failed groups and
zero advantages: nothing to learn from, which is the RL lesson, not a bug.

Rows (one JSON object per line of ``rollout.prompt_data``): ``{"id": "fl-0", "letter": "a"}``.
``make_rows`` writes a dataset; ``lego train`` reads it like any other.
"""

from __future__ import annotations

import random
import string
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from lego_rl.chat.messages import Message
from lego_rl.driver.environments import EnvOutcome, Sampler
from lego_rl.termination import TerminationReason

PROMPT = "Answer with a word that starts with the letter {letter}."


class FirstLetterRow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    letter: str

    @field_validator("letter")
    @classmethod
    def _one_letter(cls, v: str) -> str:
        if len(v) != 1 or v not in string.ascii_letters:
            raise ValueError(f"letter must be one ASCII letter, got {v!r}")
        return v.lower()


def score(letter: str, answer: str) -> float:
    """1.0 when the first non-blank character of ``answer`` is ``letter`` (case-insensitive)."""
    stripped = answer.lstrip()
    return 1.0 if stripped[:1].lower() == letter.lower() else 0.0


class FirstLetterEnv:
    """The ``first_letter`` environment; ``max_tokens`` bounds the answer (a word needs few tokens)."""

    name = "first_letter"

    def __init__(self, max_tokens: int = 4) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        self.max_tokens = max_tokens

    def parse_row(self, raw: dict[str, Any]) -> FirstLetterRow:
        try:
            return FirstLetterRow.model_validate(raw)
        except ValidationError as exc:
            detail = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(row)'}: {e['msg']}" for e in exc.errors())
            raise ValueError(detail) from None

    def row_id(self, row: FirstLetterRow) -> str:
        return row.id

    async def rollout(self, row: FirstLetterRow, sampler: Sampler) -> EnvOutcome:
        prompt = [Message(role="user", content=PROMPT.format(letter=row.letter))]
        c = await sampler.chat(prompt, max_tokens=self.max_tokens)
        # An answer cut at max_tokens is still scored: the first letter is already there.
        return EnvOutcome(completions=[c], reward=score(row.letter, c.text),
                          termination=TerminationReason.COMPLETED, metadata={"answer": c.text})


def make_rows(n: int, *, letters: str = "aest", seed: int = 0, prefix: str = "fl") -> list[dict[str, str]]:
    """``n`` rows cycling through ``letters`` in a seeded random order (JSON-ready dicts)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        out.append({"id": f"{prefix}-{i}", "letter": letters[i % len(letters)]})
    rng.shuffle(out)
    return out
