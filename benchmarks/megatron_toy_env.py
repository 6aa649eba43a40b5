"""`lego train` on the built-in `first_letter` environment with ``train.backend = "megatron"``, end to end.

The product path, nothing replaced: ``lego train`` (config checks, ``train_session.BACKENDS["megatron"]``), the
embedded engine serving the tiny model (bf16 on CUDA), the Megatron backend training it, in-place weight sync
after every step, checkpoints. Prints the reward per step from ``metrics.jsonl``; the first step's reward (the
untrained policy, measured in the same run) is the baseline.

    python3 benchmarks/megatron_toy_env.py --steps 6
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.toy_run import write_toy_run  # noqa: E402

from lego_rl.runstore import follow_metrics  # noqa: E402
from lego_rl.runstore import metric_catalog as mc  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--lr", type=float, default=1e-2)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="megatron-toy-"))
    # The engine on its default device (bf16 on CUDA), 4 groups of 8, four-token answers.
    write_toy_run(work, rows=64, model={"checkpoint": "lego:tiny"}, serving={"device": None},
                  rollout={"batch_size": 4, "samples_per_prompt": 8},
                  train={"backend": "megatron", "environment_options": {"max_tokens": 4}, "num_rollout": args.steps,
                         "lr": args.lr, "max_grad_norm": 10.0})
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", "from lego_rl.cli.main import main; main()", "train", "-c",
                           "lego.toml", "--json"], cwd=work, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-6000:], sep="\n")
        raise SystemExit(f"lego train exited {proc.returncode}")
    rows = list(follow_metrics(work / "runs/toy/metrics.jsonl").read())
    rewards = [mc.require(r.values, mc.REWARD_MEAN) for r in rows]
    print(f"lego train (megatron backend): {len(rows)} steps in {wall:.0f} s, summary {proc.stdout.strip()}")
    print("| step | reward_mean | trained | grad_norm | time_train_s | time_sync_s |")
    print("|---|---|---|---|---|---|")
    for r, reward in zip(rows, rewards, strict=True):
        v = r.values
        grad_norm = mc.read(v, mc.GRAD_NORM)
        print(f"| {r.step} | {reward:.3f} | {mc.read(v, mc.TRAINED) or 0} | "
              f"{float('nan') if grad_norm is None else grad_norm:.3f} | {mc.read(v, mc.TIME_TRAIN_S) or 0:.2f} | "
              f"{mc.read(v, mc.TIME_SYNC_S) or 0:.2f} |")
    print(json.dumps({"part": "toy_env", "rewards": rewards, "wall_s": wall,
                      "last3_mean": sum(rewards[-3:]) / len(rewards[-3:])}))


if __name__ == "__main__":
    main()
