"""Runs the monitor is tested against.

* ``runs/toy-train``: a real ``lego train`` run (first_letter environment, tiny model on CPU, 16 steps of
  4 prompts × 8 samples, eval every 8 steps), recorded by the product itself; config.json, events.jsonl and
  metrics.jsonl as written (the checkpoints, 84 MB of weights the monitor never reads, were left out).
* ``runs/rollout-check``: a real ``lego rollout-check --baseline`` run of Claude Code on the median example
  task (tests/rollout/test_rollout_check_cli.py's solved case), with every artifact it saved.
* a synthetic run (``support.synthetic_run``, a TEST DOUBLE for a long coding-agent run) where size or a
  mix of harnesses and failures matters.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))  # `support` helpers

from support.synthetic_run import write_synthetic_run


@pytest.fixture
def copy_run(tmp_path: Path) -> Callable[[Path], Path]:
    """A private copy of a recorded run (tests that break or extend it never touch the recording)."""

    def copy(src: Path) -> Path:
        dst = tmp_path / src.name
        shutil.copytree(src, dst)
        return dst

    return copy


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished synthetic run: 30 steps × 8 groups × 4 rollouts over four harnesses (~1,000 rollouts)."""
    root = tmp_path_factory.mktemp("synthetic") / "run"
    write_synthetic_run(root, steps=30, groups=8, group_size=4, tasks=60, artifacts=40)
    return root
