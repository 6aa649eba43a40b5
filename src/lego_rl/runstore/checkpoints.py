"""Trainer checkpoints of a run directory: the ``checkpoints/step-NNNNNN`` folders and the ``latest`` pointer.

The one place that knows their names: the GRPO loop and SFT publish through ``publish_latest`` and resume
from ``latest_checkpoint``; the session's failure summary and the CLI's roll-back check read them here.

A resume from step ``k`` abandons whatever the run recorded after ``k`` (a roll back, or steps finished after
the last checkpoint when ``train.checkpoint_every`` > 1): ``set_aside_abandoned`` moves metrics.jsonl aside
whole and writes back only the rows up to ``k``, so readers plot the current run while no row is lost.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from lego_rl.errors import ConfigError
from lego_rl.runstore.files import replace_file
from lego_rl.runstore.metrics import StepMetrics

LATEST = "latest"
"""The pointer file: the name of the newest complete checkpoint, written only after it is complete."""
_NAME = re.compile(r"step-(\d{6,})")


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int
    """The last completed step the checkpoint holds; a resume continues with ``step + 1``."""


def checkpoint_name(step: int) -> str:
    """``step-NNNNNN``: zero-padded, so names sort as their steps."""
    return f"step-{step:06d}"


def checkpoint_dir(checkpoints: Path, step: int) -> Path:
    return checkpoints / checkpoint_name(step)


def latest_checkpoint(checkpoints: Path) -> Checkpoint | None:
    """The checkpoint ``checkpoints/latest`` names and its step; None when no checkpoint was published.

    A pointer naming something else than an existing ``step-NNNNNN`` folder is a ``ConfigError`` naming the
    pointer and what it holds (an operator's edit gone wrong), never a silent fresh start."""
    pointer = checkpoints / LATEST
    try:
        name = pointer.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    match = _NAME.fullmatch(name)
    if match is None:
        raise ConfigError(f"{pointer} holds {name[:80]!r}, not a checkpoint name like step-000003",
                          parameter="train.resume", value=name[:80])
    path = checkpoints / name
    if not path.is_dir():
        raise ConfigError(f"{pointer} names {name}, but {path} does not exist", parameter="train.resume",
                          value=name)
    return Checkpoint(path, int(match.group(1)))


def publish_latest(checkpoints: Path, step: int) -> Path:
    """Point ``latest`` at step ``step``'s checkpoint (call only once the backend finished writing it)."""
    return replace_file(checkpoints / LATEST, checkpoint_name(step) + "\n")


def checkpoints_after(checkpoints: Path, step: int) -> list[str]:
    """Names of the checkpoint folders holding steps after ``step``, oldest first."""
    found = []
    for p in checkpoints.glob("step-*"):
        match = _NAME.fullmatch(p.name)
        if match is not None and p.is_dir() and int(match.group(1)) > step:
            found.append((int(match.group(1)), p.name))
    return [name for _, name in sorted(found)]


@dataclass(frozen=True)
class SetAside:
    steps: list[int]
    """The abandoned steps whose rows were moved out of metrics.jsonl."""
    path: Path
    """Where the whole former metrics.jsonl now is."""


def set_aside_abandoned(metrics: Path, step: int) -> SetAside | None:
    """Before a run resumed from step ``step``'s checkpoint appends: if ``metrics`` has rows for later steps
    (work the resume abandons), link the whole file to ``metrics.abandoned-<n>.jsonl`` and replace
    metrics.jsonl by its rows up to ``step``. None when there is nothing to set aside.

    Both moves are atomic (a hard link, then a rename over the name): at every instant each row is in a
    file, and a reader following metrics.jsonl sees a replaced file and reads it again from the top."""
    path = metrics
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    kept: list[bytes] = []
    abandoned: list[int] = []
    lines = data.split(b"\n")
    for number, line in enumerate(lines[:-1], 1):  # the part after the last newline is torn: never kept
        if not line.strip():
            continue
        try:
            row_step = StepMetrics.model_validate_json(line).step
        except ValueError as exc:
            raise ConfigError(f"{path}:{number} is not a metrics row ({exc.__class__.__name__}); the resume "
                              "cannot tell which steps it abandons", parameter="train.resume") from None
        if row_step > step:
            abandoned.append(row_step)
        else:
            kept.append(line + b"\n")
    if not abandoned:
        return None
    n = 1
    while True:
        aside = path.with_name(f"metrics.abandoned-{n}.jsonl")
        try:
            os.link(path, aside)  # fails when the name exists: an earlier roll back's rows are never overwritten
            break
        except FileExistsError:
            n += 1
    replace_file(path, b"".join(kept))
    return SetAside(sorted(set(abandoned)), aside)
