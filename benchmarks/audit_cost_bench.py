"""What ``train.audit`` costs per optimizer step at production size, on the CPU.

Two parts of ``lego_rl.train.audit.AuditedBackend.train_step`` grow with the run:

* **rank 0's trained tokens** (``trained_tokens`` + the JSON line): linear in the step's trained tokens. Baseline in
  the same run: ``json.dumps`` of the same token ids and logprobs as two flat lists, the floor of any record that
  holds them.
* **parameter fingerprints** (``fingerprint``, twice a step on every rank): linear in the rank's parameters.
  Baseline in the same run: one fp32 ``sum()`` per tensor (a single read of every parameter). Its transient memory
  (what the reductions allocate beyond the parameters) is measured in a child process (``ru_maxrss``), because on a
  GPU that is what meets an already full device.

    nice .venv/bin/python benchmarks/audit_cost_bench.py [--rollouts 64 --tokens 16384] [--params-gb 1.0]

Figures per million trained tokens and per GB of fp32 parameters, so they scale to other sizes.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from lego_rl.train.audit import fingerprint, trained_tokens
from lego_rl.train.batching import OptimizerStep, plan_steps
from lego_rl.trajectory.sample import Sample

VOCAB = 151_936
HIDDEN = 1024


def make_step(rollouts: int, tokens: int, seed: int = 0) -> OptimizerStep:
    """``rollouts`` rollouts of ``tokens`` tokens each, a quarter prompt (mask 0) and the rest trained in runs
    broken by tool outputs (mask 0), as an agent's multi-turn rollout is; one micro-batch per rollout."""
    rng = random.Random(seed)
    samples, advantages = [], []
    for r in range(rollouts):
        mask = [0] * (tokens // 4)
        while len(mask) < tokens:
            mask += [1] * rng.randint(200, 2000) + [0] * rng.randint(100, 1000)
        mask = mask[:tokens]
        samples.append(Sample(rollout_id=f"r{r}", group_index=r // 8, index=r % 8, segment=0, num_segments=1,
                              tokens=[rng.randrange(VOCAB) for _ in range(tokens)], loss_mask=mask,
                              rollout_logprobs=[-rng.random() * m for m in mask]))
        advantages.append(rng.choice([-1.0, -0.5, 0.5, 1.0]))
    (step,) = plan_steps(samples, advantages, max_tokens_per_micro_batch=tokens)
    return step


def timed(fn: Callable[[], Any], repeat: int = 3) -> tuple[float, Any]:
    best, value = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - start)
    return best, value


def tokens_part(rollouts: int, tokens: int) -> None:
    step = make_step(rollouts, tokens)
    trained = sum(int(mb.loss_mask.sum()) for mb in step.micro_batches)
    per_m = 1e6 / trained
    t_extract, record = timed(lambda: trained_tokens(step), repeat=2)
    t_json, line = timed(lambda: json.dumps({"tokens": record}, allow_nan=True), repeat=2)

    def floor() -> str:
        ids = [i for mb in step.micro_batches for i, m in zip(mb.input_ids.tolist(), mb.loss_mask.tolist()) if m]
        lps = [x for mb in step.micro_batches for x, m in zip(mb.rollout_logprobs.tolist(), mb.loss_mask.tolist())
               if m]
        return json.dumps({"ids": ids, "logprobs": lps})

    t_floor, floor_line = timed(floor, repeat=2)
    print(f"trained tokens: {rollouts} rollouts x {tokens} tokens, {trained:,} trained")
    print("| part | s per step | s per M trained tokens | vs baseline |")
    print("|---|---|---|---|")
    print(f"| baseline: json of the flat ids + logprobs | {t_floor:.2f} | {t_floor * per_m:.2f} | 1.0x |")
    print(f"| trained_tokens (runs, advantages) | {t_extract:.2f} | {t_extract * per_m:.2f} | "
          f"{t_extract / t_floor:.1f}x |")
    print(f"| json.dumps of the record | {t_json:.2f} | {t_json * per_m:.2f} | {t_json / t_floor:.1f}x |")
    print(f"| record line | {len(line) / 2**20:.0f} MiB | {len(line) / 2**20 * per_m:.0f} MiB per M | "
          f"{len(line) / len(floor_line):.2f}x the flat json |")


def make_params(gb: float) -> list[tuple[str, torch.Tensor]]:
    """fp32 tensors totalling ``gb``: one embedding-sized matrix (the largest tensor of a real model), the rest
    in square layers."""
    params = [("embed", torch.randn(VOCAB, HIDDEN))]
    left = int(gb * 2**30 / 4) - VOCAB * HIDDEN
    i = 0
    while left > 0:
        n = min(left, 4 * HIDDEN * HIDDEN)
        params.append((f"layer{i}", torch.randn(n)))
        left -= n
        i += 1
    return params


def params_part(gb: float) -> None:
    params = make_params(gb)
    t_base, _ = timed(lambda: [p.sum() for _, p in params])
    t_fp, _ = timed(lambda: fingerprint(iter(params)))
    print(f"fingerprint: {gb:.2f} GB of fp32 parameters in {len(params)} tensors (largest {VOCAB}x{HIDDEN})")
    print("| part | s | s per GB | vs baseline |")
    print("|---|---|---|---|")
    print(f"| baseline: fp32 sum() of every tensor | {t_base:.3f} | {t_base / gb:.3f} | 1.0x |")
    print(f"| fingerprint (float64 sum, sum of squares) | {t_fp:.3f} | {t_fp / gb:.3f} | {t_fp / t_base:.1f}x |")
    peak = json.loads(subprocess.run([sys.executable, __file__, "--child-peak", str(gb)], capture_output=True,
                                     text=True, check=True).stdout)
    print(f"| transient memory of one fingerprint | {peak['fingerprint_mb']:.0f} MB | | largest tensor "
          f"{VOCAB * HIDDEN * 4 / 2**20:.0f} MB fp32; plain sum() {peak['sum_mb']:.0f} MB |")


def child_peak(gb: float) -> None:
    """In a fresh process: the rise of the resident high-water mark over the parameters themselves, first for the
    plain sums, then for a fingerprint."""
    params = make_params(gb)

    def hwm() -> float:
        # VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so a child would report its parent's peak.
        line = next(x for x in open("/proc/self/status") if x.startswith("VmHWM:"))
        return int(line.split()[1]) / 1024  # MB

    start = hwm()
    [p.sum() for _, p in params]
    after_sum = hwm()
    fingerprint(iter(params))
    print(json.dumps({"sum_mb": after_sum - start, "fingerprint_mb": hwm() - after_sum}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=16384, help="tokens per rollout")
    parser.add_argument("--params-gb", type=float, default=1.0)
    parser.add_argument("--child-peak", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_peak is not None:
        child_peak(args.child_peak)
        return
    torch.set_num_threads(1)
    tokens_part(args.rollouts, args.tokens)
    params_part(args.params_gb)


if __name__ == "__main__":
    main()
