"""Weight sync into the real embedded engine, from a real HF model standing in the trainer's place.

The weight source is a plain transformers model of the tiny checkpoint whose parameters the tests change, as
an optimizer step would: ``export_weights()`` and ``weight_version`` are all a sync sees of a trainer backend.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.model_weights import ModelWeights
from support.numerics import forward_tolerance
import torch

from lego_rl.driver.weight_sync import EmbeddedWeightSync, RouteWeightSync, write_checkpoint
from lego_rl.serving.client import ServingClient
from lego_rl.serving.engine import EmbeddedEngine
from lego_rl.serving.errors import WeightUpdateRejected
from lego_rl.serving.logprobs import teacher_forced_logprobs
from lego_rl.serving.protocol import SamplingParams
from lego_rl.serving.server import EmbeddedServer
from lego_rl.serving.tiny_model import ensure_tiny_model

PROMPT = [1, 10, 72, 105, 300, 12]
# Engine decode against a teacher-forced HF forward of the same fp32 weights: two paths through the whole
# forward, so ulps at the logits' magnitude (tests/support/numerics.py); new or stale weights are off by ~1e-1.
FWD = forward_tolerance(1.0)


@pytest.fixture(scope="module")
def tiny_model() -> Path:
    return ensure_tiny_model()


def hf_model() -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(ensure_tiny_model(), attn_implementation="sdpa").eval()


@pytest.fixture
async def engine() -> AsyncIterator[EmbeddedEngine]:
    e = EmbeddedEngine(ensure_tiny_model(), max_batch=8)
    await e.start()
    yield e
    await e.stop()


def max_delta(model: Any, prompt: list[int], out: Any, temperature: float = 1.0) -> float:
    ours = teacher_forced_logprobs(model, prompt + out.token_ids, len(prompt), temperature)
    return float((ours - torch.tensor(out.logprobs)).abs().max())


async def test_sync_in_place_then_engine_logprobs_equal_the_trainers(engine: EmbeddedEngine) -> None:
    trainer = ModelWeights(hf_model())
    engine_model = engine.model
    sp = SamplingParams(max_tokens=48, temperature=1.0, seed=3)
    before = await engine.generate(PROMPT, sp, request_id="before", ignore_eos=True)
    trainer.step(seed=0)
    sync = EmbeddedWeightSync(engine)
    with pytest.raises(ValueError, match="asked to sync version 2 but the trainer's weights are version 1"):
        await sync(trainer, 2)
    await sync(trainer, 1)  # the loop's hook shape: sync(backend, version)
    report = sync.last
    assert report is not None
    after = await engine.generate(PROMPT, sp, request_id="after", ignore_eos=True)
    assert engine.model is engine_model and not engine.paused  # in place: no new model, no restart
    assert report.version == 1 and engine.version == "1" and report.bytes > 0
    assert set(before.versions) == {"default"} and set(after.versions) == {"1"}
    assert after.logprobs != before.logprobs
    assert max_delta(trainer.model, PROMPT, after) < FWD  # fp32 CPU: the engine now is the trainer's model


async def test_prefix_cache_of_old_weights_is_never_reused(engine: EmbeddedEngine) -> None:
    trainer = ModelWeights(hf_model())
    sp = SamplingParams(max_tokens=24, temperature=1.0, seed=5)
    first = await engine.generate(PROMPT, sp, request_id="t1", ignore_eos=True)
    turn2 = PROMPT + first.token_ids + [7, 8, 9]  # the next turn extends the previous prompt + output
    hits = engine.prefix_cache.hits
    control = await engine.generate(turn2, sp, request_id="t2-control", ignore_eos=True)
    assert engine.prefix_cache.hits == hits + 1  # without a sync the cached prefix is reused
    trainer.step(seed=1)
    await EmbeddedWeightSync(engine).push(trainer)
    hits = engine.prefix_cache.hits
    second = await engine.generate(turn2, sp, request_id="t2", ignore_eos=True)
    assert engine.prefix_cache.hits == hits  # nothing cached under the old weights was looked up
    assert max_delta(trainer.model, turn2, second) < FWD
    assert control.logprobs != second.logprobs


async def test_a_request_in_flight_finishes_on_the_old_weights(engine: EmbeddedEngine) -> None:
    trainer = ModelWeights(hf_model())
    old = copy.deepcopy(trainer.model)
    long = asyncio.create_task(engine.generate(PROMPT, SamplingParams(max_tokens=300, temperature=1.0, seed=9),
                                               request_id="long", ignore_eos=True))
    while not engine._rows or len(engine._rows[0].out.token_ids) < 20:  # mid-generation
        await asyncio.sleep(0.01)
    trainer.step(seed=2)
    push = asyncio.create_task(EmbeddedWeightSync(engine).push(trainer))
    await asyncio.sleep(0.05)
    assert not push.done()  # the sync waits for the request in flight
    late = asyncio.create_task(engine.generate(PROMPT, SamplingParams(max_tokens=16, temperature=1.0, seed=9),
                                               request_id="late", ignore_eos=True))
    report = await push
    done, arrived = await long, await late
    assert done.finish_reason == "length" and len(done.token_ids) == 300
    assert set(done.versions) == {"default"}  # the whole turn on the old weights, tagged so
    assert max_delta(old, PROMPT, done) < FWD
    assert set(arrived.versions) == {"1"}  # queued during the sync, ran wholly on the new weights
    assert max_delta(trainer.model, PROMPT, arrived) < FWD
    assert report.drain_seconds > 0


async def test_keep_pause_recomputes_frozen_rows_under_new_weights(tiny_model: Path, tmp_path: Path) -> None:
    """ServingClient.update_weights(pause_mode="keep"): the frozen request continues on the new weights, and
    its KV is recomputed first: tokens after the split match the new model given the whole prefix."""
    trainer = ModelWeights(hf_model())
    old = copy.deepcopy(trainer.model)
    trainer.step(seed=3)
    write_checkpoint(trainer, tmp_path / "v1")
    async with EmbeddedServer(tiny_model) as server, ServingClient([server.url]) as c:
        task = asyncio.create_task(c.generate(PROMPT, SamplingParams(max_tokens=300, seed=4, ignore_eos=True)))
        assert server.engine is not None
        while not server.engine._rows or len(server.engine._rows[0].out.token_ids) < 20:
            await asyncio.sleep(0.01)
        await c.update_weights(tmp_path / "v1", 1, pause_mode="keep")
        r = await asyncio.wait_for(task, 120)
    assert [s.version for s in r.weight_versions] == [0, 1]
    split = r.weight_versions[1].start
    ids = PROMPT + r.output_ids
    old_lp = teacher_forced_logprobs(old, ids, len(PROMPT), 1.0)[:split]
    new_lp = teacher_forced_logprobs(trainer.model, ids, len(PROMPT), 1.0)[split:]
    got = torch.tensor(r.logprobs)
    assert float((old_lp - got[:split]).abs().max()) < FWD
    assert float((new_lp - got[split:]).abs().max()) < FWD


class BadWeights(ModelWeights):
    """The model's weights with one entry spoiled at position ``at`` (a wrong name or a wrong shape)."""

    def __init__(self, model: Any, version: int, at: int, spoil: str) -> None:
        super().__init__(model, version)
        self.at, self.spoil = at, spoil

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        for i, (name, t) in enumerate(self.model.state_dict().items()):
            if i == self.at:
                yield (name + ".typo", t) if self.spoil == "name" else (name, t[:1])
            else:
                yield name, t


