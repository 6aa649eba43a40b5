"""R3 figures: trainer logprobs against the rollout's, with and without routing replay, on a tiny Qwen3-MoE.

Rollouts come from the embedded engine over HTTP (``--engine-dtype``, default bf16) with routed experts
returned, as two-turn conversations (turn 1's prompt = turn 0's prompt + output + new context), assembled
into Samples by the trajectory manager; the torch trainer backend (fp32 on CPU, bf16 autocast on CUDA)
then recomputes the trained tokens' logprobs three ways: free routing, replayed routing, and a deliberately
misaligned replay (every route shifted by one position: the negative control). Printed per mode: Pearson
correlation with the rollout logprobs, mean |Δ log p|, k3 KL(rollout || trainer), and the fraction of
(token, layer) routes where the trainer's free top-k set equals the rollout's (expert overlap).

    .venv/bin/python benchmarks/routing_replay_bench.py [--rollouts 16] [--tokens 48] [--device cpu]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

from lego_rl.serving.client import ServingClient
from lego_rl.serving.protocol import GenerateResult, SamplingParams
from lego_rl.serving.server import EmbeddedServer
from lego_rl.serving.tiny_model import ensure_tiny_model
from lego_rl.trajectory.manager import TrajectoryOptions, build_samples
from lego_rl.trajectory.records import TurnRecord
from lego_rl.trajectory.sample import Sample
from lego_rl.train.batching import plan_steps
from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings


def _record(turn: int, prompt: list[int], r: GenerateResult, mode: str, bridge: int) -> TurnRecord:
    return TurnRecord(session_id="s", turn=turn, protocol="chat", prompt_ids=prompt, output_ids=r.output_ids,
                      logprobs=r.logprobs, render_mode=mode, bridge_prefix_len=bridge,  # type: ignore[arg-type]
                      finish_reason=r.finish_reason, routed_experts=r.routed_experts,
                      prompt_routed_experts=r.prompt_routed_experts)


async def rollouts(model: Path, n: int, tokens: int, dtype: str, device: str = "cpu", seed: int = 0
                   ) -> list[Sample]:
    """``n`` two-turn rollouts from the engine with routing captured, one Sample each."""
    rng = random.Random(seed)
    sp = SamplingParams(max_tokens=tokens, temperature=1.0, ignore_eos=True, logprobs=1)
    out: list[Sample] = []
    async with EmbeddedServer(model, dtype=dtype, device=device, return_routed_experts=True,
                                    max_batch=8) as server, \
            ServingClient([server.url]) as client:
        async def one(i: int) -> Sample:
            p0 = [rng.randrange(3, 500) for _ in range(24)]
            r0 = await client.generate(p0, sp.model_copy(update={"seed": 2 * i}), return_routed_experts=True)
            p1 = p0 + r0.output_ids + [rng.randrange(3, 500) for _ in range(16)]
            r1 = await client.generate(p1, sp.model_copy(update={"seed": 2 * i + 1}), return_routed_experts=True)
            recs = [_record(0, p0, r0, "full", 0), _record(1, p1, r1, "bridged", len(p0) + len(r0.output_ids))]
            (s,), _ = build_samples(recs, rollout_id=f"r{i}", group_index=i, index=0, reward=1.0,
                                    options=TrajectoryOptions(require_routing=True))
            return s
        out = list(await asyncio.gather(*(one(i) for i in range(n))))
    return out


def shifted(s: Sample) -> Sample:
    """The negative control: every route moved one position later (each token replays its predecessor's)."""
    assert s.routed_experts is not None
    routes = [s.routed_experts[0]] + s.routed_experts[:-1]
    snaps = [p.model_copy(update={"routes": [p.routes[0]] + p.routes[:-1]}) for p in s.prompt_routing]
    # Keep the trained tokens' prefix covered: a shifted empty slot takes its neighbour's route.
    routes = [r or routes[max(0, i - 1)] or routes[min(len(routes) - 1, i + 1)] for i, r in enumerate(routes)]
    return s.model_copy(update={"routed_experts": routes, "prompt_routing": snaps})


def figures(trainer: list[float], rollout: list[float]) -> dict[str, float]:
    a, b = torch.tensor(trainer, dtype=torch.float64), torch.tensor(rollout, dtype=torch.float64)  # [N]
    pearson = float(torch.corrcoef(torch.stack([a, b]))[0, 1])
    log_ratio = a - b  # [N] log pi_train - log pi_roll
    k3 = float((log_ratio.exp() - 1 - log_ratio).mean())  # KL(roll || train), k3 estimator on rollout samples
    return {"pearson": pearson, "mean_abs_dlogp": float(log_ratio.abs().mean()), "kl_k3": k3}


def trained(samples: list[Sample], backend: TorchBackend) -> tuple[list[float], list[float]]:
    steps = plan_steps(samples, [0.0] * len(samples), max_tokens_per_micro_batch=4096)
    mine, theirs = [], []
    for step in steps:
        lps = backend.compute_logprobs(step.micro_batches, temperature=1.0)
        for mb, lp in zip(step.micro_batches, lps, strict=True):
            m = mb.loss_mask > 0  # [T]
            mine += lp[m].tolist()
            theirs += mb.rollout_logprobs[m].tolist()
    return mine, theirs


def route_overlap(samples: list[Sample], backend: TorchBackend) -> dict[str, float]:
    """Free-routing trainer vs rollout routes on every routed position: same top-k set, same top-1 ... as sets
    only (the engine reports its top-k in its own order), so top-1 agreement is not defined here."""
    from lego_rl.serving.routing import RouterRecorder
    from lego_rl.train.routing_replay import sample_routes

    rec = RouterRecorder(backend.model, int(backend.config.num_experts_per_tok))
    same = total = 0
    with torch.no_grad():
        for s in samples:
            got = sample_routes(s)
            assert got is not None
            experts, valid = got  # [n, L, K], [n]
            rec.clear()
            ids = torch.tensor([s.tokens], device=backend.device)  # [1, n]
            with backend._autocast():  # the trainer's own precision
                backend.model(input_ids=ids, use_cache=False)
            free = rec.take()  # [n, L, K]
            a = experts[valid].sort(-1).values  # [v, L, K]
            b = free[valid].long().sort(-1).values  # [v, L, K]
            same += int((a == b).all(-1).sum())
            total += a.shape[0] * a.shape[1]
    return {"expert_set_overlap": same / total}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=48, help="output tokens per turn")
    ap.add_argument("--engine-dtype", default="bfloat16")
    ap.add_argument("--engine-device", default="cpu")
    ap.add_argument("--device", default="cpu", help="the trainer's (cuda: bf16 autocast)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    model = ensure_tiny_model(moe=True)
    t0 = time.perf_counter()
    samples = asyncio.run(rollouts(model, args.rollouts, args.tokens, args.engine_dtype, args.engine_device))
    t_roll = time.perf_counter() - t0
    res: dict[str, Any] = {"rollouts": len(samples), "trained_tokens": sum(s.num_trained_tokens for s in samples),
                           "engine_dtype": args.engine_dtype, "trainer_device": args.device,
                           "rollout_s": round(t_roll, 1)}
    for mode in ("free", "replay", "misaligned"):
        backend = TorchBackend(model, TorchTrainSettings(lr=1e-5, device=args.device,
                                                         routing_replay=mode != "free"))
        data = [shifted(s) for s in samples] if mode == "misaligned" else samples
        res[mode] = figures(*trained(data, backend))
        if mode == "free":
            res[mode].update(route_overlap(samples, backend))
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"{res['rollouts']} two-turn rollouts, {res['trained_tokens']} trained tokens; engine "
          f"{args.engine_dtype}, trainer on {args.device} ({res['rollout_s']} s of rollouts)")
    for mode in ("free", "replay", "misaligned"):
        f = res[mode]
        extra = f"  expert-set overlap {f['expert_set_overlap']:.4f}" if "expert_set_overlap" in f else ""
        print(f"{mode:>10}: pearson {f['pearson']:.5f}  mean|dlogp| {f['mean_abs_dlogp']:.5f}  "
              f"k3 KL {f['kl_k3']:.2e}{extra}")
    ratio = res["free"]["mean_abs_dlogp"] / max(res["replay"]["mean_abs_dlogp"], 1e-12)
    print(f"mean|dlogp| free / replay = {ratio:.2f}x")
    return 0 if all(math.isfinite(res[m]["pearson"]) for m in ("free", "replay")) else 1


if __name__ == "__main__":
    sys.exit(main())
