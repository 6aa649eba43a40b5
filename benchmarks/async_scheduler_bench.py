"""Asynchronous vs synchronous training steps: the real rollout scheduler, simulated rollouts (issue 12 (a)).

The scheduler is the product's ``RolloutScheduler``; the rollouts and the trainer are timed test doubles
(``tests/support/sched_sim.py``) on a virtual clock, so an hour of heavy-tailed rollouts takes a second and
every mode sees the same duration stream (the n-th rollout started gets the n-th duration).

Workload (fixed before measuring, not tuned to the targets): rollout durations lognormal around a
median of 60 s (sigma 0.5); each rollout is a straggler with probability 5 %, taking 10x as long; a
trainer step (train + sync) of a fixed 60 s; batches of 8 prompts x 8 samples; 50 steps; 3 seeds. The
slot count N (rollouts in flight) is swept: 64 = one whole batch at once, 32 and 16 = fewer sandboxes
than a batch.

Printed per N and mode: steps per hour and its ratio to synchronous (max_staleness 0) at the same N,
the idle-slot fraction (slot-seconds no rollout held), the wasted-slot fraction (slot-seconds of
rollouts cancelled as stale, never trained), the trainer's idle fraction (waiting for a batch), the
groups dropped as stale, and the trained rollouts' policy lag (step minus the policy each started on). "partial" is ``rollout.partial_rollouts`` keep/drop: nothing is cancelled for its
age (a straggler runs on across updates and its group is trained later, with its older tokens kept or masked
by the loop).

    .venv/bin/python benchmarks/async_scheduler_bench.py [--steps 50] [--seeds 3]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.sched_sim import Script, SimReport, simulate  # noqa: E402
from support.virtual_time import run_virtual  # noqa: E402

from lego_rl.driver.scheduler import RolloutSlot  # noqa: E402
from lego_rl.termination import TerminationReason as TR  # noqa: E402

MEDIAN_S = 60.0
SIGMA = 0.5
STRAGGLER_P = 0.05
STRAGGLER_X = 10.0
TRAIN_S = 60.0
BATCH, SAMPLES = 8, 8


def durations(seed: int, n: int) -> list[float]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        d = MEDIAN_S * math.exp(rng.gauss(0.0, SIGMA))
        out.append(d * STRAGGLER_X if rng.random() < STRAGGLER_P else d)
    return out


def script_for(stream: list[float]) -> Script:
    def script(n: int, slot: RolloutSlot) -> tuple[float, TR]:
        return stream[n % len(stream)], TR.COMPLETED

    return script


def run(seed: int, *, steps: int, slots: int, k: int, partial: bool = False) -> SimReport:
    stream = durations(seed, 200_000)
    return run_virtual(simulate(script=script_for(stream), steps=steps, train_s=TRAIN_S, batch_size=BATCH,
                                samples_per_prompt=SAMPLES, slots=slots, max_staleness=k, partial=partial))


def lags(r: SimReport) -> list[int]:
    """Step minus the policy each trained rollout started on."""
    return [b.step - p for b in r.batches() for p in b.started_policies]


def lag_mean(r: SimReport) -> float:
    return statistics.mean(lags(r))


def lag_max(r: SimReport) -> int:
    return max(lags(r))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    print(f"rollouts: lognormal median {MEDIAN_S:g} s sigma {SIGMA:g}, {STRAGGLER_P:.0%} stragglers x{STRAGGLER_X:g}; "
          f"trainer step {TRAIN_S:g} s; batch {BATCH}x{SAMPLES}; {args.steps} steps; seeds {args.seeds}")
    print(f"{'N':>3} {'mode':<17} {'steps/h':>8} {'vs sync':>8} {'idle slots':>10} {'wasted':>7} "
          f"{'trainer idle':>12} {'stale groups':>12} {'lag mean/max':>12}")
    for slots in (64, 32, 16):
        base = None
        for k, partial in ((0, False), (1, False), (2, False), (1, True)):
            reps = [run(seed, steps=args.steps, slots=slots, k=k, partial=partial) for seed in range(args.seeds)]
            sph = statistics.mean(r.steps_per_hour for r in reps)
            base = base or sph
            mode = "sync" if k == 0 else f"async K={k}" + (" partial" if partial else "")
            print(f"{slots:>3} {mode:<17} {sph:>8.2f} {sph / base:>7.2f}x "
                  f"{statistics.mean(r.idle_slot_fraction for r in reps):>10.1%} "
                  f"{statistics.mean(r.wasted_s / r.capacity_s for r in reps):>7.1%} "
                  f"{statistics.mean(r.trainer_idle_fraction for r in reps):>12.1%} "
                  f"{statistics.mean(r.stale_groups for r in reps):>12.1f} "
                  f"{statistics.mean(lag_mean(r) for r in reps):>7.2f}/{max(lag_max(r) for r in reps):<4}")


if __name__ == "__main__":
    main()
