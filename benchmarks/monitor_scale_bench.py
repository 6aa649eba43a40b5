"""Benchmark: a monitor snapshot of a run of issue 29's size (10,000 rollouts, 500 steps), against the budget
(< 1 s, bounded memory) and against a baseline measured in the same run.

The run is the synthetic coding-agent run of tests/support/synthetic_run.py (a TEST DOUBLE for a long run:
every line a typed run-store event): 500 steps × 5 groups × 4 rollouts over four harnesses and 100 tasks,
~8 % infrastructure failures refilled on top, consistency and policy-lag figures in every metrics row.

Measured in one run, CPU seconds (``time.process_time``; wall-clock on a shared machine includes waiting for a
core), median of 3:

* baseline: parsing every line of ``events.jsonl`` and ``metrics.jsonl`` with the run store's own typed
  readers (``follow_events`` / ``follow_metrics``), keeping nothing: the least any reader of the whole run
  does. Every figure below is also printed as a ratio to it;
* cold snapshot: a new ``RunState`` reads the run and ``build`` fills every section (what ``--json`` does
  after start-up); warm snapshot: ``build`` again on the state already read (what a live tick adds); and
  each section's share;
* the real ``lego monitor --json`` in a fresh process, against ``lego --version`` (interpreter and CLI
  import, reading nothing);
* memory: the peak of Python allocations (``tracemalloc``) during a cold snapshot at half the run (250 steps)
  and at the whole run, per 1,000 rollouts: bounded means per-rollout cost that does not grow with the run
  (every rollout is kept as one small record; turn records, transcripts and artifacts are never held).

Run: ``nice .venv/bin/python benchmarks/monitor_scale_bench.py [--steps 500]``
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.synthetic_run import write_synthetic_run

from lego_rl.monitor.snapshot import SECTIONS, TurnCache, build
from lego_rl.monitor.state import RunState
from lego_rl.runstore import follow_events, follow_metrics

LEGO = str(Path(sys.executable).with_name("lego"))
BUDGET_S = 1.0


def cpu(fn: Callable[[], object], repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def parse_only(root: Path) -> int:
    n = 0
    for follower in (follow_events(root / "events.jsonl"), follow_metrics(root / "metrics.jsonl")):
        n += sum(1 for _ in follower.read())
    return n


def snapshot(root: Path) -> None:
    state = RunState(root)
    state.refresh()
    build(state, now=time.time(), kl_warn=1e-3, sections=SECTIONS, cache=TurnCache())


def child_cpu(cmd: list[str], repeat: int = 3) -> float:
    out = []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "COLUMNS": "160"})
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        out.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(out)


def peak_mb(root: Path) -> float:
    tracemalloc.start()
    snapshot(root)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=500)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root, half = Path(tmp) / "run", Path(tmp) / "half"
        t0 = time.perf_counter()
        write_synthetic_run(root, steps=args.steps, groups=5, group_size=4, tasks=100, artifacts=50)
        write_synthetic_run(half, steps=args.steps // 2, groups=5, group_size=4, tasks=100, artifacts=50)
        counted = []
        for r in (root, half):
            s = RunState(r)
            s.refresh()
            counted.append(len(s.rollouts))
        rollouts, half_rollouts = counted
        size_mb = (root / "events.jsonl").stat().st_size / 1e6
        print(f"run: {rollouts:,} rollouts, {args.steps} steps, events.jsonl {size_mb:.1f} MB "
              f"(written in {time.perf_counter() - t0:.0f}s)")
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")

        base = cpu(lambda: parse_only(root))
        print(f"\n{'measure':<44} {'CPU s':>8} {'/ baseline':>11}")
        print(f"{'baseline: parse every line (typed readers)':<44} {base:8.3f} {1.0:10.2f}x")
        cold = cpu(lambda: snapshot(root))
        print(f"{'cold snapshot: read + every section':<44} {cold:8.3f} {cold / base:10.2f}x   "
              f"(budget {BUDGET_S:.0f} s: {'met' if cold < BUDGET_S else 'MISSED'})")
        state = RunState(root)
        state.refresh()
        cache = TurnCache()
        warm = cpu(lambda: build(state, now=time.time(), kl_warn=1e-3, sections=SECTIONS, cache=cache))
        print(f"{'warm snapshot: every section, state read':<44} {warm:8.3f} {warm / base:10.2f}x")
        for section in SECTIONS:
            t = cpu(lambda s=section: build(state, now=time.time(), kl_warn=1e-3, sections=[s], cache=cache))
            print(f"{'  section ' + section:<44} {t:8.3f} {t / base:10.2f}x")

        if shutil.which(LEGO) or Path(LEGO).exists():
            proc_base = child_cpu([LEGO, "--version"])
            proc = child_cpu([LEGO, "monitor", str(root), "--json"])
            print(f"\n{'lego --version (process baseline)':<44} {proc_base:8.3f} {1.0:10.2f}x")
            print(f"{'lego monitor --json (fresh process)':<44} {proc:8.3f} {proc / proc_base:10.2f}x   "
                  f"(start-up excluded: {proc - proc_base:.3f} s)")

        full_mb, half_mb = peak_mb(root), peak_mb(half)
        print(f"\n{'memory (tracemalloc peak, cold snapshot)':<44} {'MB':>8} {'MB / 1k rollouts':>17}")
        print(f"{f'half run ({half_rollouts:,} rollouts)':<44} {half_mb:8.1f} {half_mb / half_rollouts * 1e3:17.2f}")
        print(f"{f'whole run ({rollouts:,} rollouts)':<44} {full_mb:8.1f} {full_mb / rollouts * 1e3:17.2f}")
        print(f"per-rollout cost whole / half: {(full_mb / rollouts) / (half_mb / half_rollouts):.2f}x "
              f"(1.0: linear in rollouts, nothing else grows); peak / events.jsonl size: {full_mb / size_mb:.2f}x")


if __name__ == "__main__":
    main()