async def test_bad_exports_are_refused_by_name_and_lose_nothing(engine: EmbeddedEngine) -> None:
    trainer = ModelWeights(hf_model())
    sp = SamplingParams(max_tokens=12, temperature=0.0)
    before = await engine.generate(PROMPT, sp, request_id="b", ignore_eos=True)
    trainer.step(seed=4)
    # Refused at the first tensor: nothing was copied, the engine keeps serving the old weights.
    with pytest.raises(WeightUpdateRejected, match=r"model.embed_tokens.weight.typo' is not a parameter"):
        await EmbeddedWeightSync(engine).push(BadWeights(trainer.model, 1, at=0, spoil="name"))
    same = await engine.generate(PROMPT, sp, request_id="same", ignore_eos=True)
    assert set(same.versions) == {"default"} and same.token_ids == before.token_ids
    assert max(abs(a - b) for a, b in zip(same.logprobs, before.logprobs, strict=True)) < 1e-5  # old weights: same engine, shapes and kernels
    # Refused half-way: the weights are a mix, so the engine stays paused until a complete push.
    with pytest.raises(WeightUpdateRejected, match=r"q_norm.weight. has shape \(1,\), the model.s is \(64,\)") as info:
        await EmbeddedWeightSync(engine).push(BadWeights(trainer.model, 1, at=5, spoil="shape"))
    assert info.value.parameter is not None and engine.paused and engine.weights_damaged
    with pytest.raises(WeightUpdateRejected, match="stays paused"):
        await engine.resume()
    waiting = asyncio.create_task(engine.generate(PROMPT, sp, request_id="waiting", ignore_eos=True))
    await asyncio.sleep(0.1)
    assert not waiting.done()  # queued, not lost
    await EmbeddedWeightSync(engine).push(trainer)
    out = await asyncio.wait_for(waiting, 30)
    assert set(out.versions) == {"1"} and max_delta(trainer.model, PROMPT, out) < FWD


