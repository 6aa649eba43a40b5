"""The Megatron backend on GPU: parity with the torch backend, one training step, and model FLOP/s per GPU.

Parts (``--parts``, comma-separated), each printing a table row and a JSON line:

* ``parity`` — random-init Qwen3-architecture model (8 layers, hidden 1024, the real 151,936 vocab), packed
  micro-batches of several segments. fp32: the Megatron backend with ``bf16=False`` against the engine
  convention's reference, ``serving.logprobs.teacher_forced_logprobs`` on the HF model one segment at a time
  (max |Δ|, target < 1e-4). bf16: the Megatron backend against the torch backend, both under bf16 autocast
  (Pearson, target ≥ 0.9999), untruncated and at top_p 0.95.
* ``step`` — one GRPO step from the same weights with both backends (bf16): relative L2 distance between
  the two weight updates, grad-norm ratio, logprobs after the step.
* ``throughput`` — ``train_step`` time on packed micro-batches (old logprobs timed separately) for
  Qwen3-architecture shapes; model FLOP/s per GPU = 6·N·tokens / time / GPUs (attention FLOPs left out,
  N = parameters, tied embedding once). Baseline in the same run: megatron-core's stock local spec
  (``DotProductAttention``: unfused, ``[b, h, s, s]`` scores, one causal sequence per row) on the same model,
  the same tokens as ``[b, s]`` rows, the same precision recipe and AdamW — the spec the 124 TFLOP/s figure in
  FIELD-NOTES was measured with.

Single GPU: ``python3 benchmarks/megatron_backend_bench.py --parts parity,step,throughput``; tensor parallel:
``torchrun --nproc-per-node 2 benchmarks/megatron_backend_bench.py --parts parity,throughput --tp 2``; pipeline
parallel: ``torchrun --nproc-per-node 2 ... --parts throughput --pp 2`` (TP × PP processes; the local-spec
baseline has no pipeline and is skipped, so compare with a ``--tp 2`` run on the same GPUs; fp32 parity of
PP is ``tests/train/test_megatron_backend.py``'s). CPU dry run of PP 2 (gloo, ``tiny-cpu``):
``--parts throughput --pp 2 --sizes tiny-cpu --mb-tokens 512 --tokens 2048 --seg-tokens 256 --steps 1``.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lego_rl.train.batching import OptimizerStep, plan_steps
from lego_rl.train.losses import LossConfig, make_loss
from lego_rl.train.megatron_convert import Qwen3Shape
from lego_rl.trajectory.sample import Sample

SHAPES: dict[str, dict[str, Any]] = {
    "parity-8x1024": dict(num_hidden_layers=8, hidden_size=1024, num_attention_heads=16, num_key_value_heads=8,
                          head_dim=64, intermediate_size=3072, tie_word_embeddings=True),
    "qwen3-0.6b": dict(num_hidden_layers=28, hidden_size=1024, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, intermediate_size=3072, tie_word_embeddings=True),
    "qwen3-1.7b": dict(num_hidden_layers=28, hidden_size=2048, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, intermediate_size=6144, tie_word_embeddings=True),
    "qwen3-4b": dict(num_hidden_layers=36, hidden_size=2560, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, intermediate_size=9728, tie_word_embeddings=True),
    "qwen3-8b": dict(num_hidden_layers=36, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, intermediate_size=12288, tie_word_embeddings=False),
    "tiny-cpu": dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=32, intermediate_size=256, tie_word_embeddings=True, vocab_size=1000),
}
"""Qwen3 release shapes (config.json of Qwen/Qwen3-*), random weights; ``tiny-cpu`` dry-runs this script."""

MB_TOKENS = {"qwen3-0.6b": 16384, "qwen3-1.7b": 16384, "qwen3-4b": 8192, "qwen3-8b": 8192}
"""Starting micro-batch size per shape (halved on out-of-memory, same tokens per step)."""
BF16_PEAK = 790e12
"""bf16 dense matmul rate measured on the lent H200 (FIELD-NOTES / the device README): the MFU denominator."""
LOCAL_SPEC_FIELD_NOTES = 124e12
"""megatron-core local spec, 537M GPT, TP=1, measured earlier on the same machine kind (FIELD-NOTES)."""


def rank0() -> bool:
    if dist.is_initialized():
        return dist.get_rank() == 0
    return os.environ.get("RANK", "0") == "0"  # under torchrun before the backend joins the group


def say(*parts: Any) -> None:
    if rank0():
        print(*parts, flush=True)


def write_random_qwen3(out: Path, name: str, *, seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> Path:
    """A servable HF directory (config.json + model.safetensors) of random weights; written by rank 0 only."""
    from safetensors.torch import save_file
    from transformers import Qwen3Config

    cfg = Qwen3Config(**{"vocab_size": 151936, "rms_norm_eps": 1e-6, "max_position_embeddings": 40960,
                         "rope_theta": 1e6, **SHAPES[name]})
    shape = Qwen3Shape.from_hf_config(cfg.to_dict())
    if rank0():
        out.mkdir(parents=True, exist_ok=True)
        cfg.dtype = "bfloat16" if dtype == torch.bfloat16 else "float32"
        cfg.save_pretrained(str(out))
        gen = torch.Generator(device="cuda" if torch.cuda.is_available() else "cpu").manual_seed(seed)
        dev = gen.device
        h, d = shape.hidden, shape.head_dim
        state: dict[str, torch.Tensor] = {}

        def rand(*dims: int, std: float = 0.02) -> torch.Tensor:
            return (torch.randn(*dims, generator=gen, device=dev) * std).to(dtype).cpu()

        def norm(n: int) -> torch.Tensor:
            return (1.0 + torch.randn(n, generator=gen, device=dev) * 0.1).to(dtype).cpu()

        state["model.embed_tokens.weight"] = rand(shape.vocab, h, std=0.05)
        if not shape.tied:
            state["lm_head.weight"] = rand(shape.vocab, h, std=0.05)
        state["model.norm.weight"] = norm(h)
        for i in range(shape.num_layers):
            p = f"model.layers.{i}."
            state[p + "self_attn.q_proj.weight"] = rand(shape.heads * d, h)
            state[p + "self_attn.k_proj.weight"] = rand(shape.kv_heads * d, h)
            state[p + "self_attn.v_proj.weight"] = rand(shape.kv_heads * d, h)
            state[p + "self_attn.o_proj.weight"] = rand(h, shape.heads * d)
            state[p + "self_attn.q_norm.weight"] = norm(d)
            state[p + "self_attn.k_norm.weight"] = norm(d)
            state[p + "input_layernorm.weight"] = norm(h)
            state[p + "post_attention_layernorm.weight"] = norm(h)
            state[p + "mlp.gate_proj.weight"] = rand(shape.ffn, h)
            state[p + "mlp.up_proj.weight"] = rand(shape.ffn, h)
            state[p + "mlp.down_proj.weight"] = rand(h, shape.ffn)
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    if dist.is_initialized():
        dist.barrier()
    return out


def synthetic_step(vocab: int, *, micro_batches: int, mb_tokens: int, seg_tokens: int, context: int,
                   seed: int = 0) -> OptimizerStep:
    """One optimizer step of ``micro_batches`` full micro-batches of ``mb_tokens`` tokens, segments of
    ``seg_tokens`` (``context`` masked tokens then trained ones), one rollout per segment, advantages ±1."""
    rng = random.Random(seed)
    per_mb = mb_tokens // seg_tokens
    samples, adv = [], []
    for r in range(micro_batches * per_mb):
        samples.append(Sample(
            rollout_id=f"r{r:04d}", group_index=r // 2, index=r % 2, segment=0, num_segments=1,
            tokens=[rng.randrange(vocab) for _ in range(seg_tokens)],
            loss_mask=[0] * context + [1] * (seg_tokens - context),
            rollout_logprobs=[0.0] * context + [-rng.uniform(0.5, 8.0) for _ in range(seg_tokens - context)]))
        adv.append(1.0 if r % 2 else -1.0)
    (step,) = plan_steps(samples, adv, max_tokens_per_micro_batch=mb_tokens)
    return step


def pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double() - a.double().mean(), b.double() - b.double().mean()
    return float((a * b).sum() / (a.norm() * b.norm()))


def trained(lps: list[torch.Tensor], step: OptimizerStep) -> torch.Tensor:
    """[N] the trained positions of every micro-batch, concatenated."""
    return torch.cat([lp[mb.loss_mask > 0] for lp, mb in zip(lps, step.micro_batches, strict=True)])


PP = 1
"""Pipeline stages of every backend this run builds (``--pp``)."""


def megatron(model: Path, tp: int, **kw: Any) -> Any:
    from lego_rl.train.megatron_backend import MegatronBackend, MegatronTrainSettings

    return MegatronBackend(model, MegatronTrainSettings(**{"lr": 1e-5, "tensor_parallel": tp,
                                                           "pipeline_parallel": PP, **kw}))


def part_parity(tmp: Path, tp: int, device: str) -> None:
    from lego_rl.serving.logprobs import teacher_forced_logprobs
    from lego_rl.serving.weights import load_model
    from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings

    name = "parity-8x1024" if device == "cuda" else "tiny-cpu"
    model = write_random_qwen3(tmp / name, name, dtype=torch.float32)
    vocab = Qwen3Shape.from_hf_config(json.loads((model / "config.json").read_text())).vocab
    step = synthetic_step(vocab, micro_batches=2, mb_tokens=2048, seg_tokens=512, context=128)
    fp32 = megatron(model, tp, device=device, bf16=False)
    mega_fp32 = fp32.compute_logprobs(step.micro_batches, temperature=1.0)
    mega_fp32_p = fp32.compute_logprobs(step.micro_batches, temperature=1.0, top_p=0.95)
    del fp32
    bf16 = megatron(model, tp, device=device)
    mega_bf16 = bf16.compute_logprobs(step.micro_batches, temperature=1.0)
    mega_bf16_p = bf16.compute_logprobs(step.micro_batches, temperature=1.0, top_p=0.95)
    del bf16
    if not rank0():
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    hf, _, _ = load_model(model, torch.device(device), "float32")
    ref, ref_p = [], []
    for mb in step.micro_batches:
        out, out_p = torch.zeros(mb.num_tokens), torch.zeros(mb.num_tokens)
        bounds = mb.cu_seqlens.tolist()
        for s, e in zip(bounds[:-1], bounds[1:], strict=True):
            ids = mb.input_ids[s:e]
            out[s + 1:e] = teacher_forced_logprobs(hf, ids, 1, 1.0).cpu()
            out_p[s + 1:e] = teacher_forced_logprobs(hf, ids, 1, 1.0, top_p=0.95).cpu()
        ref.append(out)
        ref_p.append(out_p)
    del hf
    torch_be = TorchBackend(model, TorchTrainSettings(lr=1e-5, device=device))
    tb = torch_be.compute_logprobs(step.micro_batches, temperature=1.0)
    tb_p = torch_be.compute_logprobs(step.micro_batches, temperature=1.0, top_p=0.95)
    rows = []
    for label, mine, theirs in (("fp32 vs HF fp32 per segment", mega_fp32, ref),
                                ("fp32 vs HF fp32 per segment, top_p 0.95", mega_fp32_p, ref_p),
                                ("bf16 vs torch backend bf16", mega_bf16, tb),
                                ("bf16 vs torch backend bf16, top_p 0.95", mega_bf16_p, tb_p),
                                ("bf16 vs HF fp32 per segment", mega_bf16, ref),
                                ("torch backend bf16 vs HF fp32 per segment (context)", tb, ref)):
        a, b = trained(mine, step), trained(theirs, step)
        d = (a - b).abs()
        rows.append({"part": "parity", "compare": label, "tp": tp, "tokens": int(a.numel()),
                     "pearson": round(pearson(a, b), 7), "mean_abs": float(d.mean()), "max_abs": float(d.max())})
    say("| compare | TP | tokens | Pearson | mean abs d | max abs d |")
    for r in rows:
        say(f"| {r['compare']} | {tp} | {r['tokens']} | {r['pearson']:.7f} | {r['mean_abs']:.2e} | "
            f"{r['max_abs']:.2e} |")
    for r in rows:
        say(json.dumps(r))


def part_step(tmp: Path, device: str) -> None:
    from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings

    name = "parity-8x1024" if device == "cuda" else "tiny-cpu"
    model = write_random_qwen3(tmp / name, name, dtype=torch.float32)
    vocab = Qwen3Shape.from_hf_config(json.loads((model / "config.json").read_text())).vocab
    step = synthetic_step(vocab, micro_batches=2, mb_tokens=2048, seg_tokens=512, context=128, seed=1)
    loss = make_loss(LossConfig())
    results, moved, after = {}, {}, {}
    for label in ("megatron", "torch"):
        be = (megatron(model, 1, device=device, lr=1e-4) if label == "megatron"
              else TorchBackend(model, TorchTrainSettings(lr=1e-4, device=device)))
        before = {n: t.detach().float().cpu().clone() for n, t in be.export_weights()}
        old = be.compute_logprobs(step.micro_batches, temperature=1.0)
        results[label] = be.train_step(step, loss, old_logprobs=old, temperature=1.0).metrics
        moved[label] = {n: t.detach().float().cpu() - before[n] for n, t in be.export_weights()}
        after[label] = trained(be.compute_logprobs(step.micro_batches, temperature=1.0), step)
        del be
        if device == "cuda":
            torch.cuda.empty_cache()
    num = sum(float((moved["megatron"][n] - moved["torch"][n]).norm() ** 2) for n in moved["torch"])
    den = sum(float(moved["torch"][n].norm() ** 2) for n in moved["torch"])
    row = {"part": "step", "update_rel_l2": math.sqrt(num / den),
           "grad_norm_megatron": results["megatron"]["grad_norm"], "grad_norm_torch": results["torch"]["grad_norm"],
           "loss_megatron": results["megatron"]["loss"], "loss_torch": results["torch"]["loss"],
           "after_pearson": pearson(after["megatron"], after["torch"]),
           "after_mean_abs": float((after["megatron"] - after["torch"]).abs().mean())}
    say("| update rel L2 (megatron vs torch) | grad norm megatron / torch | logprobs after: Pearson | mean abs d |")
    say(f"| {row['update_rel_l2']:.4f} | {row['grad_norm_megatron']:.4f} / {row['grad_norm_torch']:.4f} | "
        f"{row['after_pearson']:.6f} | {row['after_mean_abs']:.2e} |")
    say(json.dumps(row))


def timed(fn: Any) -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def baseline_local_spec(shape: Qwen3Shape, tp: int, device: str, rows: int, seq: int, steps: int) -> float:
    """s/step of megatron-core's stock local spec on ``rows`` × ``seq`` tokens (see the module docstring)."""
    import torch.nn.functional as F
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy
    from megatron.core.transformer.transformer_config import TransformerConfig

    from lego_rl.train.megatron_convert import padded_vocab

    if device == "cuda":  # the stock spec initialises its weights on the GPU from Megatron's RNG tracker
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(1234)
    config = TransformerConfig(
        num_layers=shape.num_layers, hidden_size=shape.hidden, num_attention_heads=shape.heads,
        num_query_groups=shape.kv_heads, kv_channels=shape.head_dim, ffn_hidden_size=shape.ffn,
        normalization="RMSNorm", layernorm_epsilon=shape.norm_eps, gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, qk_layernorm=True, hidden_dropout=0.0, attention_dropout=0.0,
        tensor_model_parallel_size=tp, params_dtype=torch.float32, use_cpu_initialization=device == "cpu",
        bias_activation_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
        gradient_accumulation_fusion=False, bias_dropout_fusion=False, apply_rope_fusion=False)
    model = GPTModel(config, get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm"),
                     vocab_size=padded_vocab(shape.vocab, tp), max_sequence_length=seq,
                     share_embeddings_and_output_weights=shape.tied, position_embedding_type="rope",
                     rotary_base=int(shape.rope_theta)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device == "cuda")
    ids = torch.randint(0, shape.vocab, (rows, seq), device=device)
    pos = torch.arange(seq, device=device).expand(rows, seq)

    def one() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
            logits = model(ids, pos, attention_mask=None)  # [b, s, V/tp]
        loss = vocab_parallel_cross_entropy(logits.float().transpose(0, 1).contiguous(),
                                            ids.transpose(0, 1).contiguous()).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    from lego_rl.train.megatron_model import cpu_device_shim

    with cpu_device_shim(torch.device(device)):  # a CPU dry run needs megatron's RoPE shim too
        one()
        t = sum(timed(one) for _ in range(steps)) / steps
    del model, opt
    return t


