"""FSDP2 data parallelism of the torch backend over the GPUs of one host, against one GPU in the same run.

    python3 benchmarks/fsdp_step_bench.py --gpus 2            # on nvidia-h200-x2: the baseline, then torchrun

The same optimizer step (random-init Qwen3-0.6B shape, ``--rollouts`` rollouts of two segments, bf16 autocast,
chunked head logprobs, GRPO) runs first in one process on GPU 0 (the baseline), then under ``torchrun
--nproc-per-node GPUS`` where rank 0 drives the backend through ``RankZeroBackend`` and the others follow
(``train.distributed``), as ``lego train`` does. Prints seconds per step (old logprobs + forward/backward +
AdamW), tokens/s, MFU per GPU against 790 TFLOP/s (6 · params · tokens), peak memory per GPU, the step's loss in
both (must agree) and the largest weight difference after the step (bf16 noise).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_backend_bench import H200_BF16_FLOPS, build_model, samples  # noqa: E402

from lego_rl.train.batching import plan_steps  # noqa: E402
from lego_rl.train.losses import LossConfig, make_loss  # noqa: E402
from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings  # noqa: E402


def run(model: Path, out: Path, rollouts: int, repeats: int) -> None:
    """One process's part (world 1, or a rank under torchrun)."""
    import torch.distributed as dist

    from lego_rl.train.distributed import RankZeroBackend, follow_rank_zero

    if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
    inner = TorchBackend(model, TorchTrainSettings(lr=1e-5, device="cuda", logprob_chunk_tokens=1024))
    if inner.rank != 0:
        follow_rank_zero(inner)
        dist.destroy_process_group()
        return
    backend = RankZeroBackend(inner) if inner.world > 1 else inner
    data, adv = samples(rollouts, 2, int(inner.config.vocab_size), (512, 1024), (256, 1024))
    (step,) = plan_steps(data, adv, max_tokens_per_micro_batch=16384)
    tokens = sum(mb.num_tokens for mb in step.micro_batches)
    loss_fn = make_loss(LossConfig())
    times, losses = [], []
    for _ in range(repeats + 1):  # the first is warm-up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        old = backend.compute_logprobs(step.micro_batches, temperature=1.0)
        losses.append(backend.train_step(step, loss_fn, old_logprobs=old, temperature=1.0).metrics["loss"])
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    weights = {n: t.float().cpu() for n, t in backend.export_weights()}
    if isinstance(backend, RankZeroBackend):
        backend.stop()
    n_params = sum(t.numel() for t in weights.values())
    torch.save({"times": times[1:], "losses": losses, "tokens": tokens, "world": inner.world,
                "micro_batches": len(step.micro_batches), "params": n_params,
                "peak_gib": torch.cuda.max_memory_allocated() / 2**30, "weights": weights}, out)
    if inner.world > 1:
        dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--rollouts", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rank-of", nargs=2, metavar=("MODEL", "OUT"))
    a = ap.parse_args()
    if a.rank_of:
        run(Path(a.rank_of[0]), Path(a.rank_of[1]), a.rollouts, a.repeats)
        return
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        model = build_model("qwen3-0.6b", tmp / "model")
        common = ["--rollouts", str(a.rollouts), "--repeats", str(a.repeats)]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0"}
        subprocess.run([sys.executable, __file__, *common, "--rank-of", str(model), str(tmp / "one.pt")], check=True,
                       env=env)
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={a.gpus}",
                        __file__, *common, "--rank-of", str(model), str(tmp / "dp.pt")], check=True)
        one, dp = torch.load(tmp / "one.pt"), torch.load(tmp / "dp.pt")
        diff = max(float((one["weights"][k] - dp["weights"][k]).abs().max()) for k in one["weights"])
        print(f"step: {one['tokens']} tokens in {one['micro_batches']} micro-batches, {one['params'] / 1e6:.1f}M params")
        for name, r in (("1 GPU", one), (f"FSDP2 x{dp['world']}", dp)):
            s = sum(r["times"]) / len(r["times"])
            per_gpu = 6 * r["params"] * r["tokens"] / s / r["world"] / H200_BF16_FLOPS
            print(json.dumps({"run": name, "s_per_step": round(s, 3), "tokens_per_s": round(r["tokens"] / s),
                              "mfu_per_gpu_pct": round(100 * per_gpu, 2), "peak_gib_rank0": round(r["peak_gib"], 1),
                              "losses": [round(x, 6) for x in r["losses"]]}))
        print(f"speed-up x{sum(one['times']) / sum(dp['times']):.2f}; max |weight diff| after "
              f"{a.repeats + 1} steps: {diff:.3g}")


if __name__ == "__main__":
    main()
