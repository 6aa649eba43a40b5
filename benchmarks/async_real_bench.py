"""Asynchronous vs synchronous training steps through real Claude Code in bwrap (issue 12 (b)).

Nothing is simulated: each mode is a real ``lego train`` process on lego.toml (the tiny model on lego's own
CPU engine, the real adapter, Claude Code installed offline into bubblewrap sandboxes, the real grader),
in its own loopback-only network namespace, as ``make run`` drives it. The two modes differ only in
``rollout.max_staleness``: 0 = synchronous (the next step's rollouts start once this step trained and
synced), 1 = asynchronous (freed slots start the next step's groups while stragglers of this one finish).

Fairness on a shared, loaded machine: both modes run *at the same time*, so they see the same load (the
load average is sampled throughout and printed); each gets the same slot count, batch and budgets. The
tiny model never earns a reward here, so every group has zero variance and nothing is trained: the
trainer's share of a step is ~0 s and the measured difference is the rollout side alone (slots left idle
behind a straggler), a lower bound of what asynchrony buys when the trainer has work.

Figures per mode, from its run directory (events.jsonl, metrics.jsonl), over the window from step 0's
start to the last step's end:

* s/step: wall time per step (window / steps) and the median of per-step intervals;
* idle slots: 1 - (slot-seconds rollouts held) / (slots x window), each rollout from ``rollout_started``
  to its ``rollout_finished`` or ``rollout_cancelled``;
* trainer idle: the trainer's wait for its batch (``time_rollout_s`` summed over the steps) / window;
* rollouts started, cancelled as stale, trained; rollout wall time median / max.

Ratios are async against sync of the same run: steps per hour, and wall per step.

    .venv/bin/python benchmarks/async_real_bench.py [--steps 6] [--time-budget 120] [--out runs/async-real-<t>]

Exit status 0 when both runs completed, 1 otherwise (their logs' tails are printed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from lego_rl.runstore import RunLayout, follow_metrics, read_events  # noqa: E402
from lego_rl.runstore import metric_catalog as mc  # noqa: E402
from lego_rl.runstore.events import (  # noqa: E402
    BatchTaken,
    RolloutCancelled,
    RolloutFinished,
    RolloutStarted,
    StepFinished,
    StepStarted,
)

MODES = (("sync", 0), ("async", 1))


@dataclass
class ModeFigures:
    mode: str
    max_staleness: int
    exit_code: int
    steps: int
    window_s: float
    s_per_step: float
    step_median_s: float
    steps_per_hour: float
    idle_slot_fraction: float
    trainer_idle_fraction: float
    rollouts_started: int
    rollouts_cancelled_stale: int
    rollouts_trained: int
    rollout_median_s: float
    rollout_max_s: float
    terminations: dict[str, int]


def figures(root: Path, mode: str, k: int, slots: int, exit_code: int) -> ModeFigures:
    """The mode's figures read back from its run directory (see the module docstring)."""
    layout = RunLayout(root)
    events = read_events(layout.events)
    rows = list(follow_metrics(layout.metrics).read())
    starts = [e.ts for e in events if isinstance(e, StepStarted)]
    ends = [e.ts for e in events if isinstance(e, StepFinished)]
    if not starts or not ends:
        raise SystemExit(f"{mode}: {layout.events} has no finished step (exit {exit_code})")
    t0, t1 = min(starts), max(ends)
    window = t1 - t0
    began: dict[str, float] = {}
    ended: dict[str, float] = {}
    stale = 0
    terminations: dict[str, int] = {}
    for e in events:
        if isinstance(e, RolloutStarted):
            began[e.rollout_id] = e.ts
        elif isinstance(e, RolloutFinished):
            ended.setdefault(e.rollout_id, e.ts)
            terminations[e.termination.value] = terminations.get(e.termination.value, 0) + 1
        elif isinstance(e, RolloutCancelled):
            ended[e.rollout_id] = min(ended.get(e.rollout_id, e.ts), e.ts)
            stale += e.reason == "stale"
    held = 0.0
    durations = []
    for rid, b in began.items():
        e = ended.get(rid, t1)  # still running when the run ended (cancelled without an event): held to the end
        durations.append(e - b)
        held += max(0.0, min(e, t1) - max(b, t0))
    trained = sum(len(e.rollout_ids) for e in events if isinstance(e, BatchTaken))
    intervals = [b - a for a, b in zip([t0, *sorted(ends)[:-1]], sorted(ends), strict=True)]
    waited = sum(mc.read(r.values, mc.TIME_ROLLOUT_S) or 0.0 for r in rows)
    steps = len(ends)
    return ModeFigures(
        mode=mode, max_staleness=k, exit_code=exit_code, steps=steps, window_s=window, s_per_step=window / steps,
        step_median_s=statistics.median(intervals), steps_per_hour=3600.0 * steps / window,
        idle_slot_fraction=1.0 - held / (slots * window), trainer_idle_fraction=min(1.0, waited / window),
        rollouts_started=len(began), rollouts_cancelled_stale=stale, rollouts_trained=trained,
        rollout_median_s=statistics.median(durations), rollout_max_s=max(durations), terminations=terminations,
    )


