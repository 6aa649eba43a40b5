"""Torch trainer backend: one optimizer step on packed micro-batches against the same step run one segment per
forward (the baseline, measured in the same run), plus, on CUDA, bf16-vs-fp32 logprob agreement and the cost of
gradient checkpointing.

    python benchmarks/train_backend_bench.py                      # tiny model, CPU
    python benchmarks/train_backend_bench.py --model qwen3-0.6b   # random-init Qwen3 0.6B shape, CUDA if present

Prints tokens/s of each variant, the packed/baseline ratio, the step's loss in both (they must agree: the same
tokens, weights and gradients), model FLOP/s utilisation against the H200's 790 TFLOP/s bf16 ceiling (6 · params
· tokens per step, attention FLOPs left out, so it is a lower bound), and the logprob agreement figures.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from lego_rl.serving.logprobs import teacher_forced_logprobs
from lego_rl.serving.tiny_model import ensure_tiny_model
from lego_rl.train.batching import MicroBatch, OptimizerStep, plan_steps
from lego_rl.train.losses import LossConfig, make_loss
from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings
from lego_rl.trajectory.sample import Sample

H200_BF16_FLOPS = 790e12

QWEN3_06B: dict[str, Any] = {
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}


QWEN3_4B: dict[str, Any] = {**QWEN3_06B, "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                             "num_attention_heads": 32, "num_key_value_heads": 8}
"""Qwen3-4B's shape (tied embeddings, as the released model)."""


def build_model(name: str, out: Path) -> Path:
    if name == "tiny":
        return ensure_tiny_model()
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    if name == "qwen3-4b":
        # 4B parameters: initialised on the GPU (minutes on the CPU) and saved in bf16 (8 GB).
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
            model = Qwen3ForCausalLM(Qwen3Config(**QWEN3_4B)).bfloat16()
    else:
        model = Qwen3ForCausalLM(Qwen3Config(**QWEN3_06B))
    model.save_pretrained(str(out), safe_serialization=True)
    del model
    return out


def samples(
    n_rollouts: int,
    segments: int,
    vocab: int,
    context: tuple[int, int],
    trained: tuple[int, int],
    seed: int = 0,
) -> tuple[list[Sample], list[float]]:
    rng = random.Random(seed)
    out, adv = [], []
    for r in range(n_rollouts):
        for s in range(segments):
            c, t = rng.randint(*context), rng.randint(*trained)
            out.append(
                Sample(
                    rollout_id=f"r{r}",
                    group_index=r // 4,
                    index=r % 4,
                    segment=s,
                    num_segments=segments,
                    tokens=[rng.randrange(vocab) for _ in range(c + t)],
                    loss_mask=[0] * c + [1] * t,
                    rollout_logprobs=[0.0] * c + [-1.0] * t,
                )
            )
            adv.append([1.0, -0.5][r % 2])
    return out, adv


