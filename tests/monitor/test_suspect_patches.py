"""Suspect patches per step: the monitor's overview and report show how many rollouts of each step ended
``suspect_patch`` (a recorded run with two of its rollouts relabelled, the way the rollout writes them)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from monitor_runs import TOY
from rich.console import Console

from lego_rl.monitor import views
from lego_rl.monitor.report import _overview
from lego_rl.monitor.snapshot import build
from lego_rl.monitor.state import RunState


def _relabel(root: Path, ids: set[str]) -> None:
    lines = []
    for line in (root / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e["kind"] == "rollout_finished" and e["rollout_id"] in ids:
            e["termination"], e["reward"] = "suspect_patch", 0.0
        lines.append(json.dumps(e))
    (root / "events.jsonl").write_text("\n".join(lines) + "\n")


def test_suspect_patches_are_counted_per_step_and_shown(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(TOY, run)
    finished = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    ids = [e["rollout_id"] for e in finished if e["kind"] == "rollout_finished"]
    picked = {ids[0], ids[1], next(i for i in ids if i.startswith("s00003-"))}
    _relabel(run, picked)
    state = RunState(run)
    state.refresh()
    snap = build(state, now=time.time(), kl_warn=1e-3)
    o = snap.overview
    assert o is not None and snap.terminations is not None
    per_step = {p.step: p.value for p in o.suspect_patches}
    assert sum(per_step.values()) == 3 and per_step[0] == 2.0 and per_step[3] == 1.0
    assert snap.terminations.totals["suspect_patch"] == 3  # the Terminations view's column, same count
    console = Console(width=140, record=True)
    console.print(views.overview(snap, 140))
    text = console.export_text()
    assert "suspect" in text and "3 in all" in text
    assert "suspect patches" in _overview(snap, state) and "0: 2" in _overview(snap, state)


def test_a_run_without_suspect_patches_shows_none() -> None:
    state = RunState(TOY)
    state.refresh()
    snap = build(state, now=time.time(), kl_warn=1e-3)
    assert snap.overview is not None and snap.overview.suspect_patches == []
