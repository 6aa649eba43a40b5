"""Embedded engine decode throughput (through HTTP + the client) against plain ``model.generate``.

Same tiny model, same thread count, greedy, fixed-length outputs (EOS ignored), prompts of equal length
so that ``generate``'s batch needs no padding. Batch 1: one request; batch 8: eight concurrent requests
(the engine batches them), against one ``generate`` call on a batch of 8. Prints tokens/s and the ratio
engine / generate (target >= 1.0x: the HTTP layer must not cost throughput).

    .venv/bin/python benchmarks/serving_throughput.py [--tokens 128] [--threads 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import torch

from lego_rl.serving.client import ServingClient
from lego_rl.serving.protocol import SamplingParams
from lego_rl.serving.server import embedded_server
from lego_rl.serving.tiny_model import ensure_tiny_model


def prompts(batch: int, length: int = 32) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 1500, (batch, length), generator=g).tolist()


def generate_tps(model: torch.nn.Module, batch: int, tokens: int) -> float:
    ids = torch.tensor(prompts(batch), device=model.device)
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,
                             min_new_tokens=tokens, do_sample=False, pad_token_id=0)
        if ids.is_cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    assert out.shape[1] - ids.shape[1] == tokens
    return batch * tokens / dt


async def engine_tps(url: str, vocab: int, batch: int, tokens: int) -> float:
    sp = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    async with ServingClient([url], vocab_size=vocab) as c:
        t0 = time.perf_counter()
        rs = await asyncio.gather(*(c.generate(p, sp) for p in prompts(batch)))
        dt = time.perf_counter() - t0
    assert all(len(r.output_ids) == tokens for r in rs)
    return batch * tokens / dt


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    path = ensure_tiny_model()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype)).to(args.device).eval()
    vocab = int(model.config.vocab_size)
    print(f"tiny model {path.name}, {args.tokens} new tokens, {args.device} {args.dtype}, "
          f"{args.threads} thread(s), best of {args.repeats}")
    async with embedded_server(path, threads=args.threads, device=args.device, dtype=args.dtype) as url:
        await engine_tps(url, vocab, 1, 8)  # warm-up
        generate_tps(model, 1, 8)
        print("| batch | model.generate tok/s | engine via HTTP tok/s | engine / generate |")
        print("|---|---|---|---|")
        for batch in (1, 8):
            base, ours = [], []
            for _ in range(args.repeats):  # interleaved, so load changes hit both alike
                base.append(generate_tps(model, batch, args.tokens))
                ours.append(await engine_tps(url, vocab, batch, args.tokens))
            b, o = max(base), max(ours)
            print(f"| {batch} | {b:.0f} | {o:.0f} | {o / b:.2f}x |  (medians {statistics.median(base):.0f} / "
                  f"{statistics.median(ours):.0f})")


if __name__ == "__main__":
    asyncio.run(main())
