"""Qwen3-MoE training step on GPU: the Megatron backend against the torch backend, free routing and R3 replay.

A random-init Qwen3-MoE (``--layers``, hidden 1024, 16 heads / 4 KV, ``--experts`` experts top-``--topk``,
expert FFN 768, the real 151,936 vocab) and one packed GRPO step of ``--micro-batches`` × ``--mb-tokens``
tokens (segments of 2,048). Per backend and routing mode: the old-logprob pass and ``train_step`` timed (one
warm-up step first), tokens/s, model FLOP/s = 6·N_active·tokens / step time (N_active: the parameters one
token passes through, top-k experts of each layer), peak memory. Baseline in the same run: the torch backend
(HF ``Qwen3MoeForCausalLM`` under bf16 autocast) on the same weights and tokens.

    python3 benchmarks/megatron_moe_bench.py [--layers 8] [--experts 32] [--topk 4]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from lego_rl.train.batching import OptimizerStep, plan_steps
from lego_rl.train.losses import LossConfig, make_loss
from lego_rl.trajectory.sample import Sample

VOCAB = 151936


def write_model(out: Path, layers: int, experts: int, topk: int) -> dict[str, Any]:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=1024, intermediate_size=3072, moe_intermediate_size=768,
                         num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                         num_experts=experts, num_experts_per_tok=topk, norm_topk_prob=True,
                         tie_word_embeddings=True, initializer_range=0.02, max_position_embeddings=32768)
    with torch.device("cuda"):
        model = Qwen3MoeForCausalLM(cfg)
    model.to(torch.bfloat16).save_pretrained(str(out), safe_serialization=True)
    del model
    attn = 1024 * 64 * (2 * 16 + 2 * 4)
    active = layers * (attn + topk * 3 * 1024 * 768 + experts * 1024) + VOCAB * 1024
    return {"n_active": active}


def synthetic_step(micro_batches: int, mb_tokens: int, experts: int, layers: int, topk: int) -> OptimizerStep:
    rng = random.Random(0)
    samples, adv = [], []
    seg = 2048
    for r in range(micro_batches * mb_tokens // seg):
        toks = [rng.randrange(VOCAB) for _ in range(seg)]
        routes = [[rng.sample(range(experts), topk) for _ in range(layers)] for _ in range(seg - 1)] + [[]]
        samples.append(Sample(rollout_id=f"r{r}", group_index=r // 2, index=r % 2, tokens=toks,
                              loss_mask=[0] * 256 + [1] * (seg - 256),
                              rollout_logprobs=[0.0] * 256 + [-rng.uniform(0.5, 8.0) for _ in range(seg - 256)],
                              routed_experts=routes))
        adv.append([1.0, -1.0][r % 2])
    (step,) = plan_steps(samples, adv, max_tokens_per_micro_batch=mb_tokens)
    return step


def timed(fn: Any) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def run(kind: str, model: Path, step: OptimizerStep, replay: bool) -> dict[str, float]:
    if kind == "megatron":
        from lego_rl.train.megatron_backend import MegatronBackend, MegatronTrainSettings

        backend: Any = MegatronBackend(model, MegatronTrainSettings(lr=1e-5, device="cuda", routing_replay=replay))
    else:
        from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings

        backend = TorchBackend(model, TorchTrainSettings(lr=1e-5, device="cuda", routing_replay=replay))
    loss = make_loss(LossConfig())
    torch.cuda.reset_peak_memory_stats()
    old: list[torch.Tensor] = []
    t_old = timed(lambda: old.extend(backend.compute_logprobs(step.micro_batches, temperature=1.0)))
    backend.train_step(step, loss, old_logprobs=old, temperature=1.0)  # warm-up
    t_step = timed(lambda: backend.train_step(step, loss, old_logprobs=old, temperature=1.0))
    out = {"old_logprobs_s": t_old, "train_step_s": t_step,
           "peak_gib": torch.cuda.max_memory_allocated() / 2**30}
    del backend
    gc.collect()
    torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--micro-batches", type=int, default=2)
    ap.add_argument("--mb-tokens", type=int, default=8192)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "qwen3-moe"
        info = write_model(model, args.layers, args.experts, args.topk)
        step = synthetic_step(args.micro_batches, args.mb_tokens, args.experts, args.layers, args.topk)
        tokens = sum(mb.num_tokens for mb in step.micro_batches)
        rows = {}
        for kind in ("torch", "megatron"):
            for replay in (False, True):
                r = run(kind, model, step, replay)
                r["tokens_per_s"] = tokens / r["train_step_s"]
                r["tflops"] = 6 * info["n_active"] * tokens / r["train_step_s"] / 1e12
                rows[f"{kind}{'+r3' if replay else ''}"] = r
                print(json.dumps({"backend": kind, "replay": replay, **{k: round(v, 3) for k, v in r.items()}}),
                      flush=True)
        base = rows["torch"]["train_step_s"]
        print(f"{args.layers} layers, {args.experts} experts top-{args.topk}, N_active "
              f"{info['n_active'] / 1e6:.0f}M, {tokens} tokens/step")
        for name, r in rows.items():
            print(f"{name:>12}: old {r['old_logprobs_s']:.2f} s  step {r['train_step_s']:.2f} s  "
                  f"{r['tokens_per_s']:,.0f} tok/s  {r['tflops']:.1f} TFLOP/s  peak {r['peak_gib']:.1f} GiB  "
                  f"step vs torch {base / r['train_step_s']:.2f}x")


if __name__ == "__main__":
    main()
