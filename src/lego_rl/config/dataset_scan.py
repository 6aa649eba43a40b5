"""A light pass over the task rows for ``lego validate``: does the file parse, which images and harnesses
does it use. Full row validation belongs to ``lego_rl.tasks``; this only reads what the checks need."""

from __future__ import annotations

import json
from pathlib import Path

from lego_rl.config.checks import Finding, error
from lego_rl.config.resolve import ResolvedConfig

MAX_ROW_ERRORS = 5


def scan_dataset(r: ResolvedConfig) -> tuple[set[str], list[Finding]]:
    images, _, findings = scan_dataset_full(r)
    return images, findings


def scan_dataset_full(r: ResolvedConfig) -> tuple[set[str], set[str], list[Finding]]:
    """(images used, harness names used by rows' ``metadata.agent``, findings)."""
    path = Path(r.config.rollout.prompt_data or "")
    key = "rollout.prompt_data"
    if not path.is_file():
        return set(), set(), [error("missing_file", f"{key} names {path}, which does not exist",
                             "prepare it with `lego tasks prepare` or set PROMPT_DATA", key)]
    images: set[str] = set()
    agents: set[str] = set()
    findings: list[Finding] = []
    meta_key = r.config.rollout.metadata_key
    image_key = r.config.agent.sandbox_image_metadata_key
    rows = 0
    with path.open() as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            rows += 1
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                findings.append(error("dataset_row", f"{path} row {number}: not valid JSON ({exc.msg})",
                                      "fix or regenerate the row with `lego tasks prepare`", key))
                continue
            meta = row.get(meta_key) if isinstance(row, dict) else None
            if not isinstance(meta, dict):
                findings.append(error("dataset_row", f"{path} row {number}: `{meta_key}` must be an object",
                                      "regenerate the dataset with `lego tasks prepare`", key))
                continue
            if not isinstance(row.get(r.config.rollout.input_key), list | str):
                findings.append(error("dataset_row", f"{path} row {number}: no prompt under "
                                      f"`{r.config.rollout.input_key}`", "set rollout.input_key or fix the row", key))
            if isinstance(meta.get("agent"), str) and meta["agent"]:
                agents.add(meta["agent"])
            image = meta.get(image_key)
            if isinstance(image, str) and image:
                images.add(image)
            else:
                findings.append(error("dataset_row", f"{path} row {number}: `{meta_key}.{image_key}` is missing",
                                      "every row needs the task image", key))
            if len(findings) >= MAX_ROW_ERRORS:
                findings.append(error("dataset_rows", f"{path}: stopped after {MAX_ROW_ERRORS} bad rows",
                                      "run `lego tasks prepare` to regenerate the file", key))
                break
    if rows == 0 and not findings:
        findings.append(error("dataset_empty", f"{path} holds no task rows", "prepare tasks with `lego tasks prepare`", key))
    return images, agents, findings
