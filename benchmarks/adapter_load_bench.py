"""Adapter under load: 64 concurrent sessions against a fast engine; requests/s and p99 added latency.

Each session is a Chat Completions agent loop over HTTP (aiohttp client -> adapter -> real
ServingClient -> engine over HTTP): a ~6k-character system prompt with four tool schemas, then
``--turns`` turns, each answering the previous tool call with a ~1 KB tool result, so every turn after
the first is bridged. Half the sessions stream (SSE), half take JSON.

The engine is an instant TEST DOUBLE (fixed reply: a tool call, then a final answer; logprob -0.5 per
token), so what is measured is the adapter. *Added latency* of a request = client-observed latency
minus the engine call time the core records on the turn (``engine_s``, which includes the HTTP hop to
the engine). Baseline in the same run: the same number of generate calls, same concurrency, straight to
the engine through the same ServingClient (what a rollout would pay without the adapter).

    .venv/bin/python benchmarks/adapter_load_bench.py [--sessions 64] [--turns 6]

Production size (issue 16): ``--history-chars N`` starts every session from a long agent history (tool
calls and ~4 KB tool results; 110k characters are ~60k tiny-model tokens) and ``--big-mib M`` adds one
more session that sends a single M MiB message while the others run; its latency is reported apart, the
others' added latency is what it must not spoil (target p99 < 50 ms).

    .venv/bin/python benchmarks/adapter_load_bench.py --sessions 256 --turns 3 --history-chars 110000 --big-mib 10

``--workers N`` runs ``lego adapter --workers N`` (N adapter processes behind one port, sessions sticky).
On a shared box the wall-clock figures follow the other jobs' load, so the CPU seconds each process
spent are printed too (from /proc): adapter CPU per request against the engine's per direct request is
what the adapter costs whatever the load, and how many cores it needs to keep up with the engine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from typing import Any

import aiohttp
from aiohttp import web

from lego_rl.chat.render import ChatRenderer
from lego_rl.serving.client import ServingClient
from lego_rl.serving.protocol import SamplingParams
from lego_rl.serving.tiny_model import ensure_tiny_model

SYSTEM = ("You are a coding agent working in a repository. Read files, run tests, edit code. " * 70).strip()
TOOLS = [{"type": "function", "function": {
    "name": name, "description": f"The {name} tool: " + "does what its name says. " * 20,
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}, "path": {"type": "string"}},
                   "required": ["command"]}}} for name in ("terminal", "file_editor", "grep", "glob")]
RESULT = "line of tool output with some file content\n" * 24


class FastEngine:
    """TEST DOUBLE: answers /inference/v1/generate instantly with a fixed, tokenised reply."""

    def __init__(self, renderer: ChatRenderer) -> None:
        end = renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")
        call = "<tool_call>\n<function=terminal>\n<parameter=command>\nls -la\n</parameter>\n</function>\n</tool_call>"
        self.replies = [renderer.encode(call) + [end], renderer.encode("All done.") + [end]]
        self.count = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.count += 1
        # A final answer on every 4th prompt keeps replies mixed; the client continues regardless.
        ids = self.replies[1] if len(body["token_ids"]) % 4 == 0 else self.replies[0]
        content = [{"token_id": t, "logprob": -0.5} for t in ids]
        return web.json_response({"choices": [{"index": 0, "token_ids": ids, "logprobs": {"content": content},
                                               "finish_reason": "stop"}],
                                  "weight_versions": [{"version": 0, "start": 0, "end": len(ids)}]})


def long_history(sid: str, chars: int) -> list[dict[str, Any]]:
    """A finished stretch of agent work: (assistant tool call, ~4 KB tool result) pairs, ``chars`` in all."""
    rng = random.Random(sid)
    words = ["def", "return", "self", "value", "import", "class", "for", "if", "None", "test", "assert"]
    out: list[dict[str, Any]] = []
    size, i = 0, 0
    while size < chars:
        result = "\n".join(" ".join(rng.choice(words) + str(rng.randint(0, 99)) for _ in range(8))
                           for _ in range(80))[: chars - size]
        call = {"id": f"hist_{i}", "type": "function",
                "function": {"name": "terminal", "arguments": json.dumps({"command": f"cat file_{i}.py"})}}
        out += [{"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": f"hist_{i}", "content": result}]
        size += len(result)
        i += 1
    return out


async def big_message(http: aiohttp.ClientSession, url: str, mib: float, delay: float) -> tuple[float, int, str]:
    """One session sending a single ``mib`` MiB message after ``delay`` s: (latency, status, reply head)."""
    await asyncio.sleep(delay)
    text = ("x = compute(value, other) + 1  # " * (int(mib * 1024 * 1024) // 34 + 1))[: int(mib * 1024 * 1024)]
    body = {"model": "tiny", "messages": [{"role": "user", "content": text}]}
    t0 = time.perf_counter()
    async with http.post(f"{url}/v1/chat/completions", json=body, headers={"Authorization": "Bearer bench-big"}) as r:
        reply = await r.text()
    return time.perf_counter() - t0, r.status, reply[:160]


async def one_session(http: aiohttp.ClientSession, url: str, sid: str, turns: int, stream: bool,
                      latencies: list[float], history_chars: int = 0) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": f"Fix the failing test ({sid})."}]
    if history_chars:
        messages += long_history(sid, history_chars)
    for turn in range(turns):
        body = {"model": "tiny", "messages": messages, "tools": TOOLS, "stream": stream}
        t0 = time.perf_counter()
        async with http.post(f"{url}/v1/chat/completions", json=body,
                             headers={"Authorization": f"Bearer {sid}"}) as r:
            text = await r.text()
        latencies.append(time.perf_counter() - t0)
        if r.status != 200:
            raise RuntimeError(f"{sid} turn {turn}: HTTP {r.status}: {text[:300]}")
        if stream:
            chunks = [json.loads(line[6:]) for line in text.splitlines()
                      if line.startswith("data: {")]
            calls: dict[int, dict[str, Any]] = {}
            content = ""
            for chunk in chunks:
                delta = chunk["choices"][0]["delta"] if chunk["choices"] else {}
                content += delta.get("content") or ""
                for tc in delta.get("tool_calls", []):
                    slot = calls.setdefault(tc["index"], {"id": None, "type": "function",
                                                          "function": {"name": "", "arguments": ""}})
                    slot["id"] = tc.get("id") or slot["id"]
                    slot["function"]["name"] += tc.get("function", {}).get("name", "")
                    slot["function"]["arguments"] += tc.get("function", {}).get("arguments", "")
            message: dict[str, Any] = {"role": "assistant", "content": content or None}
            if calls:
                message["tool_calls"] = [calls[i] for i in sorted(calls)]
        else:
            message = json.loads(text)["choices"][0]["message"]
        messages.append(message)
        for call in message.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": RESULT})
        if not message.get("tool_calls"):
            messages.append({"role": "user", "content": "Continue."})


async def direct_baseline(client: ServingClient, prompts: list[list[int]], concurrency: int) -> float:
    sem = asyncio.Semaphore(concurrency)
    params = SamplingParams(max_tokens=256, logprobs=1)

    async def one(ids: list[int]) -> None:
        async with sem:
            await client.generate(ids, params)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(p) for p in prompts))
    return time.perf_counter() - t0


def cpu_seconds(pid: int) -> float:
    """CPU (user + system) seconds used so far by ``pid`` and its live descendants (Linux /proc)."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            fields = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            for task in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in open(f"/proc/{p}/task/{task}/children").read().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def load_average() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def serve_engine(port: int) -> None:
    """Child process: the fast engine alone, until killed."""
    engine = FastEngine(ChatRenderer.from_pretrained(ensure_tiny_model()))
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/inference/v1/generate", engine.handle)
    app.router.add_get("/health", _ok)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()  # 256 sessions connect at once
    await asyncio.Event().wait()


