"""One huge request must not stall the adapter: other sessions and /health are answered meanwhile, and
a request whose text alone exceeds the context window is answered as a full window is (a 400: Anthropic's
"prompt is too long", OpenAI's context_length_exceeded) before any rendering."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from test_server import GOOD, PROTOCOLS
from test_server_sizes import file_text, one_message


async def probe_while(h: Any, task: asyncio.Task[Any]) -> list[float]:
    """Latencies of /health probes sent one after another until ``task`` is done."""
    latencies: list[float] = []
    while not task.done():
        t0 = time.perf_counter()
        r = await h.client.get("/health")
        assert r.status == 200
        latencies.append(time.perf_counter() - t0)
        await asyncio.sleep(0.02)
    return latencies


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_ten_mib_message_is_refused_before_rendering(make_harness, protocol: str) -> None:
    h = await make_harness(max_context_tokens=65536, max_body_bytes=32 * 1024 * 1024, score=False)
    data = one_message(protocol, file_text(10 * 1024 * 1024, seed=3))
    t0 = time.perf_counter()
    r = await h.client.post(GOOD[protocol][0], json=data, headers={"Authorization": "Bearer sess-a"})
    elapsed = time.perf_counter() - t0
    # Answered as a full window is (a 400 in the protocol's shape), without rendering it.
    assert r.status == 400, await r.text()
    await r.read()
    session = h.sessions.get("sess-a")
    assert session.records == [] and h.engine.calls == [] and session.termination == "context_limit"
    # Rendering it took ~14 s (3.5M ids, 1.3 GB) before; the size check needs no tokenisation.
    assert elapsed < 10, elapsed


async def test_other_sessions_are_served_while_a_huge_request_renders(make_harness) -> None:
    # A window large enough that the 3 MiB message is really rendered and tokenised (seconds of work).
    h = await make_harness(["Big done.", "Small done."], max_context_tokens=50_000_000,
                           max_body_bytes=32 * 1024 * 1024, sessions=("big", "small"), score=False)
    data = one_message("chat", file_text(3 * 1024 * 1024, seed=4))
    t0 = time.perf_counter()
    big = asyncio.ensure_future(h.client.post("/v1/chat/completions", json=data,
                                              headers={"Authorization": "Bearer big"}))
    await asyncio.sleep(0.3)  # the body is on its way; probing starts while the adapter works on it
    probes = asyncio.ensure_future(probe_while(h, big))
    t_small = time.perf_counter()
    small = await h.client.post("/v1/chat/completions", json=GOOD["chat"][1], headers={"Authorization": "Bearer small"})
    small_s = time.perf_counter() - t_small
    assert small.status == 200
    r = await big
    big_s = time.perf_counter() - t0
    latencies = await probes
    assert r.status == 200, await r.text()
    assert len(h.sessions.get("big").records[0].prompt_ids) > 1_000_000
    assert not big.exception() and len(latencies) >= 3, (big_s, latencies)
    # On the event loop, each probe and the other session waited for the whole render (~big_s).
    assert max(latencies) < big_s / 4 and small_s < big_s / 2, (big_s, small_s, max(latencies))


async def test_a_large_body_is_not_queued_behind_other_sessions_renders(make_harness, tmp_path) -> None:
    """Renders run on the core's own threads: with every render thread busy (and more renders waiting,
    more than the loop's default pool has threads), a 1 MiB over-window request is still decoded on the
    default pool, refused as context_length_exceeded, and its session status fsynced."""
    import threading

    sids = [f"s{i}" for i in range(8)]
    h = await make_harness(max_context_tokens=2048, sessions=(*sids, "big"), score=False, records_dir=tmp_path)
    gate = threading.Event()
    real_plan = h.core.bridge.plan

    def held_plan(*args: Any) -> Any:  # TEST DOUBLE: a render that takes as long as the test wants
        gate.wait(60)
        return real_plan(*args)

    h.core.bridge.plan = held_plan
    renders = [asyncio.ensure_future(h.client.post("/v1/chat/completions", json=GOOD["chat"][1],
                                                   headers={"Authorization": f"Bearer {sid}"})) for sid in sids]
    try:
        await asyncio.sleep(0.5)  # every render thread is now held, the other renders queue for them
        big = one_message("chat", file_text(1024 * 1024, seed=5))
        r = await asyncio.wait_for(h.client.post("/v1/chat/completions", json=big,
                                                 headers={"Authorization": "Bearer big"}), 30)
        assert r.status == 400, await r.text()
        assert (await r.json())["error"]["code"] == "context_length_exceeded"
        assert h.sessions.get("big").termination == "context_limit"
        assert (tmp_path / "big.session.json").exists()
        assert not any(t.done() for t in renders)  # they were still held while the big one was answered
    finally:
        gate.set()
    for r in await asyncio.gather(*renders):
        assert r.status == 200
