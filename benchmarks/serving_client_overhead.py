"""Client overhead per request: ``ServingClient.generate`` against a raw aiohttp post of the same body.

The server is an instant stub (a test double for the engine: it returns one fixed, valid vLLM-shaped
reply of 64 tokens), so the difference between the two timings is what the client adds: building the
body, routing, bookkeeping and strict validation of the reply. Prints p50/p90 of both and the p50
difference (target < 1 ms p50).

    .venv/bin/python benchmarks/serving_client_overhead.py [--requests 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import aiohttp
from aiohttp import web

from lego_rl.serving.client import ServingClient
from lego_rl.serving.protocol import SamplingParams
from lego_rl.serving.server import free_port

N_OUT = 64
REPLY = json.dumps({
    "request_id": "generate-tokens-x", "model": "stub", "output_mode": "tokens",
    "choices": [{
        "index": 0, "finish_reason": "length", "stop_reason": None, "token_ids": list(range(N_OUT)),
        "weight_versions": [{"version": "default", "start": 0, "end": N_OUT}],
        "logprobs": {"content": [{"token_id": i, "logprob": -1.0 - i / 100, "rank": 1,
                                  "top_logprobs": [{"token_id": i, "logprob": -1.0 - i / 100, "rank": 1}]}
                                 for i in range(N_OUT)]},
    }],
})


async def stub(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(text=REPLY, content_type="application/json")


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[int(q * (len(xs) - 1))]


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    args = ap.parse_args()
    app = web.Application()
    app.router.add_post("/inference/v1/generate", stub)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    url = f"http://127.0.0.1:{port}"
    prompt = list(range(2000))
    sp = SamplingParams(max_tokens=N_OUT, temperature=1.0)
    raw_t: list[float] = []
    cli_t: list[float] = []
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s, \
                ServingClient([url], vocab_size=4096) as client:
            body = {"request_id": "r", "token_ids": prompt, "sampling_params": sp.model_dump(exclude_none=True)}
            for i in range(args.requests + 100):  # interleaved; the first 100 of each are warm-up
                t0 = time.perf_counter()
                async with s.post(url + "/inference/v1/generate", json=body) as r:
                    json.loads(await r.text())
                t1 = time.perf_counter()
                await client.generate(prompt, sp)
                t2 = time.perf_counter()
                if i >= 100:
                    raw_t.append((t1 - t0) * 1e3)
                    cli_t.append((t2 - t1) * 1e3)
    finally:
        await runner.cleanup()
    print(f"{args.requests} requests, 2000-id prompt, {N_OUT}-id reply, instant stub server")
    print("| | p50 ms | p90 ms |")
    print("|---|---|---|")
    print(f"| raw aiohttp post + json | {statistics.median(raw_t):.3f} | {pct(raw_t, 0.9):.3f} |")
    print(f"| ServingClient.generate | {statistics.median(cli_t):.3f} | {pct(cli_t, 0.9):.3f} |")
    diff = [c - r for c, r in zip(cli_t, raw_t, strict=True)]
    print(f"client overhead p50: {statistics.median(diff):.3f} ms "
          f"(ratio {statistics.median(cli_t) / statistics.median(raw_t):.2f}x of the raw post)")


if __name__ == "__main__":
    asyncio.run(main())
