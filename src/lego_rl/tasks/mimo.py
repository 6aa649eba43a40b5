"""Xiaomi MiMo code dataset: ``code.parquet`` + ``image-mapping.jsonl`` to task rows.

Each parquet row has a struct column ``extra_info`` whose ``instance_json`` field is a JSON string with
``instance_id``, ``problem_statement``, ``docker_image``, ``cwd``, ``test_patch`` and ``test_command``.
The image is mapped through the official ``image-mapping.jsonl`` (``dataset_image`` ->
``dockerhub_image``). The prompt carries only the problem statement; the test patch and command stay in
the grading payload. MiMo graders run as root because some images set their toolchain up in root's
login profile.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lego_rl.errors import TaskDataError
from lego_rl.tasks.rows import LoadResult, RowIssue, check_ids_unique, finish_selection, parse_row

MIMO_DATASET = "XiaomiMiMo/MiMo-V2.6-RL-oss"
PARQUET_NAME = "code.parquet"
MAPPING_NAME = "image-mapping.jsonl"
_REQUIRED = ("instance_id", "problem_statement", "docker_image", "cwd", "test_patch", "test_command")


def load_image_mapping(path: Path) -> dict[str, str]:
    """``dataset_image`` -> ``dockerhub_image``; a malformed or contradictory line is a ``TaskDataError``."""
    mapping: dict[str, str] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise TaskDataError(f"cannot read image mapping: {exc.strerror}", source=str(path)) from None
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskDataError(f"invalid JSON: {exc.msg}", source=str(path), row=n) from None
        src, dst = (obj.get("dataset_image"), obj.get("dockerhub_image")) if isinstance(obj, dict) else (None, None)
        if not isinstance(src, str) or not isinstance(dst, str) or not src or not dst:
            raise TaskDataError("expected {\"dataset_image\": str, \"dockerhub_image\": str}", source=str(path), row=n)
        if mapping.get(src, dst) != dst:
            raise TaskDataError(f"{src!r} is mapped twice, to {mapping[src]!r} and {dst!r}", source=str(path), row=n)
        mapping[src] = dst
    return mapping


def _read_instances(parquet: Path) -> list[Any]:
    """The decoded ``extra_info.instance_json`` of every row (or the exception text for a bad one)."""
    import pyarrow.parquet as pq  # deferred: keeps `lego --help` fast

    try:
        table = pq.read_table(parquet, columns=["extra_info"])
    except (OSError, KeyError, ValueError) as exc:
        raise TaskDataError(f"cannot read the extra_info column: {exc}", source=str(parquet)) from None
    out: list[Any] = []
    for info in table.column("extra_info").to_pylist():
        if not isinstance(info, dict) or not isinstance(info.get("instance_json"), str):
            out.append(TaskDataError("extra_info.instance_json is missing or not a string"))
            continue
        try:
            out.append(json.loads(info["instance_json"]))
        except json.JSONDecodeError as exc:
            out.append(TaskDataError(f"extra_info.instance_json is not valid JSON: {exc.msg}"))
    return out


def mimo_row(inst: Any, mapping: dict[str, str]) -> dict[str, Any]:
    """One decoded ``instance_json`` to a raw row in TaskRow shape (validated by the caller)."""
    if not isinstance(inst, dict):
        raise TaskDataError("instance_json is not a JSON object")
    missing = [k for k in _REQUIRED if not isinstance(inst.get(k), str) or not inst[k].strip()]
    if missing:
        raise TaskDataError(f"instance_json lacks non-empty string field(s): {', '.join(missing)}")
    image = mapping.get(inst["docker_image"])
    if image is None:
        raise TaskDataError(f"docker_image {inst['docker_image']!r} is not in {MAPPING_NAME}")
    meta: dict[str, Any] = {
        "instance_id": inst["instance_id"],
        "dataset": MIMO_DATASET,
        "image": image,
        "workdir": inst["cwd"],
        "problem_statement": inst["problem_statement"],
        "eval_cmd": inst["test_command"],
        "eval_user": "root",
        "test_patch": inst["test_patch"],
    }
    ref = inst.get("patch") or inst.get("gold_patch")
    if isinstance(ref, str) and ref.strip():
        meta["reference_patch"] = ref
    return {
        "prompt": [{"role": "user", "content": inst["problem_statement"]}],
        "label": inst["instance_id"],
        "metadata": meta,
    }


def convert_mimo(data_dir: str | Path, ids: Sequence[str] | None = None) -> LoadResult:
    """Convert ``data_dir/code.parquet`` with ``data_dir/image-mapping.jsonl``.

    With ``ids``, only those tasks are converted (in the order given); a duplicate or unknown id raises
    ``TaskDataError``. Bad rows come back as issues with their 1-based parquet row number.
    """
    d = Path(data_dir)
    parquet, mapping_path = d / PARQUET_NAME, d / MAPPING_NAME
    for p in (parquet, mapping_path):
        if not p.is_file():
            raise TaskDataError(f"{p.name} not found in {d}", source=str(p))
    mapping = load_image_mapping(mapping_path)
    instances = _read_instances(parquet)
    check_ids_unique(ids)
    wanted = set(ids) if ids is not None else None
    result = LoadResult()
    seen: dict[str, int] = {}
    for n, inst in enumerate(instances, start=1):
        iid = inst.get("instance_id") if isinstance(inst, dict) else None
        if wanted is not None and iid not in wanted:
            continue
        try:
            if isinstance(inst, TaskDataError):
                raise inst
            row = parse_row(mimo_row(inst, mapping))
        except TaskDataError as exc:
            result.issues.append(RowIssue(n, str(exc), iid if isinstance(iid, str) else None))
            continue
        if row.label in seen:
            result.issues.append(RowIssue(n, f"duplicate instance_id {row.label!r} (first on row {seen[row.label]})", row.label))
            continue
        seen[row.label] = n
        result.rows.append(row)
    return finish_selection(result, ids, source=str(parquet))
