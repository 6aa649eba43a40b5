"""The torch trainer on one long rollout: a single 64k-token (and 128k-token) segment against the same number
of tokens packed as 4k-token segments, measured in the same run (the baseline). Qwen3-0.6B shape, random
init, bf16 autocast, gradient checkpointing, varlen flash attention (the CUDA default), one H200.

A coding agent's late turns carry a 30k-64k-token history; the trainer must take such a rollout whole, in
one micro-batch (a segment is never split: its tokens attend to all earlier ones). What it costs: attention
grows with the square of the segment, everything else with its length, so per-token throughput falls, and
memory must hold one 64k-token forward (the head is chunked: ``train.logprob_chunk_tokens``).

    python benchmarks/gpu_long_context_bench.py                 # 64k and 128k vs 16 x 4k / 32 x 4k
    python benchmarks/gpu_long_context_bench.py --lengths 65536 --no-checkpointing

Prints per case: seconds per optimizer step (old logprobs + one step), tokens/s, the ratio to the packed
baseline of the same token count, peak GPU memory, and model FLOP/s utilisation against the H200's
790 TFLOP/s bf16 ceiling, both without attention (6 · params · tokens) and with causal attention's
matmuls (+ 6 · layers · heads · head_dim · Σ len² for forward and backward; the recomputed forward of
checkpointing not counted). An out-of-memory case is printed as such, not hidden.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from lego_rl.errors import TrainerOutOfMemory
from lego_rl.train.batching import OptimizerStep, plan_steps
from lego_rl.train.losses import LossConfig, make_loss
from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings
from lego_rl.trajectory.sample import Sample

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_backend_bench import H200_BF16_FLOPS, QWEN3_06B  # noqa: E402

BASE_SEGMENT = 4096
TRAINED_SHARE = 1 / 16
"""The last sixteenth of every segment is trained (the policy's answer), the rest is context: an agent's turn."""


def rollouts(lengths: list[int], vocab: int, seed: int) -> tuple[list[Sample], list[float]]:
    """One single-segment rollout per entry of ``lengths``; advantages alternate in sign."""
    rng = random.Random(seed)
    out, adv = [], []
    for r, n in enumerate(lengths):
        t = max(1, int(n * TRAINED_SHARE))
        out.append(Sample(rollout_id=f"r{r}", group_index=r // 4, index=r % 4, segment=0, num_segments=1,
                          tokens=[rng.randrange(vocab) for _ in range(n)], loss_mask=[0] * (n - t) + [1] * t,
                          rollout_logprobs=[0.0] * (n - t) + [-2.0] * t))  # fmt: skip
        adv.append(1.0 if r % 2 == 0 else -1.0)
    return out, adv


def one_step(lengths: list[int], vocab: int, micro_batch_tokens: int) -> OptimizerStep:
    data, adv = rollouts(lengths, vocab, seed=len(lengths))
    (step,) = plan_steps(data, adv, max_tokens_per_micro_batch=micro_batch_tokens)
    return step


def timed(backend: TorchBackend, step: OptimizerStep, repeats: int) -> tuple[float, float]:
    """(seconds per step, peak GiB): old logprobs, then one optimizer step, after one warm-up step."""
    loss_fn = make_loss(LossConfig())

    def run() -> None:
        old = backend.compute_logprobs(step.micro_batches, temperature=1.0)
        backend.train_step(step, loss_fn, old_logprobs=old, temperature=1.0)

    run()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(repeats):
        run()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / repeats, torch.cuda.max_memory_allocated() / 2**30


def flops(n_params: int, lengths: list[int], cfg: Any) -> tuple[float, float]:
    """(dense FLOPs, attention FLOPs) of one forward+backward over single-segment rollouts of ``lengths``."""
    dense = 6.0 * n_params * sum(lengths)
    # QK^T and PV: 2 matmuls x 2 FLOPs x len^2/2 (causal) x head_dim per head and layer, x3 for fwd + bwd.
    attn = 6.0 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * sum(n * n for n in lengths)
    return dense, attn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="65536,131072", help="long segment lengths, comma-separated")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--no-checkpointing", action="store_true", help="gradient checkpointing off")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs CUDA: run it on the lent H200 (benchmarks/RESULTS.md says how)")
    from transformers import Qwen3Config, Qwen3ForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        shape = {**QWEN3_06B, "max_position_embeddings": 131072}  # room for the 128k-token segment
        Qwen3ForCausalLM(Qwen3Config(**shape)).save_pretrained(f"{tmp}/model", safe_serialization=True)
        settings = TorchTrainSettings(lr=1e-6, device="cuda", gradient_checkpointing=not args.no_checkpointing)
        backend = TorchBackend(Path(f"{tmp}/model"), settings)
        cfg = backend.config
        n_params = sum(p.numel() for p in backend.model.parameters())
        print(f"Qwen3-0.6B shape ({n_params / 1e6:.0f}M params), {torch.cuda.get_device_name()}, attention "
              f"{'varlen' if backend._varlen else 'sdpa'}, gradient checkpointing {settings.gradient_checkpointing}, "
              f"torch {torch.__version__}")  # fmt: skip
        print(f"| case | tokens | s/step | tokens/s | vs packed {BASE_SEGMENT} | peak GiB | MFU dense | "
              "MFU +attention |")
        print("|---|---|---|---|---|---|---|---|")
        for n in (int(x) for x in args.lengths.split(",")):
            packed = [BASE_SEGMENT] * (n // BASE_SEGMENT)
            cases = [(f"{len(packed)} x {BASE_SEGMENT}", packed), (f"1 x {n}", [n])]
            base_tps = None
            for name, lengths in cases:
                step = one_step(lengths, int(cfg.vocab_size), micro_batch_tokens=n)
                try:
                    s, mem = timed(backend, step, args.repeats)
                except TrainerOutOfMemory as exc:  # a finding of the benchmark, not its failure
                    print(f"| {name} | {sum(lengths)} | out of memory: {str(exc)[:160]} |")
                    s = 0.0
                # Outside the except block: while it runs, the exception (and the failed step's frames and
                # activations, in traceback cycles) is still alive.
                gc.collect()
                torch.cuda.empty_cache()
                if not s:
                    continue
                tps = sum(lengths) / s
                base_tps = base_tps or tps
                dense, attn = flops(n_params, lengths, cfg)
                mfu, mfu_attn = dense / s / H200_BF16_FLOPS, (dense + attn) / s / H200_BF16_FLOPS
                print(f"| {name} | {sum(lengths)} | {s:.2f} | {tps:,.0f} | {tps / base_tps:.2f}x | {mem:.1f} | "
                      f"{mfu:.1%} | {mfu_attn:.1%} |", flush=True)


if __name__ == "__main__":
    main()
