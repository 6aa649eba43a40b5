"""Client routing: session stickiness, least-loaded placement, retries within a deadline."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from lego_rl.serving.client import ServingClient
from lego_rl.serving.errors import EngineUnavailable
from lego_rl.serving.protocol import SamplingParams
from lego_rl.serving.server import EmbeddedServer, free_port

SP = SamplingParams(max_tokens=4, temperature=0.0)


def test_sticky_and_least_loaded_placement() -> None:
    c = ServingClient(["http://a", "http://b"])
    c._inflight["http://a"] = 3  # a is busy
    assert c.replica_for("s1") == "http://b"
    c._inflight["http://b"] = 10  # b is now busier, but s1 stays where its prefix cache is
    assert c.replica_for("s1") == "http://b"
    assert c.replica_for("s2") == "http://a"
    assert c.replica_for("s1", avoid={"http://b"}) == "http://a"  # a failed replica is avoided...
    assert c.replica_for("s1") == "http://a"  # ...and the session moves with it


async def test_retries_past_a_dead_replica(tiny_model: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with EmbeddedServer(tiny_model) as live, ServingClient([dead, live.url], retry_deadline_s=10) as c:
        c._sticky["s"] = dead
        r = await c.generate([1, 2, 3], SP, session_id="s")
        assert r.replica == live.url and c._sticky["s"] == live.url
        assert (await c.health()) == {dead: False, live.url: True}


async def test_deadline_bounds_retries() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with ServingClient([dead], retry_deadline_s=0.6, backoff_initial_s=0.05) as c:
        t0 = time.monotonic()
        with pytest.raises(EngineUnavailable) as info:
            await c.generate([1, 2, 3], SP)
        elapsed = time.monotonic() - t0
    assert 0.5 < elapsed < 3.0 and info.value.attempts >= 3 and info.value.status_code == 503


async def test_server_started_late_is_reached_within_deadline(tiny_model: Path) -> None:
    port = free_port()
    server = EmbeddedServer(tiny_model, port=port)
    async with ServingClient([server.url], retry_deadline_s=60) as c:
        pending = asyncio.create_task(c.generate([1, 2, 3], SP))
        await asyncio.sleep(0.5)
        assert not pending.done()
        await server.start()
        try:
            r = await asyncio.wait_for(pending, 60)
        finally:
            await server.stop()
    assert len(r.output_ids) == 4


async def test_new_sessions_spread_over_replicas(tiny_model: Path) -> None:
    async with EmbeddedServer(tiny_model) as a, EmbeddedServer(tiny_model) as b, \
            ServingClient([a.url, b.url]) as c:
        rs = await asyncio.gather(*(c.generate([1, 2, 3 + i], SP, session_id=f"s{i}") for i in range(4)))
        assert {r.replica for r in rs} == {a.url, b.url}
        again = await c.generate([1, 2, 3, 9], SP, session_id="s0")
        assert again.replica == rs[0].replica


async def test_abort_while_retrying_ends_the_request() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with ServingClient([dead], retry_deadline_s=30, backoff_max_s=0.2) as c:
        task = asyncio.create_task(c.generate([1, 2, 3], SP, request_id="stuck"))
        await asyncio.sleep(0.5)
        assert not task.done()
        with pytest.raises(EngineUnavailable):
            await c.abort(["stuck"])  # no replica to tell, but the pending request still ends
        r = await asyncio.wait_for(task, 5)
    assert r.finish_reason == "abort" and r.output_ids == []
