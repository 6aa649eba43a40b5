"""Where the recorded runs are (a module of its own: `from conftest import ...` would find another directory's
conftest when several test directories are collected in one session)."""

from __future__ import annotations

from pathlib import Path

RUNS = Path(__file__).resolve().parent / "runs"
TOY = RUNS / "toy-train"
CHECK = RUNS / "rollout-check"