async def _ok(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def wait_http(url: str, proc: asyncio.subprocess.Process) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(3000):  # start-up imports transformers: slow on a loaded machine
            if proc.returncode is not None:
                raise RuntimeError(f"{url}: process exited with {proc.returncode}")
            try:
                async with http.get(f"{url}/health") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


async def main(sessions: int, turns: int, history_chars: int = 0, big_mib: float = 0.0, workers: int = 1) -> None:
    import sys
    import tempfile
    from pathlib import Path

    from lego_rl.adapter.sessions import load_turn_records

    model = ensure_tiny_model()
    engine_port, adapter_port = free_port(), free_port()
    engine_url, adapter_url = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{adapter_port}"
    records_dir = Path(tempfile.mkdtemp(prefix="lego-adapter-bench-"))
    engine_proc = await asyncio.create_subprocess_exec(sys.executable, __file__, "--serve-engine", str(engine_port))
    adapter_proc = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("lego")), "adapter", "--serving-url", engine_url, "--model", str(model),
        "--port", str(adapter_port), "--open-sessions", str(records_dir), "--max-response-tokens", "256",
        "--workers", str(workers), stderr=asyncio.subprocess.DEVNULL)
    ids = [f"bench-{i}" for i in range(sessions)]
    latencies: list[float] = []
    try:
        await wait_http(engine_url, engine_proc)
        await wait_http(adapter_url, adapter_proc)
        load_before = load_average()
        cpu0 = cpu_seconds(adapter_proc.pid), cpu_seconds(engine_proc.pid)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            t0 = time.perf_counter()
            runs = [one_session(http, adapter_url, sid, turns, i % 2 == 0, latencies, history_chars)
                    for i, sid in enumerate(ids)]
            big = asyncio.ensure_future(big_message(http, adapter_url, big_mib, 1.0)) if big_mib else None
            await asyncio.gather(*runs)
            wall = time.perf_counter() - t0
            big_result = await big if big is not None else None
        cpu1 = cpu_seconds(adapter_proc.pid), cpu_seconds(engine_proc.pid)
        load_after = load_average()
        adapter_proc.terminate()
        await adapter_proc.wait()
        records = [r for sid in ids for r in load_turn_records(records_dir / f"{sid}.turns.jsonl")]
        prompts = [r.prompt_ids for r in records]
        renderer = ChatRenderer.from_pretrained(model)
        async with ServingClient([engine_url], vocab_size=renderer.vocab_size) as client:
            engine_cpu0 = cpu_seconds(engine_proc.pid)
            direct = await direct_baseline(client, prompts, sessions)
            engine_cpu_direct = cpu_seconds(engine_proc.pid) - engine_cpu0
    finally:
        for proc in (adapter_proc, engine_proc):
            if proc.returncode is None:
                proc.kill()
                await proc.wait()

    n = len(records)
    assert n == sessions * turns == len(latencies), (n, len(latencies))
    bridged = sum(r.render_mode == "bridged" for r in records)
    engine_s = statistics.mean(r.engine_s for r in records)
    core_s = [r.total_s - r.engine_s for r in records]
    added = [max(lat - engine_s, 0.0) for lat in latencies]
    print(f"{sessions} sessions x {turns} turns = {n} requests ({bridged} bridged), "
          f"prompts {min(map(len, prompts))}-{max(map(len, prompts))} ids; engine, adapter, clients: 3 processes")
    print(f"through the adapter : {n / wall:8.1f} requests/s  (wall {wall:.2f} s)")
    print(f"direct to the engine: {n / direct:8.1f} requests/s  (wall {direct:.2f} s)  [baseline]")
    print(f"adapter rate / direct rate: {(n / wall) / (n / direct):.2f}")
    print(f"client latency   p50 {pct(latencies, .5) * 1e3:7.1f} ms  p99 {pct(latencies, .99) * 1e3:7.1f} ms")
    print(f"added latency    p50 {pct(added, .5) * 1e3:7.1f} ms  p99 {pct(added, .99) * 1e3:7.1f} ms "
          f"(client latency minus the mean engine call, {engine_s * 1e3:.1f} ms)")
    print(f"core work / turn p50 {pct(core_s, .5) * 1e3:7.1f} ms  p99 {pct(core_s, .99) * 1e3:7.1f} ms "
          "(render, parse, validate, record; from the turn records)")
    adapter_cpu, engine_cpu = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
    print(f"CPU per request  adapter {adapter_cpu / n * 1e3:6.1f} ms ({workers} worker process(es)), engine "
          f"{engine_cpu / n * 1e3:.1f} ms behind it; engine {engine_cpu_direct / n * 1e3:.1f} ms per direct "
          f"request [baseline]; the adapter needs {adapter_cpu / max(engine_cpu_direct, 1e-9):.1f}x the engine's CPU")
    print(f"load average     {load_before} before the adapter run, {load_after} after it")
    if big_result is not None:
        print(f"the {big_mib} MiB message: HTTP {big_result[1]} after {big_result[0] * 1e3:.0f} ms: {big_result[2]!r}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--history-chars", type=int, default=0, help="Start each session from this long a history.")
    parser.add_argument("--big-mib", type=float, default=0.0, help="One more session sends one message this big.")
    parser.add_argument("--workers", type=int, default=1, help="Adapter processes (lego adapter --workers).")
    parser.add_argument("--serve-engine", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    asyncio.run(serve_engine(args.serve_engine) if args.serve_engine
                else main(args.sessions, args.turns, args.history_chars, args.big_mib, args.workers))
