"""The embedded engine on one GPU: decode throughput of the fast path against the generic path, and logprob
parity with the trainer's recomputation (issue 13 "A fast engine on GPU", issue 11 evidence 3).

Model: random-init Qwen3-0.6B shape (``train_backend_bench.QWEN3_06B``: 28 layers, hidden 1024, 16/8 heads,
vocab 151,936), built offline; ``--model qwen3-4b`` the 4B shape (36 layers, hidden 2560, 32/8 heads). Every
figure below comes from one process, so ratios are same-run.

0. Breakdown: one decode graph replay (SDPA decode attention as before issue 31, the Triton kernel, and that
   with its blocks compiled first), its kernels and their GPU time (torch.profiler), one decode call synced,
   the step with its draw in the graph (``decode_draw``) synced as the engine runs it, and the sampler alone.
1. Throughput (T = 1, top_p = 1, ignore EOS, random prompts of ``--prompt-len``): one stream, and ``--batch``
   streams submitted together (continuous batching admits them, all decode together). tok/s counts generated
   tokens over the wall time from submission to the last reply (prefill included). The baseline is the
   generic path (``fast=False``: transformers' forward over ``kv.py``'s cache, SDPA's own kernel choice) on
   fewer tokens (it is slow); the fast path is measured after one warm-up round that captures its CUDA graphs
   (the warm-up time is printed too): before batched prefill (``prefill_batch_tokens=1``), with it, and with
   compiled blocks (``compile_decode``) in bf16 and in the trainer's recipe; ``--skip`` names variants to
   leave out. The single stream's time is split into the decode call and ``sample_rows`` (which waits for
   the GPU).
2. Parity: the engine samples ``--rollouts`` × ``--new`` tokens after ``--prompt-len``-token prompts; the
   torch trainer backend recomputes them packed (``compute_logprobs``, the same convention) and
   ``consistency_report`` compares. bf16: the trainer as it trains on CUDA (fp32 weights, bf16 autocast)
   against the engine in pure bf16 (``dtype=bfloat16``, the baseline) and in the trainer's recipe
   (``dtype=float32, compute_dtype=bfloat16``). fp32: the trainer with ``train.precision = "fp32"`` against
   the engine in fp32 (the trainer attends through SDPA there). cuDNN attention is disabled process-wide for
   the parity phase (the trainer has no switch of its own; the engine's fast path never uses it).

    python benchmarks/gpu_engine_bench.py --out results.json
    python benchmarks/gpu_engine_bench.py --skip baseline,batched --single-new 256 --batch-new 128 --new 128
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_backend_bench import build_model  # noqa: E402

from lego_rl.serving.engine import EmbeddedEngine  # noqa: E402
from lego_rl.serving.protocol import SamplingParams  # noqa: E402
from lego_rl.train.batching import plan_steps  # noqa: E402
from lego_rl.train.consistency import consistency_report  # noqa: E402
from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings  # noqa: E402
from lego_rl.trajectory.sample import Sample  # noqa: E402


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(n)]


async def generate(engine: EmbeddedEngine, batch: list[list[int]], new: int, top_p: float = 1.0,
                   tag: str = "r") -> tuple[float, list[Any]]:
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(
        engine.generate(p, SamplingParams(max_tokens=new, temperature=1.0, top_p=top_p, seed=i),
                        request_id=f"{tag}{i}", ignore_eos=True) for i, p in enumerate(batch)))
    return time.perf_counter() - t0, outs


async def throughput(model_dir: Path, vocab: int, a: argparse.Namespace, label: str, new_single: int,
                     new_batch: int, warm: bool, **kw: Any) -> dict[str, Any]:
    engine = EmbeddedEngine(model_dir, device=a.device, max_batch=a.batch, max_model_len=a.max_len, **kw)
    await engine.start()
    row: dict[str, Any] = {"path": label}
    try:
        if warm:  # capture every graph the measured rounds will replay
            t0 = time.perf_counter()
            await generate(engine, prompts(1, a.prompt_len, vocab, 1), new_single, tag="w1-")
            await generate(engine, prompts(a.batch, a.prompt_len, vocab, 2), new_batch, tag="wb-")
            row["warmup_s"] = round(time.perf_counter() - t0, 2)
        spent = {"decode": 0.0, "sample": 0.0, "draw": 0.0}
        import lego_rl.serving.engine as engine_mod
        sampler = engine_mod.sample_rows
        if engine._static is not None:  # where a single-stream step's wall time goes (CPU side)
            def timed(fn: Any, key: str) -> Any:
                def call(*args: Any) -> Any:
                    t0 = time.perf_counter()
                    try:
                        return fn(*args)
                    finally:
                        spent[key] += time.perf_counter() - t0
                return call

            engine._static.decode = timed(engine._static.decode, "decode")  # type: ignore[method-assign]
            engine._static.decode_draw = timed(engine._static.decode_draw, "draw")  # type: ignore[method-assign]
            engine_mod.sample_rows = timed(engine_mod.sample_rows, "sample")  # type: ignore[attr-defined]
        try:
            secs, _ = await generate(engine, prompts(1, a.prompt_len, vocab, 3), new_single, tag="s")
        finally:
            engine_mod.sample_rows = sampler  # type: ignore[attr-defined]
            if engine._static is not None:
                del engine._static.decode, engine._static.decode_draw
        row["single_tok_s"] = round(new_single / secs, 1)
        row["single_step_ms"] = round(1000 * secs / new_single, 3)
        row["single_decode_call_ms"] = round(1000 * spent["decode"] / new_single, 3)
        row["single_sample_ms"] = round(1000 * spent["sample"] / new_single, 3)
        row["single_decode_draw_call_ms"] = round(1000 * spent["draw"] / new_single, 3)
        row["single_tokens"] = new_single
        secs, _ = await generate(engine, prompts(a.batch, a.prompt_len, vocab, 4), new_batch, tag="b")
        row["batch_tok_s"] = round(a.batch * new_batch / secs, 1)
        row["batch_tokens_per_row"] = new_batch
        row["batch_step_ms"] = round(1000 * secs / new_batch, 2)
    finally:
        await engine.stop()
        del engine
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    print(json.dumps(row), flush=True)
    return row


async def rollouts(model_dir: Path, vocab: int, a: argparse.Namespace, top_p: float, **kw: Any) -> list[Sample]:
    engine = EmbeddedEngine(model_dir, device=a.device, max_batch=a.rollouts, max_model_len=a.max_len, **kw)
    await engine.start()
    try:
        batch = prompts(a.rollouts, a.prompt_len, vocab, 5)
        _, outs = await generate(engine, batch, a.new, top_p=top_p, tag="p")
    finally:
        await engine.stop()
        del engine
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return [Sample(rollout_id=f"r{i}", group_index=i, index=0, segment=0, num_segments=1,
                   tokens=p + o.token_ids, loss_mask=[0] * len(p) + [1] * len(o.token_ids),
                   rollout_logprobs=[0.0] * len(p) + list(o.logprobs))
            for i, (p, o) in enumerate(zip(batch, outs, strict=True))]


def breakdown(model_dir: Path, a: argparse.Namespace) -> list[dict[str, Any]]:
    """Where a step's time goes: the decode graph replay alone (as captured, and with its blocks compiled
    first), the kernels one step launches and their summed GPU time (torch.profiler), and the sampler alone."""
    from torch.profiler import ProfilerActivity, profile

    from lego_rl.serving.sampler import RowParams, sample_rows
    from lego_rl.serving.static_decode import StaticDecoder
    from lego_rl.serving.weights import load_model

    model, config, _ = load_model(model_dir, torch.device(a.device), "bfloat16")
    rows = []
    for compiled, attention in ((False, "sdpa"), (False, "triton"), (True, "triton")):
        if f"breakdown-{'compiled' if compiled else attention}" in a.skip.split(","):
            continue
        dec = StaticDecoder(model, config, slots=a.batch, max_len=a.max_len, compute_dtype=torch.bfloat16,
                            use_graphs=True, compile=compiled, attention=attention)  # type: ignore[arg-type]
        for b in (1, a.batch):
            ids, pos = [7] * b, [a.prompt_len + 100] * b
            t0 = time.perf_counter()
            for _ in range(3):
                logits = dec.decode(ids, pos)
            torch.cuda.synchronize()
            row: dict[str, Any] = {"rows": b, "compiled": compiled, "attention": attention,
                                   "capture_s": round(time.perf_counter() - t0, 2)}
            t0 = time.perf_counter()
            for _ in range(100):
                logits = dec.decode(ids, pos)
            torch.cuda.synchronize()
            row["decode_graph_ms"] = round(10 * (time.perf_counter() - t0), 3)
            # The engine waits for every step's tokens, so a step's graph starts on an idle GPU: time one
            # decode call alone (CPU side: the input copies and cudaGraphLaunch) and one decode + sync.
            cpu = synced = 0.0
            for _ in range(50):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                dec.decode(ids, pos)
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                cpu, synced = cpu + t1 - t0, synced + time.perf_counter() - t0
            row["decode_call_cpu_ms"], row["decode_synced_ms"] = round(20 * cpu, 3), round(20 * synced, 3)
            # The step as the engine runs it now for plain rows: forward and draw in one graph, one copy back.
            plain = [RowParams(temperature=1.0, top_p=1.0, top_k=-1, num_logprobs=1, want_nucleus=False,
                               generator=torch.Generator().manual_seed(i)) for i in range(b)]
            dec.decode_draw(ids, pos, plain)  # capture
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(50):
                dec.decode_draw(ids, pos, plain)
            row["decode_draw_synced_ms"] = round(20 * (time.perf_counter() - t0), 3)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    dec.decode(ids, pos)
                torch.cuda.synchronize()
            kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            row["kernels_per_step"] = len(kernels) // 5
            row["kernel_ms_per_step"] = round(sum(e.device_time_total for e in kernels) / 5 / 1000, 3)
            if b == 1:
                top = sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:8]
                row["top_kernels"] = [(e.key[:60], e.count // 5, round(e.device_time_total / 5, 1)) for e in top]
            if not compiled and attention == "sdpa":
                for top_p in (1.0, 0.95):
                    params = [RowParams(temperature=1.0, top_p=top_p, top_k=0, num_logprobs=0, want_nucleus=False,
                                        generator=torch.Generator().manual_seed(i)) for i in range(b)]
                    sample_rows(logits, params)
                    t0 = time.perf_counter()
                    for _ in range(20):
                        sample_rows(logits, params)
                    row[f"sampler_ms_top_p_{top_p}"] = round(50 * (time.perf_counter() - t0), 3)
            print(json.dumps(row), flush=True)
            rows.append(row)
        del dec
        gc.collect()
        torch.cuda.empty_cache()
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def compare(backend: TorchBackend, samples: list[Sample], top_p: float) -> dict[str, float]:
    [step] = plan_steps(samples, [1.0] * len(samples), max_tokens_per_micro_batch=8192)
    trainer = backend.compute_logprobs(step.micro_batches, temperature=1.0, top_p=top_p)
    report = consistency_report(torch.cat([mb.rollout_logprobs for mb in step.micro_batches]), torch.cat(trainer),
                                torch.cat([mb.loss_mask for mb in step.micro_batches]))
    return {k: v for k, v in report.overall.model_dump().items() if v is not None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["tiny", "qwen3-0.6b", "qwen3-4b"], default="qwen3-0.6b")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--single-new", type=int, default=512)
    ap.add_argument("--batch-new", type=int, default=256)
    ap.add_argument("--baseline-single-new", type=int, default=64)
    ap.add_argument("--baseline-batch-new", type=int, default=16)
    ap.add_argument("--rollouts", type=int, default=8)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--skip", default="", help="comma-separated phases to skip: breakdown, throughput, parity "
                    "(parity-bf16: only its fp32 rows); "
                    "breakdown rows: breakdown-sdpa, breakdown-triton, breakdown-compiled; or throughput "
                    "variants: baseline, old, batched, draw, nolook, new, trainer-before, trainer, compiled")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of this script (fast=True there has no graphs)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    skip = set(a.skip.split(","))

    def save() -> None:  # after every phase: a run stopped at its time limit keeps what it measured
        if a.out:
            a.out.write_text(json.dumps(results, indent=1))

    results: dict[str, Any] = {"device": torch.cuda.get_device_name() if a.device == "cuda" else a.device,
                               "torch": torch.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(a.model, Path(tmp) / "model")
        vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
        if "breakdown" not in skip:
            results["breakdown"] = breakdown(model_dir, a)
            save()
        if "throughput" not in skip:
            before = {"graph_sampling": False, "decode_attention": "sdpa"}  # the engine until issue 31
            variants: list[tuple[str, str, str, bool, dict[str, Any]]] = [
                ("generic bf16 (baseline)", "generic", "baseline", False, {"dtype": "bfloat16", "fast": False}),
                ("fast bf16, one prefill per request", "fast", "old", True,
                 {"dtype": "bfloat16", "fast": True, "prefill_batch_tokens": 1, **before}),
                ("fast bf16 + batched prefill (before issue 31: sampler after the graph, SDPA decode attention)",
                 "fast", "batched", True, {"dtype": "bfloat16", "fast": True, **before}),
                ("fast bf16, draw in the graph, SDPA decode attention", "fast", "draw", True,
                 {"dtype": "bfloat16", "fast": True, "decode_attention": "sdpa"}),
                ("fast bf16, draw in the graph, Triton decode attention, no look-ahead", "fast", "nolook", True,
                 {"dtype": "bfloat16", "fast": True, "lookahead": False}),
                ("fast bf16, draw in the graph, Triton decode attention, look-ahead (default)", "fast", "new", True,
                 {"dtype": "bfloat16", "fast": True}),
                ("fast fp32 weights + bf16 compute, trainer recipe (before issue 31)", "fast", "trainer-before", True,
                 {"dtype": "float32", "compute_dtype": "bfloat16", "fast": True, **before}),
                ("fast fp32 weights + bf16 compute, trainer recipe (default)", "fast", "trainer", True,
                 {"dtype": "float32", "compute_dtype": "bfloat16", "fast": True}),
                ("fast bf16 default + compiled blocks", "fast", "compiled", True,
                 {"dtype": "bfloat16", "fast": True, "compile_decode": True}),
            ]
            rows = []
            for label, kind, tag, warm, kw in variants:
                if tag in skip:
                    continue
                single, batch = (a.baseline_single_new, a.baseline_batch_new) if kind == "generic" else \
                    (a.single_new, a.batch_new)
                rows.append(asyncio.run(throughput(model_dir, vocab, a, label, single, batch, warm, **kw)))
                results["throughput"] = rows
                save()
            results["throughput"] = rows
            save()
        if "parity" not in skip:
            torch.backends.cuda.enable_cudnn_sdp(False)
            backend = TorchBackend(model_dir, TorchTrainSettings(lr=1e-6, device=a.device))
            parity = []
            for top_p in () if "parity-bf16" in skip else (1.0, 0.95):
                for label, kw in (("engine pure bf16 (baseline)", {"dtype": "bfloat16", "fast": True}),
                                  ("engine fp32 + bf16 compute (trainer's recipe)",
                                   {"dtype": "float32", "compute_dtype": "bfloat16", "fast": True}),
                                  ("engine fp32 + bf16 compute, compiled blocks",
                                   {"dtype": "float32", "compute_dtype": "bfloat16", "fast": True,
                                    "compile_decode": True}),
                                  ("engine pure bf16, compiled blocks",
                                   {"dtype": "bfloat16", "fast": True, "compile_decode": True})):
                    row = {"top_p": top_p, "engine": label, "trainer": "fp32 + bf16 autocast",
                           **compare(backend, asyncio.run(rollouts(model_dir, vocab, a, top_p, **kw)), top_p)}
                    print(json.dumps(row), flush=True)
                    parity.append(row)
            # fp32 on both sides: the trainer with train.precision = "fp32" (autocast off; attention through SDPA,
            # which packed_attention "auto" picks for fp32: varlen's flash kernel takes no fp32).
            del backend
            gc.collect()
            torch.cuda.empty_cache()
            backend = TorchBackend(model_dir, TorchTrainSettings(lr=1e-6, device=a.device, precision="fp32"))
            for label, compiled in (("fast fp32", False), ("fast fp32, compiled blocks", True)):
                row = {"top_p": 1.0, "engine": label, "trainer": "fp32, no autocast",
                       **compare(backend, asyncio.run(rollouts(model_dir, vocab, a, 1.0, dtype="float32", fast=True,
                                                               compile_decode=compiled)), 1.0)}
                print(json.dumps(row), flush=True)
                parity.append(row)
            results["parity"] = parity
            save()


if __name__ == "__main__":
    main()
