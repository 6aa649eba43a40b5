"""Benchmark: `lego monitor` on a run of production size (10,000 rollouts, 200 steps), against the budget of
issue 14 (``--once`` under 2 s, a live refresh under 200 ms of CPU) and against a full re-read.

The run is the synthetic coding-agent run of tests/support/synthetic_run.py (a test double for a long run:
every line a typed run-store event, ~96k events, 200 metrics rows): 200 steps × 10 groups × 5 rollouts over
four harnesses, ~8 % infrastructure failures refilled on top.

Measured in one run:

* ``--once``: the real command in a fresh process (Python start-up, imports, reading every line, every view
  rendered), wall-clock, median of 3; ``--json`` the same way;
* baseline for the process: ``lego --version`` (interpreter + CLI import, reading nothing);
* live refresh: a monitor that has read the first 199 steps gets the 200th step appended (~500 events, what
  one step of this run writes), then one tick (``Monitor.refresh`` + the active view rendered to a 160×50
  screen), CPU seconds, for each view; and a tick with nothing appended;
* baseline for the tick: re-reading the whole run from scratch (a new ``RunState``), what a monitor without
  cursors would do every refresh.

Run: ``nice .venv/bin/python benchmarks/monitor_bench.py [--steps 200]``
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.synthetic_run import write_synthetic_run

from lego_rl.monitor.app import Monitor
from lego_rl.monitor.state import RunState
from lego_rl.monitor.views import VIEWS

LEGO = str(Path(sys.executable).with_name("lego"))


def timed(cmd: list[str], repeat: int = 3) -> tuple[float, float]:
    """Median wall-clock and median CPU (user + sys of the child) seconds of ``cmd``. The CPU figure is the
    one to compare on a shared machine: wall-clock there includes waiting for a core."""
    walls, cpus = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"})
        walls.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def split_last_step(root: Path, live: Path) -> tuple[bytes, bytes]:
    """Copy ``root`` to ``live`` without its last step; return the held-back events and metrics bytes."""
    events = (root / "events.jsonl").read_bytes().splitlines(keepends=True)
    metrics = (root / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    cut = max(i for i, line in enumerate(events) if b'"kind":"step_started"' in line)
    live.mkdir()
    (live / "config.json").write_bytes((root / "config.json").read_bytes())
    (live / "events.jsonl").write_bytes(b"".join(events[:cut]))
    (live / "metrics.jsonl").write_bytes(b"".join(metrics[:-1]))
    return b"".join(events[cut:]), metrics[-1]


def tick_cpu(mon: Monitor, console: Console) -> float:
    t0 = time.process_time()
    mon.refresh()
    console.print(mon.render(160, 50))
    return time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "run"
        t0 = time.perf_counter()
        write_synthetic_run(root, steps=args.steps, groups=10, group_size=5, tasks=400, artifacts=50)
        state = RunState(root)
        state.refresh()
        n_events = state.events_read
        size_mb = (root / "events.jsonl").stat().st_size / 1e6
        print(
            f"run: {len(state.rollouts):,} rollouts, {len(state.steps)} steps, {n_events:,} events "
            f"({size_mb:.1f} MB), written in {time.perf_counter() - t0:.1f}s"
        )

        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        print(f"{'command':<36} {'wall s':>7} {'CPU s':>7} {'CPU / baseline':>15}")
        base_w, base_c = timed([LEGO, "--version"])
        print(f"{'lego --version (baseline process)':<36} {base_w:7.2f} {base_c:7.2f} {1.0:14.2f}x")
        for label, extra in (("lego monitor --once", "--once"), ("lego monitor --json", "--json")):
            w, c = timed([LEGO, "monitor", str(root), extra])
            print(f"{label:<36} {w:7.2f} {c:7.2f} {c / base_c:14.2f}x   (budget 2 s)")

        t0 = time.process_time()
        RunState(root).refresh()
        full = time.process_time() - t0
        print(f"full re-read of the run (baseline tick) {full * 1000:7.1f} ms CPU")

        live = Path(tmp) / "live"
        events, metrics = split_last_step(root, live)
        screen = Console(
            file=io.StringIO(), width=160, height=50, color_system="truecolor", force_terminal=True
        )
        appended = events.count(b"\n")
        print(f"one step appended: {appended:,} events")
        print(
            f"{'view':<14} {'tick, step appended':>20} {'tick, nothing new':>18} {'full re-read / tick':>20}"
        )
        for _, section, _title in VIEWS:
            mon = Monitor(live, kl_warn=1e-3, other=root if section == "compare" else None)
            mon.view = section
            mon.refresh()
            with (live / "events.jsonl").open("ab") as fh:
                fh.write(events)
            with (live / "metrics.jsonl").open("ab") as fh:
                fh.write(metrics)
            grown = tick_cpu(mon, screen)
            idle = min(tick_cpu(mon, screen) for _ in range(3))
            print(f"{section:<14} {grown * 1000:17.1f} ms {idle * 1000:15.1f} ms {full / grown:19.1f}x")
            # put the live copy back to 199 steps for the next view
            data = (live / "events.jsonl").read_bytes()
            (live / "events.jsonl").write_bytes(data[: len(data) - len(events)])
            data = (live / "metrics.jsonl").read_bytes()
            (live / "metrics.jsonl").write_bytes(data[: len(data) - len(metrics)])


if __name__ == "__main__":
    main()
