"""Weight sync time against a save-to-disk-and-reload baseline, measured in the same run.

A plain HF model of the served checkpoint stands in for the trainer (its parameters change before every
sync, as after an optimizer step). Per round, in rotating order, each way of making the engine serve the new
weights:

* ``in-place``: ``EmbeddedWeightSync.push``: the exported tensors copied into the running engine's parameters
  (pause, copy, resume): what ``lego train`` does with the embedded engine;
* ``routes``: ``RouteWeightSync.push`` to the engine's HTTP server: a staged safetensors checkpoint on
  ``--stage`` (tmpfs by default), then ``/pause?mode=wait``, ``/collective_rpc reload_weights``,
  ``/update_weight_version``, ``/resume``: what it does with vLLM;
* ``disk`` (baseline): ``save_pretrained`` to a directory on ``--disk`` and ``engine.reload_weights`` from it;
* ``restart``: ``save_pretrained`` to ``--disk`` and a new ``EmbeddedEngine`` loaded from it (no sync at all).

Every variant is checked to serve the trainer's weights afterwards (greedy logprobs of a fixed prompt equal a
teacher-forced recomputation, < 1e-4). Prints medians (range) and each one's ratio to the disk baseline.

    .venv/bin/python benchmarks/weight_sync_bench.py [--repeats 7] [--model DIR] [--device cpu]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from lego_rl.driver.weight_sync import EmbeddedWeightSync, RouteWeightSync
from lego_rl.serving.client import ServingClient
from lego_rl.serving.engine import EmbeddedEngine
from lego_rl.serving.logprobs import teacher_forced_logprobs
from lego_rl.serving.protocol import SamplingParams
from lego_rl.serving.server import EmbeddedServer
from lego_rl.serving.tiny_model import ensure_tiny_model

PROMPT = [1, 10, 72, 105, 300, 12]


class Trainer:
    """The trainer's side: an HF model whose weights move a little before each sync."""

    def __init__(self, model: Any) -> None:
        self.model, self.weight_version = model, 0

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from self.model.state_dict().items()

    def step(self) -> None:
        with torch.no_grad():
            for p in self.model.parameters():
                p.add_(torch.randn_like(p) * 1e-3)
        self.weight_version += 1


async def check_serves(engine: EmbeddedEngine, trainer: Trainer) -> None:
    out = await engine.generate(PROMPT, SamplingParams(max_tokens=8, temperature=0.0), request_id=f"check-{time.time()}",
                                ignore_eos=True)
    ours = teacher_forced_logprobs(trainer.model, PROMPT + out.token_ids, len(PROMPT), 0.0)
    err = float((ours.to("cpu") - torch.tensor(out.logprobs)).abs().max())
    if err >= 1e-4:
        raise AssertionError(f"after the sync the engine's logprobs differ from the trainer's by {err:.2e}")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--model", type=Path, default=None, help="HF model directory (default: the tiny model)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--disk", type=Path, default=Path(tempfile.gettempdir()), help="where the baseline saves")
    ap.add_argument("--stage", type=Path, default=Path("/dev/shm"), help="staging dir of the route sync")
    args = ap.parse_args()
    model_dir = args.model or ensure_tiny_model()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    trainer = Trainer(AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(args.device).eval())
    kw: dict[str, Any] = {"device": args.device, "dtype": args.dtype}
    disk = Path(tempfile.mkdtemp(prefix="lego-sync-bench-", dir=args.disk))
    stage = Path(tempfile.mkdtemp(prefix="lego-sync-stage-", dir=args.stage))
    n_bytes = sum(t.numel() * t.element_size() for t in trainer.model.state_dict().values())
    server = EmbeddedServer(model_dir, **kw)
    await server.start()
    assert server.engine is not None
    engine = server.engine
    client = ServingClient([server.url])
    times: dict[str, list[float]] = {"in-place": [], "routes": [], "disk": [], "restart": []}

    async def in_place() -> None:
        await EmbeddedWeightSync(engine).push(trainer)

    async def routes() -> None:
        await RouteWeightSync(client, stage).push(trainer)

    async def from_disk() -> None:
        target = disk / f"v{trainer.weight_version}"
        await asyncio.to_thread(trainer.model.save_pretrained, target)
        await engine.reload_weights(target)
        await engine.set_version(str(trainer.weight_version))

    restarted: list[EmbeddedEngine] = []

    async def restart() -> None:
        target = disk / f"r{trainer.weight_version}"
        await asyncio.to_thread(trainer.model.save_pretrained, target)
        shutil.copy(model_dir / "config.json", target / "config.json")
        fresh = await asyncio.to_thread(EmbeddedEngine, target, **kw)
        await fresh.start()
        restarted.append(fresh)

    variants: dict[str, Callable[[], Awaitable[None]]] = {
        "in-place": in_place, "routes": routes, "disk": from_disk, "restart": restart}
    order = list(variants)
    try:
        for rnd in range(args.repeats + 1):  # round 0 warms up (page cache, allocator, imports)
            for name in order[rnd % len(order):] + order[: rnd % len(order)]:
                trainer.step()
                t0 = time.perf_counter()
                await variants[name]()
                if torch.cuda.is_available():
                    torch.cuda.synchronize()  # copies are asynchronous on a GPU: time them to the end
                elapsed = time.perf_counter() - t0
                await check_serves(restarted[-1] if name == "restart" else engine, trainer)
                while restarted:
                    await restarted.pop().stop()
                if rnd:
                    times[name].append(elapsed)
    finally:
        await client.close()
        await server.stop()
        shutil.rmtree(disk, ignore_errors=True)
        shutil.rmtree(stage, ignore_errors=True)
    base = statistics.median(times["disk"])
    print(f"model {model_dir.name}: {n_bytes / 2**20:.1f} MiB of weights ({args.dtype}, {args.device}), "
          f"{args.threads} thread(s), {args.repeats} rounds; disk {args.disk}, staging {args.stage}")
    print("| way | median s | range s | vs disk save + reload |")
    print("|---|---|---|---|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med:.4f} | {min(ts):.4f}–{max(ts):.4f} | {med / base:.2f}× |")


if __name__ == "__main__":
    asyncio.run(main())
