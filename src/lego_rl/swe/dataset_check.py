"""``lego tasks check`` over a whole dataset: every row judged, with reasons, resumable, never a torn file.

Each row gets one ``RowVerdict``: ``valid`` (gradable: base fails, the reference fix passes, a second run
agrees, nothing of the future or of the hidden tests reachable), ``invalid`` (with reason codes from
``check.REASONS``, plus ``malformed row`` for a row that does not parse) or ``error`` (the infrastructure
failed: a sandbox, the grader; the row says nothing about itself and is checked again next time).

Resuming. A verdict carries a key: a hash of the checker version, the row's own JSON, the bytes of the
repository archive it ships, its image's entry in images.json, and the grading options. A second run
over the same output reuses every ``valid``/``invalid`` verdict whose key is unchanged, so editing a
row, rebuilding its repository or upgrading the checker re-judges exactly the rows concerned.

Files. Verdicts are appended to ``<output>.partial`` as they come (one flushed line each: a crash loses
at most the rows in flight, and a torn last line is cut on the next open); when the run ends, the whole
verdict file is published in one step with ``runstore.replace_file`` and the journal removed. A reader
of ``<output>`` therefore only ever sees a complete run's verdicts.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from lego_rl.errors import TaskDataError
from lego_rl.runstore.files import replace_file
from lego_rl.runstore.log import JsonlWriter
from lego_rl.sandbox.base import ImageSpec
from lego_rl.swe.check import CheckCosts, check_task
from lego_rl.swe.seed import repo_archive
from lego_rl.tasks.model import TaskRow
from lego_rl.tasks.rows import parse_row

CHECKER_VERSION = "tasks-check/2"
"""Bump when a change to the checks could change a verdict: every stored verdict is then re-judged."""

RowStatus = Literal["valid", "invalid", "error"]
MALFORMED = "malformed row"


class RowVerdict(BaseModel):
    """One line of the verdict JSONL."""

    row: int
    """1-based line number in the dataset."""
    instance_id: str | None
    key: str
    """Hash of everything that decides the verdict (module docstring)."""
    status: RowStatus
    reasons: list[str] = []
    """Reason codes (``check.REASONS`` and ``malformed row``); empty for a valid row."""
    detail: str = ""
    check: dict[str, Any] | None = None
    """The ``TaskCheck`` as a dict (absent for a malformed row)."""
    costs: dict[str, float] = {}
    """Seconds spent on ``sandbox``, ``setup`` and ``tests`` (``CheckCosts``)."""
    duration_s: float = 0.0
    checker: str = CHECKER_VERSION


@dataclass
class DatasetRow:
    """A dataset line: its number, its text, and the task row when it parses (else why not)."""

    row: int
    line: str
    task: TaskRow | None
    problem: str = ""

    @property
    def instance_id(self) -> str | None:
        if self.task is not None:
            return self.task.metadata.instance_id
        try:
            raw = json.loads(self.line)
            iid = (raw.get("metadata") or {}).get("instance_id") or raw.get("instance_id")
            return str(iid) if iid else None
        except (ValueError, AttributeError):
            return None


def read_dataset(path: Path) -> list[DatasetRow]:
    """Every non-blank line of ``path``, parsed where it can be; duplicates of an id are malformed."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TaskDataError(f"cannot read task file: {exc.strerror}", source=str(path)) from None
    rows: list[DatasetRow] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            task = parse_row(json.loads(line))
        except json.JSONDecodeError as exc:
            rows.append(DatasetRow(number, line, None, f"invalid JSON: {exc.msg} at column {exc.colno}"))
            continue
        except TaskDataError as exc:
            rows.append(DatasetRow(number, line, None, str(exc)))
            continue
        iid = task.metadata.instance_id
        if iid in seen:
            rows.append(DatasetRow(number, line, None, f"duplicate instance_id {iid!r} (first on row {seen[iid]})"))
            continue
        seen[iid] = number
        rows.append(DatasetRow(number, line, task))
    return rows


@dataclass(frozen=True)
class CheckOptions:
    """How rows are graded; all of it is part of each verdict's key."""

    provider: str = "bwrap"
    provider_options: Mapping[str, Any] = field(default_factory=dict)
    sandbox_options: Mapping[str, Any] = field(default_factory=dict)
    images: Mapping[str, ImageSpec] | None = None
    timeout: float = 180.0
    repeat: bool = True


class _Keys:
    """Verdict keys; archive hashes are computed once per file (many rows may share a repository)."""

    def __init__(self, options: CheckOptions, dataset_dir: Path) -> None:
        self.options = options
        self.dataset_dir = dataset_dir
        self._archives: dict[Path, str] = {}

    def of(self, row: DatasetRow) -> str:
        h = hashlib.sha256()
        o = self.options
        parts: list[Any] = [CHECKER_VERSION, o.provider, dict(o.provider_options), dict(o.sandbox_options),
                            o.timeout, o.repeat]
        try:
            parts.append(json.loads(row.line))
        except json.JSONDecodeError:
            parts.append(row.line)
        if row.task is not None:
            meta = row.task.metadata
            spec = (o.images or {}).get(meta.image)
            parts.append(repr(spec) if spec is not None else None)
            try:
                archive = repo_archive(meta, self.dataset_dir)
            except TaskDataError as exc:
                archive, parts = None, [*parts, str(exc)]
            if archive is not None:
                if archive not in self._archives:
                    self._archives[archive] = hashlib.sha256(archive.read_bytes()).hexdigest()
                parts.append(self._archives[archive])
        h.update(json.dumps(parts, sort_keys=True, default=str).encode())
        return h.hexdigest()


def journal_path(output: Path) -> Path:
    return output.with_name(output.name + ".partial")


