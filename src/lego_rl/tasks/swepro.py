"""SWE-bench Pro rows: the public dataset's columns plus its per-instance run script and parser.

A dataset row has ``instance_id``, ``problem_statement`` (optionally ``requirements`` and
``interface``), ``dockerhub_tag``, ``before_repo_set_cmd``, ``selected_test_files_to_run``,
``fail_to_pass``, ``pass_to_pass`` (lists, or strings holding a JSON/Python list) and the official
``test_patch``/``patch``. Scripts live at ``<scripts>/<instance_id>/run_script.sh`` and ``parser.py``.
A task is solved when the parser's JSON (``{"tests": [{"name", "status"}]}``) reports every
fail-to-pass and pass-to-pass test as ``PASSED``.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lego_rl.errors import TaskDataError
from lego_rl.tasks.rows import LoadResult, RowIssue, check_ids_unique, finish_selection, parse_row

SWEPRO_DATASET = "ScaleAI/SWE-bench_Pro"
SWEPRO_IMAGE_REPO = "docker.io/jefzda/sweap-images"
SWEPRO_WORKDIR = "/app"


def _as_list(value: Any, name: str) -> list[str]:
    """Accept a list, or a string holding a JSON or Python list (the dataset uses both)."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            try:
                value = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                raise TaskDataError(f"{name} is not a list: {value[:80]!r}") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TaskDataError(f"{name} must be a list of strings")
    return value


def _prompt(raw: dict[str, Any]) -> str:
    parts = [raw["problem_statement"].strip()]
    if isinstance(raw.get("requirements"), str) and raw["requirements"].strip():
        parts.append("Requirements:\n" + raw["requirements"].strip())
    if isinstance(raw.get("interface"), str) and raw["interface"].strip():
        parts.append("New interfaces introduced:\n" + raw["interface"].strip())
    return "\n\n".join(parts)


def swepro_row(raw: Any, scripts_dir: Path, image_repo: str = SWEPRO_IMAGE_REPO) -> dict[str, Any]:
    """One SWE-bench Pro dataset row to a raw TaskRow dict (validated by the caller)."""
    if not isinstance(raw, dict):
        raise TaskDataError("row is not an object")
    missing = [k for k in ("instance_id", "problem_statement", "dockerhub_tag") if not raw.get(k)]
    if missing:
        raise TaskDataError(f"missing field(s): {', '.join(missing)}")
    iid = raw["instance_id"]
    run_script, parser = scripts_dir / iid / "run_script.sh", scripts_dir / iid / "parser.py"
    for p in (run_script, parser):
        if not p.is_file():
            raise TaskDataError(f"{p} does not exist (expected the instance's run script and parser)")
    statement = _prompt(raw)
    meta: dict[str, Any] = {
        "instance_id": iid,
        "dataset": SWEPRO_DATASET,
        "image": f"{image_repo}:{raw['dockerhub_tag']}",
        "workdir": raw.get("workdir") or SWEPRO_WORKDIR,
        "problem_statement": statement,
        "eval_user": "root",
        "test_patch": raw.get("test_patch") or "",
        "swepro": {
            "before_repo_set_cmd": raw.get("before_repo_set_cmd") or "",
            "selected_test_files": _as_list(raw.get("selected_test_files_to_run"), "selected_test_files_to_run"),
            "fail_to_pass": _as_list(raw.get("fail_to_pass"), "fail_to_pass"),
            "pass_to_pass": _as_list(raw.get("pass_to_pass"), "pass_to_pass"),
            "run_script": str(run_script.resolve()),
            "parser": str(parser.resolve()),
        },
    }
    if isinstance(raw.get("patch"), str) and raw["patch"].strip():
        meta["reference_patch"] = raw["patch"]
    return {"prompt": [{"role": "user", "content": statement}], "label": iid, "metadata": meta}


def _read_raw(path: Path) -> list[Any]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist()
        except (OSError, ValueError) as exc:
            raise TaskDataError(f"cannot read parquet: {exc}", source=str(path)) from None
    out: list[Any] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise TaskDataError(f"cannot read: {exc.strerror}", source=str(path)) from None
    for line in lines:
        if not line.strip():
            out.append(None)  # keeps row numbers equal to line numbers
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as exc:
            out.append(TaskDataError(f"invalid JSON: {exc.msg}"))
    return out


def convert_swepro(
    data: str | Path, scripts_dir: str | Path, ids: Sequence[str] | None = None, *, image_repo: str = SWEPRO_IMAGE_REPO
) -> LoadResult:
    """Convert a SWE-bench Pro parquet or JSONL file; bad rows come back as issues with their row number."""
    path = Path(data)
    check_ids_unique(ids)
    wanted = set(ids) if ids is not None else None
    result = LoadResult()
    seen: dict[str, int] = {}
    for n, raw in enumerate(_read_raw(path), start=1):
        if raw is None:
            continue
        iid = raw.get("instance_id") if isinstance(raw, dict) else None
        if wanted is not None and iid not in wanted:
            continue
        try:
            if isinstance(raw, TaskDataError):
                raise raw
            row = parse_row(swepro_row(raw, Path(scripts_dir), image_repo))
        except TaskDataError as exc:
            result.issues.append(RowIssue(n, str(exc), iid if isinstance(iid, str) else None))
            continue
        if row.label in seen:
            result.issues.append(RowIssue(n, f"duplicate instance_id {row.label!r} (first on row {seen[row.label]})", row.label))
            continue
        seen[row.label] = n
        result.rows.append(row)
    return finish_selection(result, ids, source=str(path))
