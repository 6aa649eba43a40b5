"""The dataset as ``lego validate`` sees it: read by the rollout's own row loader (``lego_rl.tasks.rows``)
with the config's row keys, so a row ``validate`` accepts is a row ``rollout-check`` runs, and a row it
rejects is named with its row number and the loader's reason (a missing ``metadata.eval_cmd``, a bad
prompt, a duplicate instance id)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from lego_rl.config.findings import Finding, error
from lego_rl.config.resolve import ResolvedConfig
from lego_rl.errors import TaskDataError
from lego_rl.tasks.rows import RowKeys, load_tasks

MAX_ROW_ERRORS = 5
KEY = "rollout.prompt_data"


@dataclass(frozen=True)
class DatasetScan:
    images: set[str] = field(default_factory=set)
    """Images the good rows use (``metadata.image`` after the image key is applied)."""
    agents: set[str] = field(default_factory=set)
    """Harness names the good rows ask for in ``metadata.agent``."""
    findings: list[Finding] = field(default_factory=list)


def row_keys(r: ResolvedConfig) -> RowKeys:
    """The config's ``rollout.*_key`` / ``agent.sandbox_image_metadata_key`` as the loader's ``RowKeys``."""
    ro = r.config.rollout
    return RowKeys(input=ro.input_key, label=ro.label_key, metadata=ro.metadata_key,
                   image=r.config.agent.sandbox_image_metadata_key)


def _keys_fix(r: ResolvedConfig) -> str:
    moved = [k for k in ("rollout.input_key", "rollout.label_key", "rollout.metadata_key",
                         "agent.sandbox_image_metadata_key") if r.is_explicit(k)]
    return "fix the row or regenerate the file with `lego tasks prepare`" + (
        f" (rows are read with {', '.join(f'{k}={r.source(k)}' for k in moved)})" if moved else "")


def scan_dataset(r: ResolvedConfig) -> DatasetScan:
    path = Path(r.config.rollout.prompt_data or "")
    if not path.is_file():
        return DatasetScan(findings=[error("missing_file", f"{KEY} names {path}, which does not exist",
                                           "prepare it with `lego tasks prepare` or set PROMPT_DATA", KEY)])
    if r.config.train.environment:
        # The rows are the environment's own shape, not task rows: it validates them itself when
        # `lego train` loads them (before anything starts), naming the file and line.
        return DatasetScan()
    try:
        loaded = load_tasks(path, row_keys(r))
    except TaskDataError as exc:
        return DatasetScan(findings=[error("dataset_file", str(exc), "check the file and its permissions",
                                           KEY)])
    findings = [
        error("dataset_row", f"{path} row {issue.row}: {issue.reason}", _keys_fix(r), KEY)
        for issue in loaded.issues[:MAX_ROW_ERRORS]
    ]
    if len(loaded.issues) > MAX_ROW_ERRORS:
        more = len(loaded.issues) - MAX_ROW_ERRORS
        findings.append(error("dataset_rows", f"{path}: {more} more bad rows ({len(loaded.issues)} in all, "
                              f"{len(loaded.rows)} good)",
                              "run `lego tasks check` or regenerate the file with `lego tasks prepare`", KEY))
    if not loaded.rows and not loaded.issues:
        findings.append(error("dataset_empty", f"{path} holds no task rows",
                              "prepare tasks with `lego tasks prepare`", KEY))
    return DatasetScan(
        images={row.metadata.image for row in loaded.rows},
        agents={row.metadata.agent for row in loaded.rows if row.metadata.agent},
        findings=findings,
    )
