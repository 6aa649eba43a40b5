"""Multi-stage parent directories: a folder whose subfolders are runs (the main job's ``runs/main-*/`` holds
``demos/``, ``sft/`` and ``grpo/``), itself no run."""

from __future__ import annotations

import json
from pathlib import Path

from lego_rl.runstore import RunLayout


def is_run(path: Path) -> bool:
    """A run directory: it holds the run's config or its event log."""
    layout = RunLayout(path)
    return (path / "config.json").is_file() or layout.events.is_file()


def _first_ts(path: Path) -> float:
    """When the stage began (its first event), for ordering stages; unknown sorts last."""
    try:
        with RunLayout(path).events.open("rb") as fh:
            first = json.loads(fh.readline() or b"{}")
    except (OSError, ValueError):
        return float("inf")
    ts = first.get("ts") if isinstance(first, dict) else None
    return float(ts) if isinstance(ts, int | float) else float("inf")


def stage_dirs(root: Path) -> list[Path]:
    """The runs directly under ``root`` in the order they began, when ``root`` is no run itself; else []."""
    if is_run(root) or not root.is_dir():
        return []
    subs = [p for p in root.iterdir() if p.is_dir() and is_run(p)]
    return sorted(subs, key=lambda p: (_first_ts(p), p.name))
