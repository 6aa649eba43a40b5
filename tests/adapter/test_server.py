"""The adapter's HTTP edge, for every protocol: sessions, body limits, error shapes, well-formed streams."""

from __future__ import annotations

from typing import Any

import pytest
from support.sse import parse_sse

from lego_rl.serving.protocol import GenerateResult, SamplingParams

GOOD = {
    "anthropic": ("/v1/messages", {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}),
    "responses": ("/v1/responses", {"model": "m", "input": "hi", "store": False}),
    "chat": ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
}
PROTOCOLS = list(GOOD)


def error_message(protocol: str, payload: dict[str, Any]) -> str:
    """The message of a protocol's JSON error body, checking the body has that protocol's shape."""
    if protocol == "anthropic":
        assert payload["type"] == "error" and set(payload["error"]) == {"type", "message"}
        return payload["error"]["message"]
    assert set(payload["error"]) == {"message", "type", "param", "code"}
    return payload["error"]["message"]


async def post(h: Any, protocol: str, *, data: Any = None, json_body: Any = None, key: str | None = "sess-a",
               path: str | None = None) -> Any:
    url = path or GOOD[protocol][0]
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if json_body is None and data is None:
        json_body = GOOD[protocol][1]
    return await h.client.post(url, json=json_body, data=data, headers=headers)


def assert_nothing_recorded(h: Any) -> None:
    session = h.sessions.get("sess-a")
    assert session.records == [] and h.engine.calls == [] and session.infra_failure is None


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_malformed_json_is_400_in_protocol_shape(make_harness, protocol: str) -> None:
    h = await make_harness()
    r = await post(h, protocol, data=b'{"model": "m", "messages": [', key="sess-a")
    assert r.status == 400
    assert "request body is not valid JSON" in error_message(protocol, await r.json())
    assert_nothing_recorded(h)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_body_must_be_an_object(make_harness, protocol: str) -> None:
    h = await make_harness()
    r = await post(h, protocol, json_body=[1, 2])
    assert r.status == 400
    assert "expected a JSON object, got an array" in error_message(protocol, await r.json())


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_oversized_body_is_413(make_harness, protocol: str) -> None:
    h = await make_harness(max_body_bytes=2000)
    good = GOOD[protocol][1]
    big = dict(good, model="m" * 5000)
    r = await post(h, protocol, json_body=big)
    assert r.status == 413
    msg = error_message(protocol, await r.json())
    assert "exceeds the adapter's limit of 2000 bytes" in msg and "adapter.max_body_mb" in msg
    assert_nothing_recorded(h)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_unknown_missing_and_closed_sessions_are_401(make_harness, protocol: str) -> None:
    h = await make_harness(sessions=("sess-a", "sess-b"))
    r = await post(h, protocol, key="nobody")
    assert r.status == 401 and "unknown session 'nobody'" in error_message(protocol, await r.json())
    assert r.headers["x-should-retry"] == "false"  # SDKs (Claude Code) would otherwise retry a 401
    r = await post(h, protocol, key=None)
    assert r.status == 401 and "no session" in error_message(protocol, await r.json())
    h.sessions.close("sess-b")
    r = await post(h, protocol, key="sess-b")
    assert r.status == 401 and "closed session 'sess-b'" in error_message(protocol, await r.json())
    assert_nothing_recorded(h)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_session_from_path_prefix_and_isolation(make_harness, protocol: str) -> None:
    h = await make_harness(["one", "two"], sessions=("sess-a", "sess-b"))
    r = await post(h, protocol, path="/s/sess-b" + GOOD[protocol][0], key="ignored-dummy-key")
    assert r.status == 200
    r = await post(h, protocol, key="sess-a")
    assert r.status == 200
    a, b = h.sessions.get("sess-a"), h.sessions.get("sess-b")
    assert [x.text for x in b.records] == ["one<|im_end|>"] and [x.text for x in a.records] == ["two<|im_end|>"]
    assert all(x.session_id == "sess-a" for x in a.records) and all(x.session_id == "sess-b" for x in b.records)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_refused_stream_requests_get_a_4xx_error_not_a_200_json(make_harness, protocol: str) -> None:
    h = await make_harness()
    good = GOOD[protocol][1]
    r = await post(h, protocol, json_body=dict(good, stream=True), key="nobody")
    assert r.status == 401 and error_message(protocol, await r.json())


