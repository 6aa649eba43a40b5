"""Reference patches from a separate file (``lego tasks prepare --reference FILE``).

Some datasets (MiMo) carry no known-good fix, so ``lego tasks check`` can only prove half of a task
(the unmodified image fails). An operator who has fixes supplies them as JSONL, one
``{"instance_id": ..., "patch": ...}`` object a line; each is checked like a row's own reference patch
(a well-formed unified diff) and attached to the row of that id.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from lego_rl.errors import TaskDataError
from lego_rl.tasks.patchpaths import check_patch_structure
from lego_rl.tasks.rows import LoadResult


@dataclass
class References:
    patches: dict[str, str] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)
    """Line of the file each instance id came from (for error messages)."""


def load_references(path: str | Path) -> References:
    """Read the JSONL; every bad line is named (line number, what is wrong) in one ``TaskDataError``."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise TaskDataError(f"cannot read reference file: {exc.strerror}", source=str(p)) from None
    refs = References()
    problems: list[str] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"line {n}: invalid JSON: {exc.msg} at column {exc.colno}")
            continue
        iid, patch = (raw.get("instance_id"), raw.get("patch")) if isinstance(raw, dict) else (None, None)
        if not isinstance(iid, str) or not iid or not isinstance(patch, str) or not patch.strip():
            problems.append(f'line {n}: expected {{"instance_id": "...", "patch": "..."}} with a non-empty patch')
            continue
        if iid in refs.patches:
            problems.append(f"line {n}: duplicate instance_id {iid!r} (first on line {refs.lines[iid]})")
            continue
        try:
            check_patch_structure(patch, what="reference patch")
        except TaskDataError as exc:
            problems.append(f"line {n} ({iid}): {exc}")
            continue
        refs.patches[iid], refs.lines[iid] = patch, n
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise TaskDataError(f"{len(problems)} bad reference lines: " + "; ".join(problems[:5]) + more, source=str(p))
    if not refs.patches:
        raise TaskDataError("the reference file holds no patch", source=str(p))
    return refs


def attach_references(result: LoadResult, refs: References, *, selected: bool, source: str) -> int:
    """Set each row's ``reference_patch`` from ``refs`` (it replaces one the dataset had); return how many.

    Without an id selection (``selected`` false) a reference for an id the dataset does not have is an
    error (a mismatched file would otherwise attach nothing in silence); with one, references outside
    the selection are ignored.
    """
    known = {r.metadata.instance_id for r in result.rows} | {i.instance_id for i in result.issues if i.instance_id}
    unknown = [iid for iid in refs.patches if iid not in known]
    if unknown and not selected:
        shown = ", ".join(f"{iid!r} (line {refs.lines[iid]})" for iid in unknown[:5])
        raise TaskDataError(f"{len(unknown)} reference patches name no task of the dataset: {shown}", source=source)
    attached = 0
    for k, row in enumerate(result.rows):
        patch = refs.patches.get(row.metadata.instance_id)
        if patch is not None:
            meta = row.metadata.model_copy(update={"reference_patch": patch})
            result.rows[k] = row.model_copy(update={"metadata": meta})
            attached += 1
    return attached


__all__ = ["References", "attach_references", "load_references"]
