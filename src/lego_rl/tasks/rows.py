"""Reading and writing task JSONL: every bad row is reported with its row number and reason.

``load_tasks`` never stops at the first bad line: it returns the good rows and one ``RowIssue`` per
bad one, so an operator fixes a dataset in one pass. ``write_tasks`` is atomic (the run store's
``replace_file``: temp file in the same directory, then a rename): a reader never sees a half-written
JSONL.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from lego_rl.errors import TaskDataError
from lego_rl.runstore.files import replace_file
from lego_rl.tasks.f2p import normalize_f2p_row
from lego_rl.tasks.model import TaskRow


@dataclass(frozen=True)
class RowKeys:
    """Where a dataset keeps the parts of a row (``rollout.input_key``, ``rollout.label_key``,
    ``rollout.metadata_key``, ``agent.sandbox_image_metadata_key``). The defaults are the row model's own
    names; other names are read into them, so the rest of lego sees one shape."""

    input: str = "prompt"
    label: str = "label"
    metadata: str = "metadata"
    image: str = "image"
    """Key inside the metadata naming the task image."""

    def canonical(self, raw: dict[str, Any]) -> dict[str, Any]:
        """``raw`` with its parts under the row model's names (unchanged when the keys are the defaults).

        A dataset that keeps its own column under a model name (say a ``prompt`` beside ``input_key =
        "messages"``) would otherwise be silently overwritten; it is an error instead."""
        if self == RowKeys():
            return raw
        out = dict(raw)
        for model_key, key in (("prompt", self.input), ("label", self.label), ("metadata", self.metadata)):
            if key == model_key:
                continue
            if model_key in raw:
                raise TaskDataError(f"the row has both `{key}` (read as {model_key}) and `{model_key}`")
            if key in out:
                out[model_key] = out.pop(key)
        meta = out.get("metadata")
        if self.image != "image" and isinstance(meta, dict):
            if "image" in meta:
                raise TaskDataError(f"metadata has both `{self.image}` (read as image) and `image`")
            meta = dict(meta)
            if self.image in meta:
                meta["image"] = meta.pop(self.image)
            out["metadata"] = meta
        return out


@dataclass(frozen=True)
class RowIssue:
    """One row that could not be used. ``row`` is 1-based (a line of JSONL, a row of parquet)."""

    row: int
    reason: str
    instance_id: str | None = None


@dataclass
class LoadResult:
    rows: list[TaskRow] = field(default_factory=list)
    issues: list[RowIssue] = field(default_factory=list)

    def raise_on_issues(self, source: str) -> None:
        """Raise ``TaskDataError`` naming the first bad row and how many there are."""
        if self.issues:
            first = self.issues[0]
            more = f" (and {len(self.issues) - 1} more bad rows)" if len(self.issues) > 1 else ""
            raise TaskDataError(f"{first.reason}{more}", source=source, row=first.row)


def describe_validation_error(exc: ValidationError) -> str:
    """Pydantic's error list as one line: ``metadata.image: Field required; ...``."""
    parts = []
    for e in exc.errors():
        loc = ".".join(str(x) for x in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


def parse_row(raw: Any, keys: RowKeys | None = None) -> TaskRow:
    """A decoded JSON object to a ``TaskRow``; f2p_script rows in their native shape are accepted too.

    ``keys`` names the row's parts when the dataset does not use the model's names."""
    if not isinstance(raw, dict):
        raise TaskDataError(f"expected a JSON object, got {type(raw).__name__}")
    try:
        return TaskRow.model_validate(normalize_f2p_row((keys or RowKeys()).canonical(raw)))
    except ValidationError as exc:
        raise TaskDataError(describe_validation_error(exc)) from None


def _guess_id(raw: Any, keys: RowKeys) -> str | None:
    if isinstance(raw, dict):
        meta = raw.get(keys.metadata)
        if isinstance(meta, dict) and isinstance(meta.get("instance_id"), str):
            return meta["instance_id"]
        if isinstance(raw.get(keys.label), str):
            return raw[keys.label]
    return None


def load_tasks(path: str | Path, keys: RowKeys | None = None) -> LoadResult:
    """Read a task JSONL. Blank lines are skipped; duplicate instance ids are issues too.

    ``keys`` (from the config's ``rollout.*_key`` settings) says where each row keeps its parts."""
    keys = keys or RowKeys()
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise TaskDataError(f"cannot read task file: {exc.strerror}", source=str(p)) from None
    result = LoadResult()
    seen: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            result.issues.append(RowIssue(lineno, f"invalid JSON: {exc.msg} at column {exc.colno}"))
            continue
        try:
            row = parse_row(raw, keys)
        except TaskDataError as exc:
            result.issues.append(RowIssue(lineno, str(exc), _guess_id(raw, keys)))
            continue
        iid = row.metadata.instance_id
        if iid in seen:
            result.issues.append(RowIssue(lineno, f"duplicate instance_id {iid!r} (first on row {seen[iid]})", iid))
            continue
        seen[iid] = lineno
        result.rows.append(row)
    return result


def select_ids(rows: Sequence[TaskRow], ids: Sequence[str] | None, *, source: str = "") -> list[TaskRow]:
    """Rows for ``ids`` in the order given; all rows when ``ids`` is None.

    A duplicate or unknown id is a ``TaskDataError`` naming it: a silent partial selection would
    train on fewer tasks than the operator asked for.
    """
    if ids is None:
        return list(rows)
    dupes = sorted({i for i in ids if list(ids).count(i) > 1})
    if dupes:
        raise TaskDataError(f"--ids lists {', '.join(dupes)} more than once", source=source or None)
    by_id = {r.metadata.instance_id: r for r in rows}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise TaskDataError(f"ids not found (or on a bad row): {', '.join(missing)}", source=source or None)
    return [by_id[i] for i in ids]


def finish_selection(result: LoadResult, ids: Sequence[str] | None, *, source: str) -> LoadResult:
    """Order ``result.rows`` as ``ids``; an id that is neither a good row nor a reported bad row raises."""
    if ids is None:
        return result
    bad = {i.instance_id for i in result.issues}
    found = {r.metadata.instance_id for r in result.rows}
    missing = [i for i in ids if i not in found and i not in bad]
    if missing:
        raise TaskDataError(f"ids not found: {', '.join(missing)}", source=source)
    result.rows = select_ids(result.rows, [i for i in ids if i in found], source=source)
    return result


def check_ids_unique(ids: Sequence[str] | None) -> None:
    """Reject an ``--ids`` list naming a task twice (it would silently weight that task double)."""
    if ids is None:
        return
    dupes = sorted({i for i in ids if list(ids).count(i) > 1})
    if dupes:
        raise TaskDataError(f"--ids lists {', '.join(dupes)} more than once")


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, replacing the file (a converted dataset is rewritten whole)."""
    replace_file(path, text)


def write_tasks(path: str | Path, rows: Iterable[TaskRow]) -> int:
    """Write rows as JSONL atomically; returns the number written."""
    lines = [r.to_json_line() for r in rows]
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return len(lines)
