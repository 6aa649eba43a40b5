"""A run of issue 14's size (10,000+ rollouts, 200 steps; the synthetic test double): a live refresh parses
exactly the lines appended since the last one and costs a small fraction of a full read (the budget is
200 ms of CPU; the figures on a quiet machine are in benchmarks/RESULTS.md), and every view still renders."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest
from rich.console import Console
from support.synthetic_run import write_synthetic_run

from lego_rl.monitor.app import Monitor, render_once
from lego_rl.monitor.state import RunState

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes, bytes]:
    """The run without its last step (as a live monitor sees it), and that step's events and metrics row."""
    root = tmp_path_factory.mktemp("large") / "run"
    write_synthetic_run(root, steps=200, groups=10, group_size=5, tasks=400, artifacts=50)
    events = (root / "events.jsonl").read_bytes().splitlines(keepends=True)
    metrics = (root / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    cut = max(i for i, line in enumerate(events) if b'"kind":"step_started"' in line)
    (root / "events.jsonl").write_bytes(b"".join(events[:cut]))
    (root / "metrics.jsonl").write_bytes(b"".join(metrics[:-1]))
    return root, b"".join(events[cut:]), metrics[-1]


def test_a_refresh_parses_only_what_was_appended_and_costs_a_fraction_of_a_full_read(
    large: tuple[Path, bytes, bytes],
) -> None:
    root, step_events, step_row = large
    t0 = time.process_time()
    mon = Monitor(root, kl_warn=1e-3)
    mon.refresh()
    full = time.process_time() - t0
    assert len(mon.state.rollouts) > 10_000 - 60 and mon.state.kind == "train"
    parsed: list[bytes] = []
    follower = mon.state.events.follower
    parse = follower.parse
    follower.parse = lambda raw: (parsed.append(raw), parse(raw))[1]  # type: ignore[assignment]
    with (root / "events.jsonl").open("ab") as fh:
        fh.write(step_events)
    with (root / "metrics.jsonl").open("ab") as fh:
        fh.write(step_row)
    screen = Console(file=io.StringIO(), width=160, height=50, force_terminal=True)
    ticks = []
    for view in ("overview", "terminations", "timing", "tasks", "consistency", "rollouts", "pipeline"):
        mon.key(
            {
                "overview": "o",
                "terminations": "t",
                "timing": "s",
                "tasks": "g",
                "consistency": "c",
                "rollouts": "r",
                "pipeline": "p",
            }[view]
        )
        t0 = time.process_time()
        mon.refresh()
        screen.print(mon.render(160, 50))
        ticks.append(time.process_time() - t0)
    assert b"".join(line + b"\n" for line in parsed) == step_events  # each appended line once, nothing else
    assert mon.state.finished is not None and max(mon.state.steps) == 199
    assert max(ticks) < 0.2, ticks
    assert max(ticks) < full / 5, (ticks, full)


def test_every_view_of_the_large_run_renders_and_the_json_holds_all_steps(
    large: tuple[Path, bytes, bytes],
) -> None:
    root = large[0]
    mon = Monitor(root, kl_warn=1e-3)
    console = Console(file=io.StringIO(), width=160)
    with console.capture() as cap:
        render_once(mon, console)
    text = cap.get()
    assert "400 tasks; zero-variance groups" in text and "termination mix per step" in text
    state = RunState(root)
    state.refresh()
    rows = [json.loads(line) for line in (root / "metrics.jsonl").read_text().splitlines()]
    assert {s: a.terminations for s, a in state.steps.items() if a.metrics} == {
        r["step"]: r["terminations"] for r in rows
    }
