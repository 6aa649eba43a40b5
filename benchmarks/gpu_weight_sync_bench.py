"""In-place weight sync at the Qwen3-4B shape on one GPU (issue 31: < 1 s), against its floor in the same run.

The torch trainer backend (fp32 master weights, as it trains) and the embedded engine (the trainer's recipe, the
default on CUDA: fp32 weights with bf16 copies for its matmuls, fast decode path) share one GPU, as ``lego train``
places them on one machine. Each round moves the trainer's weights a little (as an optimizer step would), then:

* ``in_place``: ``EmbeddedWeightSync.push`` — pause, ``update_weights`` (every exported tensor copied into the
  engine's parameters, device to device), the fast path's bf16 copies refreshed, resume — then a
  ``torch.cuda.synchronize`` so the copies' GPU time is counted (the push itself returns once they are queued);
* ``floor``: a bare ``param.copy_`` over the same tensor pairs plus the same bf16 refresh, synchronised: what
  the copies alone cost;
* ``disk`` (``--disk``, one round; slow): the route path's staging checkpoint written and
  ``engine.reload_weights`` from it — what a sync through a checkpoint costs.

After every in-place round the engine's parameters must equal the trainer's and its bf16 copies their casts.
Bytes moved and the implied bandwidth are reported; the H200 copies at about 4.3 TB/s read+write (KINDS.md).

    python benchmarks/gpu_weight_sync_bench.py --repeats 5 --out sync.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_backend_bench import build_model  # noqa: E402

from lego_rl.driver.weight_sync import EmbeddedWeightSync, write_checkpoint  # noqa: E402
from lego_rl.serving.engine import EmbeddedEngine  # noqa: E402
from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings  # noqa: E402


def nudge(backend: TorchBackend) -> None:
    """What an optimizer step does to the weights, for the sync's purpose: every parameter changes."""
    with torch.no_grad():
        for p in backend.model.parameters():
            p.mul_(1.0 + 1e-3)
    backend._version += 1  # benchmark only: the version a real step would have counted


def check_equal(backend: TorchBackend, engine: EmbeddedEngine) -> None:
    mine = dict(engine.model.named_parameters())
    for name, p in backend.export_weights():
        if not torch.equal(mine[name], p):
            raise AssertionError(f"after the sync the engine's {name} differs from the trainer's")
    dec = engine._static
    if dec is not None:
        for params, copy in dec._copies:
            want = torch.cat([w.detach() for w in params], dim=0).to(copy.dtype)
            if not torch.equal(copy, want):
                raise AssertionError("the fast path's bf16 copies were not refreshed")


async def main_async(a: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "model": a.model}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        model_dir = build_model(a.model, Path(tmp) / "model")
        out["build_s"] = round(time.perf_counter() - t0, 1)
        torch.cuda.empty_cache()
        backend = TorchBackend(model_dir, TorchTrainSettings(lr=1e-6, device="cuda"))
        engine = EmbeddedEngine(model_dir, device="cuda", dtype="float32", compute_dtype="bfloat16", fast=True,
                                max_batch=8, max_model_len=a.max_len)
        await engine.start()
        sync = EmbeddedWeightSync(engine)
        served = dict(engine.model.named_parameters())
        pairs = [(p, served[name]) for name, p in backend.export_weights()]
        out["bytes"] = sum(p.numel() * p.element_size() for p, _ in pairs)
        out["gpu_memory_gib"] = round(torch.cuda.memory_allocated() / 2**30, 1)
        rounds: dict[str, list[float]] = {"in_place": [], "in_place_reported": [], "floor": []}
        for r in range(a.repeats + 1):  # the first round warms up (allocator, lazy init)
            nudge(backend)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            report = await sync.push(backend)
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
            check_equal(backend, engine)
            nudge(backend)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.no_grad():
                for src, dst in pairs:
                    dst.copy_(src)
                if engine._static is not None:
                    engine._static.refresh_weights()
            torch.cuda.synchronize()
            floor = time.perf_counter() - t0
            if r:
                rounds["in_place"].append(wall)
                rounds["in_place_reported"].append(report.seconds)
                rounds["floor"].append(floor)
            print(json.dumps({"round": r, "in_place_s": round(wall, 4), "reported_s": round(report.seconds, 4),
                              "floor_s": round(floor, 4)}), flush=True)
        for key, vals in rounds.items():
            out[f"{key}_median_s"] = round(statistics.median(vals), 4)
            out[f"{key}_range_s"] = [round(min(vals), 4), round(max(vals), 4)]
        # Bytes the copies read and write: fp32 params (read + write) and the bf16 copies (fp32 read, bf16 write).
        bf16 = sum(c.numel() for _, c in engine._static._copies) if engine._static is not None else 0
        traffic = 2 * out["bytes"] + 6 * bf16
        out["copy_traffic_gb"] = round(traffic / 1e9, 2)
        out["in_place_tb_s"] = round(traffic / out["in_place_median_s"] / 1e12, 2)
        out["floor_tb_s"] = round(traffic / out["floor_median_s"] / 1e12, 2)
        if a.disk:
            nudge(backend)
            stage = Path(tmp) / "stage"
            t0 = time.perf_counter()
            write_checkpoint(backend, stage)
            t1 = time.perf_counter()
            await engine.reload_weights(stage)
            torch.cuda.synchronize()
            out["disk_write_s"], out["disk_reload_s"] = round(t1 - t0, 2), round(time.perf_counter() - t1, 2)
        await engine.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["tiny", "qwen3-0.6b", "qwen3-4b"], default="qwen3-4b")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-len", type=int, default=4096)
    ap.add_argument("--disk", action="store_true", help="also one round through a staged checkpoint (slow)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    result = asyncio.run(main_async(a))
    print(json.dumps(result), flush=True)
    if a.out:
        a.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
