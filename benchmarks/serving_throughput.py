"""Embedded engine decode throughput (through HTTP + the client) against plain ``model.generate``.

Same tiny model, same thread count, greedy, fixed-length outputs (EOS ignored), prompts of equal length
so that ``generate``'s batch needs no padding. Batch 1: one request; batch 8: eight concurrent requests
(the engine batches them), against one ``generate`` call on a batch of 8. Prints tokens/s and the ratio
engine / generate as the median over back-to-back pairs, by wall time and by CPU time of the whole
process (client + HTTP server + engine), which a crowded machine disturbs less (target >= 1.0x: the HTTP
layer must not cost throughput).

    .venv/bin/python benchmarks/serving_throughput.py [--tokens 128] [--threads 1] [--repeats 7]
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


def generate_tps(model: torch.nn.Module, batch: int, tokens: int) -> tuple[float, float]:
    ids = torch.tensor(prompts(batch), device=model.device)
    with torch.inference_mode():
        t0, c0 = time.perf_counter(), time.process_time()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,
                             min_new_tokens=tokens, do_sample=False, pad_token_id=0)
        if ids.is_cuda:
            torch.cuda.synchronize()
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
    assert out.shape[1] - ids.shape[1] == tokens
    return batch * tokens / dt, batch * tokens / dc


async def engine_tps(url: str, vocab: int, batch: int, tokens: int) -> tuple[float, float]:
    sp = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    async with ServingClient([url], vocab_size=vocab) as c:
        t0, c0 = time.perf_counter(), time.process_time()
        rs = await asyncio.gather(*(c.generate(p, sp) for p in prompts(batch)))
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
    assert all(len(r.output_ids) == tokens for r in rs)
    # process_time covers every thread of this process: client, HTTP server and engine together.
    return batch * tokens / dt, batch * tokens / dc


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    path = ensure_tiny_model()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype)).to(args.device).eval()
    vocab = int(model.config.vocab_size)
    print(f"tiny model {path.name}, {args.tokens} new tokens, {args.device} {args.dtype}, "
          f"{args.threads} thread(s), {args.repeats} pairs")
    async with embedded_server(path, threads=args.threads, device=args.device, dtype=args.dtype) as url:
        await engine_tps(url, vocab, 1, 8)  # warm-up
        generate_tps(model, 1, 8)
        print("| batch | generate tok/s (wall) | engine tok/s (wall) | engine / generate, wall "
              "| engine / generate, per CPU-second |")
        print("|---|---|---|---|---|")
        for batch in (1, 8):
            pairs = []
            for i in range(args.repeats):
                # Back-to-back pairs in alternating order: load changes on a shared machine hit both alike.
                if i % 2:
                    o = await engine_tps(url, vocab, batch, args.tokens)
                    b = generate_tps(model, batch, args.tokens)
                else:
                    b = generate_tps(model, batch, args.tokens)
                    o = await engine_tps(url, vocab, batch, args.tokens)
                pairs.append((b, o))
            wall = [o[0] / b[0] for b, o in pairs]
            cpu = [o[1] / b[1] for b, o in pairs]
            print(f"| {batch} | {statistics.median(b[0] for b, _ in pairs):.0f} | "
                  f"{statistics.median(o[0] for _, o in pairs):.0f} | {statistics.median(wall):.2f}x "
                  f"({min(wall):.2f}-{max(wall):.2f}) | {statistics.median(cpu):.2f}x ({min(cpu):.2f}-{max(cpu):.2f}) |")

if __name__ == "__main__":
    asyncio.run(main())