async def test_route_sync_to_the_embedded_server(tiny_model: Path, tmp_path: Path) -> None:
    """The same routes vLLM answers, here on the embedded engine's server: staged checkpoint, wait-pause."""
    trainer = ModelWeights(hf_model())
    async with EmbeddedServer(tiny_model) as server, ServingClient([server.url]) as c:
        sync = RouteWeightSync(c, tmp_path / "stage")
        for seed in (5, 6):
            trainer.step(seed)
            report = await sync.push(trainer)
            r = await c.generate(PROMPT, SamplingParams(max_tokens=32, seed=1, ignore_eos=True))
            assert report.version == trainer.weight_version == await c.weight_version()
            assert {s.version for s in r.weight_versions} == {trainer.weight_version}
            ours = teacher_forced_logprobs(trainer.model, PROMPT + r.output_ids, len(PROMPT), 1.0)
            assert float((ours - torch.tensor(r.logprobs)).abs().max()) < FWD
    assert [p.name for p in (tmp_path / "stage").iterdir()] == ["v2"]  # older staged versions are removed


@pytest.mark.slow
async def test_every_trained_token_carries_the_version_that_sampled_it(tiny_model: Path) -> None:
    """End to end: adapter turns on the embedded server, a sync between them, the turn records, the Samples."""
    from lego_rl.adapter.canonical import CanonicalRequest, Message
    from lego_rl.adapter.core import AdapterCore, SamplingDefaults
    from lego_rl.adapter.sessions import SessionRegistry
    from lego_rl.chat.render import ChatRenderer
    from lego_rl.trajectory.manager import build_samples

    renderer = ChatRenderer.from_pretrained(tiny_model)
    trainer = ModelWeights(hf_model())
    async with EmbeddedServer(tiny_model) as server, ServingClient([server.url]) as client:
        assert server.engine is not None
        core = AdapterCore(renderer, client, max_context_tokens=2048, max_response_tokens=16,
                           sampling=SamplingDefaults(temperature=1.0, top_p=0.95))
        session = SessionRegistry().open("versions")
        history = [Message(role="user", content="Say something.")]
        for turn in range(3):
            reply = await core.run_turn(session, CanonicalRequest(protocol="chat", messages=history))
            history += [Message(role="assistant", content=reply.text, tool_calls=reply.tool_calls),
                        Message(role="user", content=f"Again {turn}.")]
            if turn < 2:
                trainer.step(seed=10 + turn)
                await EmbeddedWeightSync(server.engine).push(trainer)
    records = session.records
    assert [set(r.weight_versions) for r in records] == [{0}, {1}, {2}]
    samples, _ = build_samples(records, rollout_id="r", group_index=0, index=0, reward=1.0)
    seen: dict[int, int] = {}
    for s in samples:
        for m, v in zip(s.loss_mask, s.weight_versions, strict=True):
            if m:  # a trained token always has a version; context has -1
                assert v >= 0
                seen[v] = seen.get(v, 0) + 1
    assert sorted(seen) == [0, 1, 2]
    assert sum(seen.values()) == sum(len(r.output_ids) for r in records)
    for s in samples:  # each turn's span holds exactly its record's version
        for span in s.turn_spans:
            assert set(s.weight_versions[span.start:span.end]) == {records[span.turn].weight_versions[0]}


