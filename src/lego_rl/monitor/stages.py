"""Multi-stage parent directories: a folder whose subfolders are runs (the main job's ``runs/main-*/`` holds
``demos/``, ``sft/`` and ``grpo/``), itself no run."""

from __future__ import annotations

import json
import time
from pathlib import Path

from pydantic import BaseModel

from lego_rl.monitor.state import RunState
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


# -- the terminal monitor's list of stages ----------------------------------------------------------------------
# Each stage is followed by its own ``RunState``, refreshed incrementally like a single run, so the list costs
# what the stages appended; a stage that appears later (the job still running) joins it.


class StageInfo(BaseModel):
    name: str
    path: str
    kind: str
    status: str
    steps_done: int | None
    """Steps finished (the latest step + 1); None for a run without steps."""
    rollouts: int
    """Finished rollouts."""
    started_at: float | None


class Stages:
    """The stages of a folder of runs, each followed by its own ``RunState``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.states: dict[Path, RunState] = {}

    def refresh(self) -> list[StageInfo]:
        """Find stages, read what each appended; in the order they began (``stage_dirs``)."""
        for path in stage_dirs(self.root):
            if path not in self.states:
                self.states[path] = RunState(path)
        infos = []
        for path, state in self.states.items():
            state.refresh()
            done = [s for s, a in state.steps.items() if a.finished is not None or a.metrics is not None]
            infos.append(StageInfo(
                name=path.name, path=str(path), kind=state.kind, status=state.status(time.time()),
                steps_done=max(done) + 1 if done else None,
                rollouts=len(state.rollouts) - len(state.in_flight), started_at=state.started_at,
            ))
        infos.sort(key=lambda i: (i.started_at is None, i.started_at or 0.0, i.name))
        return infos