def per_segment(step: OptimizerStep) -> OptimizerStep:
    """The same step with every segment in its own micro-batch: the baseline of one forward per segment."""
    out = OptimizerStep(rollout_ids=step.rollout_ids, rollout_token_counts=step.rollout_token_counts)
    for mb in step.micro_batches:
        cu = mb.cu_seqlens.tolist()
        for k, i in enumerate(mb.sample_indices):
            sl = slice(cu[k], cu[k + 1])
            out.micro_batches.append(
                MicroBatch(
                    input_ids=mb.input_ids[sl],
                    position_ids=mb.position_ids[sl],
                    cu_seqlens=torch.tensor([0, cu[k + 1] - cu[k]], dtype=torch.int32),
                    loss_mask=mb.loss_mask[sl],
                    rollout_logprobs=mb.rollout_logprobs[sl],
                    advantages=mb.advantages[sl],
                    token_weights=mb.token_weights[sl],
                    rollout_slots=mb.rollout_slots[sl],
                    sample_indices=[i],
                )
            )
    return out


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed_steps(backend: TorchBackend, step: OptimizerStep, repeats: int) -> tuple[float, float]:
    """(seconds per step, loss of the last step): old logprobs + one optimizer step each time."""
    loss_fn = make_loss(LossConfig())
    loss = 0.0
    sync(backend.device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        old = backend.compute_logprobs(step.micro_batches, temperature=1.0)
        loss = backend.train_step(step, loss_fn, old_logprobs=old, temperature=1.0).metrics["loss"]
    sync(backend.device)
    return (time.perf_counter() - t0) / repeats, loss


def agreement(backend: TorchBackend, step: OptimizerStep, data: list[Sample]) -> dict[str, float]:
    """Packed bf16-autocast logprobs against an fp32 forward of each segment alone (no TF32), trained tokens."""
    torch.backends.cuda.matmul.allow_tf32 = False
    packed = backend.compute_logprobs(step.micro_batches, temperature=1.0)
    a, b = [], []
    for mb, lp in zip(step.micro_batches, packed, strict=True):
        cu = mb.cu_seqlens.tolist()
        for k, i in enumerate(mb.sample_indices):
            ref = teacher_forced_logprobs(backend.model, data[i].tokens, 1, 1.0)  # [n-1] fp32, no autocast
            m = mb.loss_mask[cu[k] + 1 : cu[k + 1]].bool()  # [n-1]
            a.append(lp[cu[k] + 1 : cu[k + 1]][m])
            b.append(ref[m])
    x, y = torch.cat(a).double(), torch.cat(b).double()  # [N], [N]
    d = (x - y).abs()  # [N]
    return {
        "pearson": float(torch.corrcoef(torch.stack([x, y]))[0, 1]),
        "mean_abs": float(d.mean()),
        "p99_abs": float(d.quantile(0.99)),
        "max_abs": float(d.max()),
        "tokens": float(d.numel()),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["tiny", "qwen3-0.6b"], default="tiny")
    p.add_argument("--device", default=None)
    p.add_argument("--rollouts", type=int, default=None)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    big = args.model != "tiny"
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(args.model, Path(tmp) / "model")
        backend = TorchBackend(model_dir, TorchTrainSettings(lr=1e-6, device=args.device))
        vocab = int(backend.config.vocab_size)
        n_params = sum(p.numel() for p in backend.model.parameters())
        rollouts = args.rollouts or (32 if big else 8)
        data, adv = samples(
            rollouts, 2, vocab, (200, 1500) if big else (20, 120), (50, 500) if big else (5, 40)
        )
        (step,) = plan_steps(data, adv, max_tokens_per_micro_batch=8192 if big else 1024)
        base = per_segment(step)
        tokens = sum(mb.num_tokens for mb in step.micro_batches)
        print(
            f"model {args.model} ({n_params / 1e6:.1f}M params) on {backend.device}; {len(data)} segments, "
            f"{tokens} tokens; packed {len(step.micro_batches)} micro-batches vs {len(base.micro_batches)}"
        )
        timed_steps(backend, step, 1)  # warm-up (allocator, kernels)
        t_packed, loss_packed = timed_steps(backend, step, args.repeats)
        t_base, loss_base = timed_steps(backend, base, args.repeats)
        for name, t in (("packed", t_packed), ("per-segment", t_base)):
            mfu = 6 * n_params * tokens / t / H200_BF16_FLOPS  # only meaningful on the H200
            extra = f"  MFU(H200 bf16) {mfu:6.2%}" if backend.device.type == "cuda" else ""
            print(f"{name:12s} {t:8.3f} s/step  {tokens / t:10.0f} tokens/s{extra}")
        print(
            f"packed / per-segment throughput: {t_base / t_packed:.2f}x; loss {loss_packed:.6f} vs {loss_base:.6f}"
        )
        if backend.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            timed_steps(backend, step, 1)
            mem = torch.cuda.max_memory_allocated() / 2**30
            ckpt = TorchBackend(
                model_dir, TorchTrainSettings(lr=1e-6, device=args.device, gradient_checkpointing=True)
            )
            del backend
            torch.cuda.empty_cache()
            timed_steps(ckpt, step, 1)
            torch.cuda.reset_peak_memory_stats()
            t_ckpt, _ = timed_steps(ckpt, step, args.repeats)
            mem_ckpt = torch.cuda.max_memory_allocated() / 2**30
            print(
                f"gradient checkpointing: {t_ckpt / t_packed:.2f}x step time, peak memory {mem_ckpt:.1f} GiB vs "
                f"{mem:.1f} GiB"
            )
            stats = agreement(ckpt, step, data)
            print("bf16 packed vs fp32 per segment: " + ", ".join(f"{k} {v:.6g}" for k, v in stats.items()))


if __name__ == "__main__":
    main()
