"""The embedded engine behind its HTTP server, driven by the real client."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
import torch

from lego_rl.serving.client import ServingClient
from lego_rl.serving.errors import EngineRejected
from lego_rl.serving.protocol import SamplingParams
from lego_rl.serving.server import EmbeddedServer
from support.numerics import forward_tolerance, rounding_tolerance

PROMPT = [1, 10, 72, 105, 300, 12]


async def test_greedy_is_deterministic_and_batching_invariant(engine_url: str, vocab_size: int) -> None:
    async with ServingClient([engine_url], vocab_size=vocab_size) as c:
        greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
        alone = await c.generate(PROMPT, greedy)
        prompts = [PROMPT] + [[1, 20 + i, 30 + i] for i in range(5)]
        together = await asyncio.gather(*(c.generate(p, greedy) for p in prompts))
    assert alone.finish_reason == "length" and len(alone.output_ids) == 12
    assert together[0].output_ids == alone.output_ids
    for a, b in zip(together[0].logprobs, alone.logprobs, strict=True):
        # Padding and batch size do not move the numbers beyond rounding: a batch of 6 and a batch of 1 run
        # other matmul shapes, so other kernels, through the whole forward.
        assert abs(a - b) < forward_tolerance(0.0)
    assert all(r.weight_versions[0].version == 0 for r in together)


async def test_seed_reproduces_and_differs(engine_url: str, vocab_size: int) -> None:
    async with ServingClient([engine_url], vocab_size=vocab_size) as c:
        sp = SamplingParams(max_tokens=20, temperature=1.0, seed=7, ignore_eos=True)
        a, b = await asyncio.gather(c.generate(PROMPT, sp), c.generate(PROMPT, sp))
        other = await c.generate(PROMPT, sp.model_copy(update={"seed": 8}))
    assert a.output_ids == b.output_ids and a.output_ids != other.output_ids


async def test_stop_ids_and_max_tokens(engine_url: str, vocab_size: int) -> None:
    async with ServingClient([engine_url], vocab_size=vocab_size) as c:
        free = await c.generate(PROMPT, SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))
        stop_at = free.output_ids[4]
        first = free.output_ids.index(stop_at)
        stopped = await c.generate(PROMPT, SamplingParams(max_tokens=30, temperature=0.0,
                                                          stop_token_ids=[stop_at]))
    assert stopped.finish_reason == "stop"
    assert stopped.output_ids == free.output_ids[: first + 1]  # the stop id is included, as in vLLM


async def test_abort_returns_partial_output(engine_url: str, vocab_size: int) -> None:
    async with ServingClient([engine_url], vocab_size=vocab_size) as c:
        task = asyncio.create_task(c.generate(PROMPT, SamplingParams(max_tokens=5000, ignore_eos=True),
                                              request_id="long-one"))
        await asyncio.sleep(0.5)
        await c.abort(["long-one"])
        r = await asyncio.wait_for(task, 30)
    assert r.finish_reason == "abort" and 0 < len(r.output_ids) < 5000
    assert len(r.logprobs) == len(r.output_ids)


async def test_bad_requests_get_vllm_400(engine_url: str) -> None:
    async with aiohttp.ClientSession() as s:
        async def post(body: object) -> tuple[int, dict]:
            async with s.post(engine_url + "/inference/v1/generate", json=body) as r:
                return r.status, await r.json()

        for body, param in [({"token_ids": []}, "token_ids"), ({"token_ids": [10**6]}, "token_ids"),
                            ({"token_ids": [1], "sampling_params": {"max_tokens": 0}}, "max_tokens"),
                            ({"token_ids": [1], "sampling_params": {"temperature": "hot"}}, "temperature"),
                            ({"token_ids": [1] * 70000}, "token_ids")]:
            status, data = await post(body)
            assert status == 400, body
            assert data["error"]["code"] == 400 and data["error"]["param"] == param
            assert data["error"]["type"] == "BadRequestError" and data["error"]["message"]
        async with s.post(engine_url + "/inference/v1/generate", data=b"{not json") as r:
            assert r.status == 400
        status, data = await post({"token_ids": [1, 2], "extra_field": True,
                                   "sampling_params": {"max_tokens": 2, "logprobs": 0, "unknown_knob": 1}})
        assert status == 200 and data["request_id"].startswith("generate-tokens-")
        assert len(data["choices"][0]["logprobs"]["content"]) == len(data["choices"][0]["token_ids"])


async def test_client_raises_typed_error_on_400(engine_url: str) -> None:
    async with ServingClient([engine_url]) as c:
        with pytest.raises(EngineRejected) as info:
            await c.generate([1] * 65536, SamplingParams(max_tokens=1))
    assert info.value.status_code == 400 and info.value.param == "token_ids"
    assert "longer than the maximum model length of 65536" in str(info.value)


async def test_nucleus_capture(engine_url: str, vocab_size: int) -> None:
    async with ServingClient([engine_url], vocab_size=vocab_size) as c:
        r = await c.generate(PROMPT, SamplingParams(max_tokens=8, top_p=0.5, seed=1, ignore_eos=True),
                             return_nucleus=True)
    assert r.nucleus is not None and len(r.nucleus) == 8
    for tok, entry in zip(r.output_ids, r.nucleus, strict=True):
        # fp32 probabilities renormalised over the nucleus: sums of len(ids) values <= 1 (engine, here).
        mass_tol = rounding_tolerance(torch.float32, magnitude=1.0, terms=2 * len(entry.ids))
        assert tok in entry.ids and abs(sum(entry.probs) - 1) < mass_tol
        assert len(entry.ids) < vocab_size


async def test_weight_update_from_directory_and_state_dict(tiny_model: Path, tmp_path: Path,
                                                           vocab_size: int) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    model.save_pretrained(tmp_path / "ckpt")
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    async with EmbeddedServer(tiny_model) as server, ServingClient([server.url], vocab_size=vocab_size) as c:
        before = await c.generate(PROMPT, greedy)
        await c.update_weights(tmp_path / "ckpt", 1)
        assert await c.weight_version() == 1
        after = await c.generate(PROMPT, greedy)
        assert after.weight_versions[0].version == 1 and after.logprobs != before.logprobs
        assert server.engine is not None
        original = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
        await server.engine.load_state_dict(original, 2)
        again = await c.generate(PROMPT, greedy)
        assert again.output_ids == before.output_ids and again.version_of(0) == 2
        # Same numbers too: no KV computed under the other weights was reused from the prefix cache. Like
        # with like (same prompt, shapes and weights), so they repeat; KV from the 1.5x weights would move
        # them by far more.
        assert max(abs(a - b) for a, b in zip(again.logprobs, before.logprobs, strict=True)) < 1e-5
        with pytest.raises(EngineRejected, match="does not exist"):
            await c.update_weights(tmp_path / "missing", 3)
        assert await c.weight_version() == 2


async def test_pause_keep_splits_versions_mid_generation(tiny_model: Path, vocab_size: int) -> None:
    async with EmbeddedServer(tiny_model) as server, ServingClient([server.url], vocab_size=vocab_size) as c:
        task = asyncio.create_task(c.generate(PROMPT, SamplingParams(max_tokens=400, ignore_eos=True)))
        await asyncio.sleep(0.3)
        await c.pause("keep")
        assert server.engine is not None
        await server.engine.set_version("5")
        await c.resume()
        r = await asyncio.wait_for(task, 120)
    assert r.finish_reason == "length"
    assert [s.version for s in r.weight_versions] == [0, 5]
    assert r.weight_versions[0].end == r.weight_versions[1].start > 0


async def test_late_request_joins_running_batch(tiny_model: Path) -> None:
    from lego_rl.serving.engine import EmbeddedEngine

    engine = EmbeddedEngine(tiny_model)
    await engine.start()
    try:
        sp = SamplingParams(max_tokens=60, temperature=0.0)
        first = asyncio.create_task(engine.generate(PROMPT, sp, request_id="first", ignore_eos=True))
        while engine.steps < 10:
            await asyncio.sleep(0.01)
        second = await engine.generate([1, 2, 3], sp, request_id="second", ignore_eos=True)
        await first
        alone = await engine.generate([1, 2, 3], sp, request_id="alone", ignore_eos=True)
    finally:
        await engine.stop()
    # The second request decoded alongside the first (continuous batching), with identical results.
    assert engine.steps < 60 + 60 + 60 - 30
    assert second.token_ids == alone.token_ids


async def test_client_hangup_aborts_the_request(tiny_model: Path) -> None:
    async with EmbeddedServer(tiny_model) as server:
        body = {"token_ids": PROMPT, "sampling_params": {"max_tokens": 20000, "ignore_eos": True}}
        async with aiohttp.ClientSession() as s:
            with pytest.raises(asyncio.TimeoutError):
                async with s.post(server.url + "/inference/v1/generate", json=body,
                                  timeout=aiohttp.ClientTimeout(total=0.5)):
                    pass
        assert server.engine is not None
        for _ in range(200):
            if server.engine.load == 0:
                break
            await asyncio.sleep(0.05)
        assert server.engine.load == 0  # the engine stopped working on it


async def test_engine_failure_is_a_500_and_the_engine_recovers(tiny_model: Path, vocab_size: int) -> None:
    from lego_rl.serving.errors import EngineFailed

    async with EmbeddedServer(tiny_model) as server, ServingClient([server.url], vocab_size=vocab_size) as c:
        assert server.engine is not None
        real_forward = server.engine._forward

        def broken(*args: object, **kw: object) -> torch.Tensor:
            raise RuntimeError("simulated device failure")

        server.engine._forward = broken  # type: ignore[method-assign]
        with pytest.raises(EngineFailed, match="simulated device failure") as info:
            await c.generate(PROMPT, SamplingParams(max_tokens=4))
        assert info.value.status == 500
        server.engine._forward = real_forward  # type: ignore[method-assign]
        # ignore_eos: the random tiny model may sample its end token early, which is not what is under test.
        r = await c.generate(PROMPT, SamplingParams(max_tokens=4, ignore_eos=True))
        assert len(r.output_ids) == 4