async def sample_load(into: list[float], every_s: float) -> None:
    """The 1-minute load average every ``every_s`` seconds, until cancelled."""
    while True:
        into.append(float(Path("/proc/loadavg").read_text().split()[0]))
        await asyncio.sleep(every_s)


async def run_mode(lego: str, config: str, root: Path, k: int, args: argparse.Namespace) -> int:
    """One ``lego train`` in its own loopback-only network namespace (as scripts/run_main_job.sh); its exit code."""
    sets = {
        "rollout.max_staleness": k, "rollout.concurrency": args.slots, "rollout.batch_size": args.batch,
        "rollout.samples_per_prompt": args.samples, "agent.time_budget_s": args.time_budget,
    }
    argv = [lego, "train", "-c", config, "--run-root", str(root), "--steps", str(args.steps)]
    for key, value in sets.items():
        argv += ["--set", f"{key}={value}"]
    log = (root.parent / f"{root.name}.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        "unshare", "-n", "bash", "-c", 'ip link set lo up && exec "$@"', "netns", *argv,
        stdout=log, stderr=asyncio.subprocess.STDOUT, cwd=REPO, start_new_session=True,
    )
    try:
        return await proc.wait()
    finally:
        log.close()


def tail(path: Path, n: int = 2000) -> str:
    data = path.read_bytes() if path.exists() else b""
    return data[-n:].decode(errors="replace")


async def main_async(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} is not empty: every benchmark run gets a new folder (--out)")
    out.mkdir(parents=True, exist_ok=True)
    loads: list[float] = []
    sampler = asyncio.create_task(sample_load(loads, 10.0))
    started = time.time()
    codes = await asyncio.gather(*(run_mode(args.lego, args.config, out / mode, k, args) for mode, k in MODES))
    sampler.cancel()
    elapsed = time.time() - started
    print(f"lego train through Claude Code in bwrap, tiny model on the CPU engine; {args.steps} steps per mode, "
          f"batch {args.batch}x{args.samples}, {args.slots} slots, agent.time_budget_s={args.time_budget:g}; "
          f"both modes at once, {elapsed / 60:.1f} min in all; host: {os.cpu_count()} CPUs, 1-min load "
          f"min/mean/max {min(loads):.1f}/{statistics.mean(loads):.1f}/{max(loads):.1f}")
    failed = [(mode, c) for (mode, _), c in zip(MODES, codes, strict=True) if c != 0]
    for mode, code in failed:
        print(f"{mode}: lego train exited {code}; the end of {out / (mode + '.log')}:\n{tail(out / (mode + '.log'))}")
    figs = [figures(out / mode, mode, k, args.slots, c) for (mode, k), c in zip(MODES, codes, strict=True)]
    base = figs[0]
    print(f"| mode | steps | s/step | median step s | steps/h | vs sync | idle slots | trainer idle | started | "
          f"stale-cancelled | trained | rollout median/max s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for f in figs:
        print(f"| {f.mode} (K={f.max_staleness}) | {f.steps} | {f.s_per_step:.1f} | {f.step_median_s:.1f} | "
              f"{f.steps_per_hour:.1f} | {f.steps_per_hour / base.steps_per_hour:.2f}x | {f.idle_slot_fraction:.1%} | "
              f"{f.trainer_idle_fraction:.1%} | {f.rollouts_started} | {f.rollouts_cancelled_stale} | "
              f"{f.rollouts_trained} | {f.rollout_median_s:.0f}/{f.rollout_max_s:.0f} |")
    for f in figs:
        print(f"{f.mode} terminations: {json.dumps(f.terminations, sort_keys=True)}")
    summary = {"args": vars(args), "elapsed_s": elapsed, "load_1min": loads, "modes": [asdict(f) for f in figs]}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return 1 if failed else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--slots", type=int, default=4, help="rollout.concurrency of each mode")
    ap.add_argument("--batch", type=int, default=2, help="rollout.batch_size (prompts per step)")
    ap.add_argument("--samples", type=int, default=2, help="rollout.samples_per_prompt")
    ap.add_argument("--time-budget", type=float, default=120.0, help="agent.time_budget_s per rollout")
    ap.add_argument("--config", default="lego.toml")
    ap.add_argument("--lego", default=str(REPO / ".venv" / "bin" / "lego"))
    ap.add_argument("--out", default=str(REPO / "runs" / time.strftime("async-real-%Y%m%d-%H%M%S")))
    sys.exit(asyncio.run(main_async(ap.parse_args())))


if __name__ == "__main__":
    main()