async def test_keep_in_flight_sync_does_not_wait_and_splits_the_turn_by_version(engine: EmbeddedEngine) -> None:
    """``in_flight = "keep"``: the sync returns while a long generation is still running; that turn's tokens
    before the swap carry the old version and old-weights logprobs, the rest the new ones."""
    trainer = ModelWeights(hf_model())
    old = copy.deepcopy(trainer.model)
    long = asyncio.create_task(engine.generate(PROMPT, SamplingParams(max_tokens=300, temperature=1.0, seed=9),
                                               request_id="long", ignore_eos=True))
    while not engine._rows or len(engine._rows[0].out.token_ids) < 20:  # mid-generation
        await asyncio.sleep(0.01)
    trainer.step(seed=2)
    report = await EmbeddedWeightSync(engine, in_flight="keep").push(trainer)
    assert not long.done()  # the sync did not wait for it
    done = await long
    assert len(done.token_ids) == 300 and set(done.versions) == {"default", "1"}
    split = done.versions.index("1")
    ids = PROMPT + done.token_ids
    got = torch.tensor(done.logprobs)
    old_lp = teacher_forced_logprobs(old, ids, len(PROMPT), 1.0)[:split]
    new_lp = teacher_forced_logprobs(trainer.model, ids, len(PROMPT), 1.0)[split:]
    assert float((old_lp - got[:split]).abs().max()) < FWD
    assert float((new_lp - got[split:]).abs().max()) < FWD
    assert report.drain_seconds < 1.0


async def test_route_sync_reaches_every_replica_and_keeps_sessions_sticky(tiny_model: Path, tmp_path: Path) -> None:
    """Several URLs (vLLM replicas; here two embedded servers on the same routes): each one is synced and
    labelled, and a session keeps going to the replica it was on."""
    trainer = ModelWeights(hf_model())
    async with (EmbeddedServer(tiny_model) as a, EmbeddedServer(tiny_model) as b,
                ServingClient([a.url, b.url]) as c):
        sp = SamplingParams(max_tokens=8, seed=1, ignore_eos=True)
        await asyncio.gather(*(c.generate(PROMPT, sp, session_id=f"s{i}") for i in range(4)))
        before = {f"s{i}": c.replica_for(f"s{i}") for i in range(4)}
        assert set(before.values()) == {a.url, b.url}  # sessions were spread over both replicas
        trainer.step(seed=7)
        report = await RouteWeightSync(c, tmp_path / "stage", in_flight="wait").push(trainer)
        assert report.version == 1 and await c.weight_versions() == {a.url: 1, b.url: 1}
        assert {s: c.replica_for(s) for s in before} == before
        for s in before:
            r = await c.generate(PROMPT, sp, session_id=s)
            assert {w.version for w in r.weight_versions} == {1}
            ours = teacher_forced_logprobs(trainer.model, PROMPT + r.output_ids, len(PROMPT), 1.0)
            assert float((ours - torch.tensor(r.logprobs)).abs().max()) < FWD
