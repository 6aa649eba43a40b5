"""A prompt with no room left in the context window, in each protocol's own shape.

OpenAI's protocols answer it as OpenAI does: ``code: "context_length_exceeded"`` with type
``invalid_request_error`` and param ``messages`` (Chat Completions) or ``input`` (Responses), as a 400 or, in
a stream, as the protocol's in-stream error. That code is what Codex (``response.failed``: its
ContextWindowExceeded, not retried; any other code there is retried) and OpenCode (ai-sdk's
APICallError or stream error: a context overflow) act on, and litellm's wording check (OpenHands).
Anthropic's is its own: a 400 "prompt is too long: N tokens > M maximum" (Claude Code: ``prompt_too_long``).
Both ways the adapter finds it: the
text alone over the window (answered before rendering, nothing recorded) and the rendered prompt over it
(a turn recorded with no output). Real adapter, renderer and tiny model; the engine is the scripted
TEST DOUBLE, which must never be called here.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.sse import parse_sse

AUTH = {"Authorization": "Bearer sess-a"}
WINDOW = 8
TEXT_OVER = "x" * 1000  # its text alone is over the window (at least 14 tokens): refused before rendering
FRAME_OVER = "hi"  # fits as text; rendered in the chat template's frame it is 10 tokens: refused after


def chat(text: str, **kw: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], **kw}


def responses(text: str, **kw: Any) -> dict[str, Any]:
    return {"model": "m", "input": [{"type": "message", "role": "user", "content": text}], **kw}


def assert_openai_overflow(error: dict[str, Any], param: str) -> None:
    assert error["code"] == "context_length_exceeded" and error["type"] == "invalid_request_error", error
    assert error["param"] == param
    # The limit and the value, in words the clients' own overflow patterns also match (OpenCode's list).
    assert "exceeds the context window" in error["message"]
    assert f"This model's maximum context length is {WINDOW} tokens" in error["message"]


@pytest.mark.parametrize("text", [TEXT_OVER, FRAME_OVER])
async def test_chat_completions_answers_a_400_context_length_exceeded(make_harness, text: str) -> None:
    h = await make_harness(max_context_tokens=WINDOW)
    r = await h.client.post("/v1/chat/completions", json=chat(text), headers=AUTH)
    assert r.status == 400 and r.headers["x-should-retry"] == "false"
    assert_openai_overflow((await r.json())["error"], "messages")
    session = h.sessions.get("sess-a")
    assert h.engine.calls == [] and session.termination == "context_limit"
    # After rendering, the turn is recorded (no output ids); before it, nothing was made to record.
    assert [(x.output_ids, x.stop_reason) for x in session.records] == (
        [([], "context_limit")] if text == FRAME_OVER else [])


async def test_a_chat_completions_stream_ends_with_the_error_chunk(make_harness) -> None:
    """OpenCode always streams: the error comes as a data chunk then [DONE], as for any in-stream error."""
    h = await make_harness(max_context_tokens=WINDOW)
    r = await h.client.post("/v1/chat/completions", json=chat(TEXT_OVER, stream=True), headers=AUTH)
    assert r.status == 200
    events = parse_sse(await r.text())
    assert [name for name, _ in events] == [None, None] and events[-1][1] == "[DONE]"
    assert_openai_overflow(events[0][1]["error"], "messages")


@pytest.mark.parametrize("text", [TEXT_OVER, FRAME_OVER])
async def test_responses_answers_a_400_context_length_exceeded(make_harness, text: str) -> None:
    h = await make_harness(max_context_tokens=WINDOW)
    r = await h.client.post("/v1/responses", json=responses(text), headers=AUTH)
    assert r.status == 400
    assert_openai_overflow((await r.json())["error"], "input")
    assert h.engine.calls == [] and h.sessions.get("sess-a").termination == "context_limit"


async def test_a_responses_stream_fails_with_context_length_exceeded(make_harness) -> None:
    """Codex's stream: ``response.failed`` whose error code it maps to its context-window error."""
    h = await make_harness(max_context_tokens=WINDOW)
    r = await h.client.post("/v1/responses", json=responses(FRAME_OVER, stream=True), headers=AUTH)
    assert r.status == 200
    [(name, event)] = parse_sse(await r.text())
    assert name == "response.failed" and event["response"]["status"] == "failed"
    error = event["response"]["error"]
    assert error["code"] == "context_length_exceeded" and f"maximum context length is {WINDOW} tokens" in error["message"]


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_answers_prompt_too_long(make_harness, stream: bool) -> None:
    h = await make_harness(max_context_tokens=WINDOW)
    b = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": FRAME_OVER}], "stream": stream}
    r = await h.client.post("/v1/messages", json=b, headers={"x-api-key": "sess-a"})
    if stream:
        [(name, error)] = parse_sse(await r.text())
        assert name == "error" and r.status == 200
    else:
        error = await r.json()
        assert r.status == 400
    assert error == {"type": "error", "error": {"type": "invalid_request_error",
                                                "message": f"prompt is too long: 10 tokens > {WINDOW} maximum"}}
    assert h.engine.calls == [] and h.sessions.get("sess-a").termination == "context_limit"


async def test_an_output_cut_by_the_window_is_still_a_reply(make_harness) -> None:
    """Room for some output, cut by the window: the reply the client asked for, truncated, not an error."""
    h = await make_harness(["word " * 200], max_context_tokens=40)
    r = await h.client.post("/v1/chat/completions", json=chat(FRAME_OVER), headers=AUTH)
    reply = await r.json()
    assert r.status == 200 and reply["choices"][0]["finish_reason"] == "length", reply
    assert h.sessions.get("sess-a").termination == "context_limit"
    h = await make_harness(["word " * 200], max_context_tokens=40)
    r = await h.client.post("/v1/responses", json=responses(FRAME_OVER), headers=AUTH)
    assert r.status == 200 and (await r.json())["status"] == "incomplete"
