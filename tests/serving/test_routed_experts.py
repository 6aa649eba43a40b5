"""MoE routing capture (R3): the embedded engine returns vLLM-shaped routed experts that match a replay."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from lego_rl.errors import ConfigError
from lego_rl.serving.client import ServingClient
from lego_rl.serving.engine import EmbeddedEngine
from lego_rl.serving.errors import UnsupportedExtra
from lego_rl.serving.protocol import SamplingParams
from lego_rl.serving.server import EmbeddedServer
from lego_rl.serving.tiny_model import MOE_SHAPE, ensure_tiny_model


@pytest.fixture(scope="module")
def moe_model() -> Path:
    return ensure_tiny_model(moe=True)


def replayed_experts(model_dir: Path, ids: list[int]) -> list[list[set[int]]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), output_router_logits=True, use_cache=False)
    k = MOE_SHAPE["num_experts_per_tok"]
    per_layer = [layer.topk(k, dim=-1).indices.tolist() for layer in out.router_logits]  # [L][T][k]
    return [[set(per_layer[layer][t]) for layer in range(len(per_layer))] for t in range(len(ids))]


async def test_routed_experts_match_a_replay(moe_model: Path) -> None:
    prompts = [[1, 10, 72, 105, 300], [5, 6, 7]]
    async with EmbeddedServer(moe_model, return_routed_experts=True) as server, \
            ServingClient([server.url]) as c:
        sp = SamplingParams(max_tokens=6, temperature=1.0, seed=3, ignore_eos=True)
        results = await asyncio.gather(*(c.generate(p, sp, return_routed_experts=True) for p in prompts))
    for prompt, r in zip(prompts, results, strict=True):
        assert r.prompt_routed_experts is not None and r.routed_experts is not None
        assert len(r.prompt_routed_experts) == len(prompt) and len(r.routed_experts) == len(r.output_ids)
        assert r.routed_experts[-1] == []  # the last sampled id was never forwarded
        forwarded = prompt + r.output_ids[:-1]
        expected = replayed_experts(moe_model, forwarded)
        got = r.prompt_routed_experts + r.routed_experts[:-1]
        assert [[set(e) for e in token] for token in got] == expected


async def test_dense_model_has_no_routing(tiny_model: Path) -> None:
    with pytest.raises(ConfigError, match="not a mixture-of-experts"):
        EmbeddedEngine(tiny_model, return_routed_experts=True)
    async with EmbeddedServer(tiny_model) as server, ServingClient([server.url]) as c:
        with pytest.raises(UnsupportedExtra):
            await c.generate([1, 2, 3], SamplingParams(max_tokens=2), return_routed_experts=True)
