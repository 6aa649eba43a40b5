"""Scale: the report of a run of 10,000 rollouts over 500 steps (the synthetic TEST DOUBLE of a long
coding-agent run) holds every view and stays under 5 MB (figures in benchmarks/RESULTS.md)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from support.synthetic_run import write_synthetic_run
from typer.testing import CliRunner

from lego_rl.cli.main import app

pytestmark = pytest.mark.slow
LIMIT = 5 * 1024 * 1024


def test_a_report_of_10000_rollouts_and_500_steps_is_under_5_mb(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_synthetic_run(run, steps=500, groups=4, group_size=5, tasks=400, artifacts=20)
    out = tmp_path / "r.html"
    t0 = time.monotonic()
    res = CliRunner().invoke(app, ["report", str(run), "--html", str(out)])
    took = time.monotonic() - t0
    assert res.exit_code == 0, res.output
    html = out.read_text(encoding="utf-8")
    assert len(html.encode()) < LIMIT, f"{len(html.encode()):,} bytes"
    ids = re.findall(r'<section id="([a-z-]+)">', html)
    assert ids == ["overview", "training", "rewards", "terminations", "timing", "tasks", "consistency",
                   "staleness", "tokenisation", "pipeline", "behaviour", "rollouts", "metrics"]
    assert "steps finished</td><td class=\"\">500 of 500" in html
    grid = re.search(r'<svg[^>]*aria-label="task grid".*?</svg>', html, flags=re.DOTALL)
    assert grid is not None
    rollouts = (run / "events.jsonl").read_text().count('"kind":"rollout_finished"')
    assert rollouts >= 10_000 and grid.group(0).count("<rect ") == rollouts  # every attempt drawn
    print(f"report of {rollouts:,} rollouts, 500 steps: {len(html.encode()):,} bytes in {took:.1f} s")