def part_throughput(tmp: Path, tp: int, device: str, sizes: list[str], mb_tokens: int, micro_batches: int,
                    seg_tokens: int, steps: int, deadline: float, baseline: bool, recompute: bool) -> None:
    for name in sizes:
        if time.monotonic() > deadline:
            say(f"skipped {name}: out of time")
            continue
        be: Any = None
        old: list[torch.Tensor] | None = None
        retry = False
        try:
            model = write_random_qwen3(tmp / name, name)
            shape = Qwen3Shape.from_hf_config(json.loads((model / "config.json").read_text()))
            be = megatron(model, tp, device=device, gradient_checkpointing=recompute)
            world = dist.get_world_size() if dist.is_initialized() else 1  # the backend joined the group
            step = synthetic_step(shape.vocab, micro_batches=micro_batches, mb_tokens=mb_tokens,
                                  seg_tokens=min(seg_tokens, mb_tokens), context=seg_tokens // 8)
            tokens = sum(mb.num_tokens for mb in step.micro_batches)
            loss = make_loss(LossConfig())
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            old = []
            t_old = timed(lambda: old.extend(be.compute_logprobs(step.micro_batches, temperature=1.0)))
            be.train_step(step, loss, old_logprobs=old, temperature=1.0)  # warm-up (allocator, kernels)
            t_train = sum(timed(lambda: be.train_step(step, loss, old_logprobs=old, temperature=1.0))
                          for _ in range(steps)) / steps
            peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else 0.0
            n = shape.num_params()
            flops = 6 * n * tokens / t_train / world
            row = {"part": "throughput", "model": name, "params": n, "tp": tp, "pp": PP, "gpus": world,
                   "tokens": tokens,
                   "mb_tokens": mb_tokens,
                   "old_logprobs_s": t_old, "train_step_s": t_train, "tokens_per_s_per_gpu": tokens / t_train / world,
                   "tflops_per_gpu": flops / 1e12, "mfu": flops / BF16_PEAK, "peak_gib": peak,
                   "recompute": recompute}
            be = old = None
            if device == "cuda":
                torch.cuda.empty_cache()
            if baseline and PP == 1:  # the stock-spec baseline runs no pipeline
                rows = max(1, mb_tokens // seg_tokens)
                t_base = baseline_local_spec(shape, tp, device, rows, seg_tokens, steps)
                row["baseline_tflops_per_gpu"] = 6 * n * rows * seg_tokens / t_base / world / 1e12
                row["vs_baseline"] = row["tflops_per_gpu"] / row["baseline_tflops_per_gpu"]
                if device == "cuda":
                    torch.cuda.empty_cache()
            row["vs_field_notes_124"] = flops / LOCAL_SPEC_FIELD_NOTES
            say(f"| {name} | {n / 1e9:.2f}B | {tp} | {world} | {tokens} | {t_old:.2f} | {t_train:.2f} | "
                f"{row['tokens_per_s_per_gpu']:.0f} | {row['tflops_per_gpu']:.1f} | {100 * row['mfu']:.1f} % | "
                f"{peak:.1f} |")
            say(json.dumps(row))
        except torch.OutOfMemoryError as exc:
            say(f"{name}: out of memory at {mb_tokens} tokens per micro-batch ({str(exc)[:100]})")
            retry = mb_tokens > 2048 and time.monotonic() < deadline
        if retry:  # outside the except block: its traceback no longer pins the failed step's tensors
            be = old = None
            gc.collect()
            torch.cuda.empty_cache()
            part_throughput(tmp, tp, device, [name], mb_tokens // 2, micro_batches * 2, seg_tokens, steps,
                            deadline, baseline, recompute)


def main() -> None:
    warnings.filterwarnings("ignore")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="parity,step,throughput")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1, help="pipeline stages (train.pipeline_parallel)")
    ap.add_argument("--sizes", default="qwen3-0.6b,qwen3-1.7b,qwen3-4b")
    ap.add_argument("--mb-tokens", type=int, default=0, help="tokens per micro-batch (0: MB_TOKENS per size)")
    ap.add_argument("--tokens", type=int, default=65536, help="tokens per optimizer step")
    ap.add_argument("--seg-tokens", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--baseline-sizes", default="qwen3-0.6b", help="sizes that also run the local-spec baseline")
    ap.add_argument("--recompute", action="store_true")
    ap.add_argument("--budget-s", type=float, default=420.0, help="start no new size after this many seconds")
    ap.add_argument("--tmp", type=Path, default=None)
    args = ap.parse_args()
    global PP
    PP = args.pp
    device = "cuda" if torch.cuda.is_available() else "cpu"
    start = time.monotonic()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # every rank must read the files rank 0 writes
        tmp = args.tmp or Path(f"/tmp/mcore-bench-{os.environ.get('MASTER_PORT', '0')}")
    else:
        tmp = args.tmp or Path(tempfile.mkdtemp(prefix="mcore-bench-"))
    parts = args.parts.split(",")
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # join now: rank 0 writes the models, the others wait for it
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
    if device == "cuda":
        say(f"{time.strftime('%Y-%m-%d')} {torch.cuda.get_device_name()} ×{torch.cuda.device_count()}, torch "
            f"{torch.__version__}")
    if "parity" in parts:
        part_parity(tmp, args.tp, device)
    if "step" in parts and args.tp == 1 and args.pp == 1:
        part_step(tmp, device)
    if "throughput" in parts:
        sizes = args.sizes.split(",")
        base = set(args.baseline_sizes.split(","))
        say("| model | N | TP | GPUs | tokens/step | old logprobs s | train_step s | tokens/s/GPU | "
            "model TFLOP/s/GPU | MFU (790) | peak GiB |")
        for name in sizes:
            mb = MB_TOKENS.get(name, args.mb_tokens) if args.mb_tokens == 0 else args.mb_tokens
            part_throughput(tmp, args.tp, device, [name], mb, args.tokens // mb, args.seg_tokens,
                            args.steps, start + args.budget_s, name in base, args.recompute)
    say(f"total {time.monotonic() - start:.0f} s")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