def load_verdicts(output: Path) -> dict[str, RowVerdict]:
    """Reusable verdicts (``valid``/``invalid``) of earlier runs by key: the published file, then the
    journal of an interrupted run (newer). Lines that do not parse (a torn tail) are skipped."""
    found: dict[str, RowVerdict] = {}
    for path in (output, journal_path(output)):
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            continue
        for line in lines:
            try:
                verdict = RowVerdict.model_validate_json(line)
            except ValidationError:
                continue
            if verdict.status != "error" and verdict.checker == CHECKER_VERSION:
                found[verdict.key] = verdict
    return found


def _malformed(row: DatasetRow, key: str) -> RowVerdict:
    return RowVerdict(row=row.row, instance_id=row.instance_id, key=key, status="invalid", reasons=[MALFORMED],
                      detail=row.problem)


async def _judge(row: DatasetRow, key: str, options: CheckOptions, dataset_dir: Path) -> RowVerdict:
    assert row.task is not None
    costs = CheckCosts()
    start = time.monotonic()
    try:
        check = await check_task(row.task, provider=options.provider, images=options.images,
                                 provider_options=options.provider_options, timeout=options.timeout,
                                 dataset_dir=dataset_dir, sandbox_options=options.sandbox_options,
                                 repeat=options.repeat, costs=costs)
    except TaskDataError as exc:  # e.g. its repository archive is not there: the row's fault
        return RowVerdict(row=row.row, instance_id=row.instance_id, key=key, status="invalid",
                          reasons=[MALFORMED], detail=str(exc), duration_s=round(time.monotonic() - start, 2))
    status: RowStatus = ("valid" if check.verdict == "gradable" else
                         "error" if check.verdict in ("grader error", "setup error") else "invalid")
    return RowVerdict(row=row.row, instance_id=row.instance_id, key=key, status=status, reasons=check.reasons,
                      detail=check.detail, check=check.as_dict(), costs=costs.as_dict(),
                      duration_s=round(time.monotonic() - start, 2))


@dataclass
class DatasetCheck:
    """A finished run: verdicts in dataset order, and which of them were reused from an earlier run."""

    verdicts: list[RowVerdict]
    reused_rows: set[int]
    wall_s: float

    @property
    def reused(self) -> int:
        return len(self.reused_rows)

    def count(self, status: RowStatus) -> int:
        return sum(v.status == status for v in self.verdicts)

    def reasons(self) -> Counter[str]:
        return Counter(r for v in self.verdicts for r in v.reasons)

    def summary(self) -> dict[str, Any]:
        judged = [v for v in self.verdicts if v.row not in self.reused_rows]  # this run's cost only
        fresh = len(self.verdicts) - self.reused
        costs = {k: round(sum(v.costs.get(k, 0.0) for v in judged), 2) for k in ("sandbox", "setup", "tests")}
        return {"rows": len(self.verdicts), "valid": self.count("valid"), "invalid": self.count("invalid"),
                "error": self.count("error"), "reused": self.reused, "checked": fresh,
                "reasons": dict(sorted(self.reasons().items())), "wall_s": round(self.wall_s, 2),
                "rows_per_min": round(fresh / self.wall_s * 60, 2) if fresh and self.wall_s > 0 else None,
                "cost_s": costs, "checker": CHECKER_VERSION}


async def check_dataset(rows: Sequence[DatasetRow], *, dataset_dir: Path, options: CheckOptions,
                        output: Path | None = None, concurrency: int = 2,
                        on_verdict: Callable[[RowVerdict, bool], None] | None = None) -> DatasetCheck:
    """Judge ``rows`` with at most ``concurrency`` in flight. With ``output``, verdicts of an earlier run
    with the same key are reused, new ones journaled as they come, and ``output`` published at the end.
    ``on_verdict(verdict, reused)`` is called once per row, in completion order."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency}")
    keys = _Keys(options, dataset_dir)
    earlier = load_verdicts(output) if output is not None else {}
    journal = JsonlWriter(journal_path(output)) if output is not None else None
    gate = asyncio.Semaphore(concurrency)
    reused: set[int] = set()
    start = time.monotonic()

    async def one(row: DatasetRow) -> RowVerdict:
        key = keys.of(row)
        if key in earlier:
            verdict = earlier[key].model_copy(update={"row": row.row})
            reused.add(row.row)
            if on_verdict:
                on_verdict(verdict, True)
            return verdict
        if row.task is None:
            verdict = _malformed(row, key)
        else:
            async with gate:
                verdict = await _judge(row, key, options, dataset_dir)
        if journal is not None:
            journal.write(verdict)
        if on_verdict:
            on_verdict(verdict, False)
        return verdict

    try:
        verdicts = list(await asyncio.gather(*(one(r) for r in rows)))
    finally:
        if journal is not None:
            journal.close()
    result = DatasetCheck(verdicts, reused, time.monotonic() - start)
    if output is not None:
        _publish(output, "".join(v.model_dump_json() + "\n" for v in verdicts))
        journal_path(output).unlink(missing_ok=True)
    return result


def _publish(path: Path, text: str) -> None:
    """``replace_file``, then the mode a plain ``open`` would give (its temp file is private, 0600)."""
    replace_file(path, text)
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o666 & ~umask)


def write_valid(path: Path, rows: Sequence[DatasetRow], verdicts: Sequence[RowVerdict]) -> int:
    """Write the dataset lines of the valid rows, verbatim and in order, atomically; how many."""
    valid = {v.row for v in verdicts if v.status == "valid"}
    lines = [r.line for r in rows if r.row in valid]
    _publish(path, "".join(line + "\n" for line in lines))
    return len(lines)
