"""Chunked head logprobs vs the full ``[T, V]`` logits (the baseline, measured in the same run) on CPU.

    python benchmarks/chunked_logprobs_bench.py                   # T=2048, V=151936 (Qwen's vocabulary)
    python benchmarks/chunked_logprobs_bench.py --tokens 4096 --chunk 512 --top-p 0.95

A random-init Qwen3-architecture model with the real vocabulary size (small body: the head dominates, as it
does in the memory problem this addresses) scores one packed micro-batch of ``--tokens`` tokens (at ``--top-p``: the truncation's sort is
the slow part on CPU, not the memory),
with ``logprob_chunk_tokens`` = 0 (the model's full logits) and = ``--chunk``. Each (variant, phase) runs in
its own process so the peak resident memory of that phase alone is measured: the kernel's high-water mark
(VmHWM) is reset after the model is loaded and the phase's peak is reported above the resident size at that
point. Phases: ``logprobs`` (no-grad recomputation, ``compute_logprobs``) and ``train`` (one ``train_step``).
Prints peak MB and seconds per variant, the chunked/full ratios, and the largest logprob difference (must
be fp32 rounding: the same numbers).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from lego_rl.train.batching import plan_steps
from lego_rl.train.losses import LossConfig, make_loss
from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings
from lego_rl.trajectory.sample import Sample


def build(out: Path, vocab: int) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=8192,
                      tie_word_embeddings=True)
    Qwen3ForCausalLM(cfg).save_pretrained(str(out), safe_serialization=True)


def rss_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def phase(model: Path, chunk: int, name: str, tokens: int, vocab: int, top_p: float) -> dict[str, float]:
    """One variant's one phase, in this process (called in a child)."""
    torch.manual_seed(1)
    g = torch.Generator().manual_seed(2)
    segs = [tokens // 4] * 4
    samples = []
    for r, n in enumerate(segs):
        ctx = n // 4
        ids = torch.randint(0, vocab, (n,), generator=g).tolist()
        samples.append(Sample(rollout_id=f"r{r}", group_index=0, index=r, tokens=ids,
                              loss_mask=[0] * ctx + [1] * (n - ctx), rollout_logprobs=[0.0] * ctx + [-5.0] * (n - ctx)))
    (step,) = plan_steps(samples, [1.0, -1.0, 0.5, -0.5], max_tokens_per_micro_batch=tokens)
    backend = TorchBackend(model, TorchTrainSettings(lr=1e-5, device="cpu", logprob_chunk_tokens=chunk))
    old = backend.compute_logprobs(step.micro_batches, temperature=1.0, top_p=top_p)  # warm-up and the ratio's base
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident size
    base = rss_mb("VmRSS")
    t0 = time.perf_counter()
    if name == "logprobs":
        lp = backend.compute_logprobs(step.micro_batches, temperature=1.0, top_p=top_p)
        value = float(torch.cat(lp).sum())
    else:
        res = backend.train_step(step, make_loss(LossConfig()), old_logprobs=old, temperature=1.0, top_p=top_p)
        value = res.metrics["loss"]
    seconds = time.perf_counter() - t0
    return {"peak_mb": rss_mb("VmHWM") - base, "seconds": seconds, "value": value,
            "chunked": float(backend._chunked)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--child", nargs=3, metavar=("MODEL", "CHUNK", "PHASE"))
    a = ap.parse_args()
    if a.child:
        print(json.dumps(phase(Path(a.child[0]), int(a.child[1]), a.child[2], a.tokens, a.vocab, a.top_p)))
        return
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        build(model, a.vocab)
        print(f"T={a.tokens} tokens in one micro-batch, V={a.vocab}, top_p={a.top_p}, fp32 CPU, chunk={a.chunk}",
              flush=True)
        res: dict[tuple[str, int], dict[str, float]] = {}
        for name in ("logprobs", "train"):
            for chunk in (0, a.chunk):
                out = subprocess.run([sys.executable, __file__, "--tokens", str(a.tokens), "--vocab", str(a.vocab),
                                      "--top-p", str(a.top_p),
                                      "--child", str(model), str(chunk), name],
                                     check=True, capture_output=True, text=True)
                res[(name, chunk)] = json.loads(out.stdout.strip().splitlines()[-1])
            full, ch = res[(name, 0)], res[(name, a.chunk)]
            assert ch["chunked"] == 1.0 and full["chunked"] == 0.0
            print(f"{name:9s} full logits: peak {full['peak_mb']:8.0f} MB {full['seconds']:6.2f} s | "
                  f"chunked: peak {ch['peak_mb']:8.0f} MB {ch['seconds']:6.2f} s | "
                  f"memory ratio {ch['peak_mb'] / full['peak_mb']:.3f}, time ratio {ch['seconds'] / full['seconds']:.2f}, "
                  f"|value diff| {abs(ch['value'] - full['value']):.2e}", flush=True)


if __name__ == "__main__":
    main()