class BrokenEngine:
    """TEST DOUBLE: an engine whose reply has fewer logprobs than tokens (a reply we must not train on)."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    async def generate(self, token_ids: list[int], params: SamplingParams, *, session_id: str | None = None
                       ) -> GenerateResult:
        self.calls.append(token_ids)
        return GenerateResult(output_ids=[5, 6, 7], logprobs=[-0.1], finish_reason="stop")


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_engine_failure_mid_stream_ends_the_stream_well_formed(make_harness, protocol: str) -> None:
    h = await make_harness(backend=BrokenEngine())
    good = GOOD[protocol][1]
    r = await post(h, protocol, json_body=dict(good, stream=True))
    assert r.status == 200
    events = parse_sse(await r.text())
    if protocol == "anthropic":
        assert [n for n, _ in events] == ["error"] and events[0][1]["error"]["type"] == "api_error"
        message = events[0][1]["error"]["message"]
    elif protocol == "responses":
        assert [n for n, _ in events] == ["response.failed"]
        assert events[0][1]["response"]["status"] == "failed"
        message = events[0][1]["response"]["error"]["message"]
    else:
        assert events[-1] == (None, "[DONE]") and len(events) == 2
        message = events[0][1]["error"]["message"]
    assert "1 logprobs for 3 output tokens" in message
    session = h.sessions.get("sess-a")
    assert session.records == [] and session.infra_failure is not None
    r = await post(h, protocol, json_body=dict(good, stream=True))  # refused before a stream starts
    assert r.status == 503 and "already failed" in error_message(protocol, await r.json())


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_engine_failure_without_stream_is_a_5xx_in_protocol_shape(make_harness, protocol: str) -> None:
    h = await make_harness(backend=BrokenEngine())
    r = await post(h, protocol)
    assert r.status == 502
    assert "model engine error" in error_message(protocol, await r.json())


async def test_slow_engine_stream_gets_keepalive_comments(make_harness, renderer: Any) -> None:
    import asyncio

    class SlowEngine(BrokenEngine):
        async def generate(self, token_ids: list[int], params: SamplingParams, *, session_id: str | None = None
                           ) -> GenerateResult:
            await asyncio.sleep(0.35)
            end = renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")
            return GenerateResult(output_ids=[end], logprobs=[-0.5], finish_reason="stop")

    h = await make_harness(backend=SlowEngine(), keepalive_s=0.1)
    good = GOOD["chat"][1]
    r = await post(h, "chat", json_body=dict(good, stream=True))
    text = await r.text()
    assert text.count(": keepalive\n\n") >= 2 and text.endswith("data: [DONE]\n\n")


async def test_unsupported_routes_answer_400_naming_the_feature(make_harness) -> None:
    h = await make_harness()
    r = await post(h, "responses", path="/v1/responses/compact")
    assert r.status == 400 and "/v1/responses/compact" in error_message("responses", await r.json())
    r = await h.client.get("/v1/responses/resp_123", headers={"Authorization": "Bearer sess-a"})
    assert r.status == 400 and "stored responses" in error_message("responses", await r.json())


async def test_auto_open_opens_new_keys_but_never_reopens_closed_ones(make_harness) -> None:
    holder: dict[str, Any] = {}

    def auto_open(token: str) -> Any:
        return holder["h"].sessions.open(token)

    h = await make_harness(["hello"], auto_open=auto_open)
    holder["h"] = h
    r = await post(h, "chat", key="fresh-key")
    assert r.status == 200 and len(h.sessions.get("fresh-key").records) == 1
    h.sessions.close("fresh-key")
    r = await post(h, "chat", key="fresh-key")
    assert r.status == 401


async def test_client_disconnect_mid_stream_cancels_the_turn_and_the_server_goes_on(make_harness, renderer) -> None:
    import asyncio

    started = asyncio.Event()

    class HangingEngine(BrokenEngine):
        async def generate(self, token_ids: list[int], params: SamplingParams, *, session_id: str | None = None
                           ) -> GenerateResult:
            started.set()
            await asyncio.sleep(30)
            raise AssertionError("the turn should have been cancelled")

    h = await make_harness(backend=HangingEngine(), keepalive_s=0.05)
    good = GOOD["chat"][1]
    resp = await h.client.post("/v1/chat/completions", json=dict(good, stream=True),
                               headers={"Authorization": "Bearer sess-a"})
    assert resp.status == 200
    await asyncio.wait_for(started.wait(), 10)
    resp.close()  # drop the connection while the engine works
    await asyncio.sleep(0.3)  # the next keepalive write notices
    session = h.sessions.get("sess-a")
    assert session.records == [] and session.infra_failure is None
    r = await h.client.get("/health")
    assert r.status == 200
