"""Anthropic Messages front end: parsing Claude Code's request shapes, JSON and SSE replies, bad input."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from support.scripted_engine import tool_call_text
from support.sse import parse_sse

from lego_rl.adapter.anthropic import AnthropicDialect
from lego_rl.errors import ProtocolError

KEY = {"x-api-key": "sess-a"}
BASH = {"name": "Bash", "description": "Run a command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}


def body(messages: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    return {"model": "claude-x", "max_tokens": 200, "messages": messages, **kw}


def parse(b: dict[str, Any], path: str = "/v1/messages") -> Any:
    return AnthropicDialect().parse_request(b, path=path, query={}, headers={})


def test_claude_code_request_shapes_translate_to_canonical() -> None:
    req = parse(body(
        [{"role": "user", "content": [{"type": "text", "text": "<reminder>"}, {"type": "text", "text": "do it",
                                                                            "cache_control": {"type": "ephemeral"}}]},
         {"role": "system", "content": [{"type": "text", "text": "# Environment", "cache_control": {}}]},
         {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"},
                                           {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}]},
         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.txt",
                                       "is_error": True}, {"type": "text", "text": "go on"}]}],
        system=[{"type": "text", "text": "x-anthropic-billing-header: cc_version=1;"},
                {"type": "text", "text": "You are Claude.", "cache_control": {"type": "ephemeral"}}],
        tools=[BASH, {"name": "DeferredToolPlaceholder", "input_schema": {}, "defer_loading": True},
               {"type": "web_search_20250305", "name": "web_search"}],
        thinking={"type": "adaptive"}, output_config={"effort": "medium"}, stream=True,
        context_management={"edits": []}))
    assert [(m.role, m.content) for m in req.messages] == [
        ("system", "You are Claude."), ("user", "<reminder>\ndo it"), ("system", "# Environment"),
        ("assistant", ""), ("tool", "a.txt"), ("user", "go on")]
    assert req.messages[3].reasoning == "hmm" and req.messages[3].tool_calls[0].arguments == {"command": "ls"}
    assert req.messages[4].is_error and req.messages[4].tool_call_id == "t1"
    assert [t.name for t in req.tools] == ["Bash", "web_search"]  # deferred tool not offered, unknown type kept
    assert req.stream and req.reasoning_effort == "medium" and req.max_tokens == 200


def test_system_message_as_string_or_blocks_is_the_same_message() -> None:
    as_blocks = parse(body([{"role": "user", "content": "hi"},
                            {"role": "system", "content": [{"type": "text", "text": "env"}]}]))
    as_string = parse(body([{"role": "user", "content": "hi"}, {"role": "system", "content": "env"}]))
    assert as_blocks.messages == as_string.messages


@pytest.mark.parametrize(("b", "needle"), [
    ({"model": "m", "max_tokens": 5}, "messages: required field is missing"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens: required field is missing"),
    (body([{"role": "user", "content": 5}]), "messages[0].content: expected a string or an array, got an integer"),
    (body([{"role": "robot", "content": "x"}]), "messages[0].role: expected 'user', 'assistant' or 'system'"),
    (body([{"role": "user", "content": [{"type": "image", "source": {}}]}]), "messages[0].content[0].type: image"),
    (body([{"role": "user", "content": [{"type": "mystery"}]}]), "unknown content block type 'mystery'"),
    (body([{"role": "user", "content": "x"}], max_tokens=0), "max_tokens: must be a positive integer, got 0"),
    (body([{"role": "user", "content": "x"}], tools=[{"description": "no name"}]), "tools[0].name: required"),
    (body([{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "B", "input": "ls"}]}]),
     "messages[0].content[0].input: expected an object, got a string"),
    (body([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "x"}]}]),
     "tool result for call 'nope' does not match any tool call before it"),
    (body([{"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "B", "input": {}}]},
           {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"},
                                        {"type": "tool_result", "tool_use_id": "t1", "content": "y"}]}]),
     "duplicate tool result for call 't1'"),
    (body([{"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "B", "input": {}}]},
           {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}]},
           {"role": "user", "content": "next"},
           {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "late"}]}]),
     "answers a call made earlier in the conversation"),
])
def test_bad_requests_name_the_problem(b: dict[str, Any], needle: str) -> None:
    with pytest.raises(ProtocolError) as exc:
        parse(b)
    assert needle in str(exc.value)


async def test_json_reply_with_tool_use(make_harness) -> None:
    h = await make_harness([tool_call_text("Bash", {"command": "ls"}, before="Let me look.")])
    r = await h.client.post("/v1/messages?beta=true", json=body([{"role": "user", "content": "list"}], tools=[BASH]),
                            headers=KEY)
    assert r.status == 200
    msg = await r.json()
    assert msg["type"] == "message" and msg["stop_reason"] == "tool_use"
    assert [b["type"] for b in msg["content"]] == ["text", "tool_use"]
    assert msg["content"][1]["name"] == "Bash" and msg["content"][1]["input"] == {"command": "ls"}
    assert msg["content"][1]["id"].startswith("toolu_")
    assert msg["usage"]["input_tokens"] == len(h.sessions.get("sess-a").records[0].prompt_ids)


async def test_stream_events_are_complete_and_well_formed(make_harness) -> None:
    h = await make_harness(["<think>\nplan\n</think>\n\n" + tool_call_text("Bash", {"command": "ls"})])
    r = await h.client.post("/v1/messages", json=body([{"role": "user", "content": "list"}], tools=[BASH], stream=True),
                            headers=KEY)
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    events = parse_sse(await r.text())
    names = [name for name, _ in events]
    assert names == ["message_start", "ping",
                     "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
                     "content_block_start", "content_block_delta", "content_block_stop",
                     "message_delta", "message_stop"]
    data = [d for _, d in events]
    assert data[2]["content_block"]["type"] == "thinking" and data[3]["delta"]["thinking"] == "plan"
    assert data[6]["content_block"]["type"] == "tool_use"
    assert json.loads(data[7]["delta"]["partial_json"]) == {"command": "ls"}
    assert data[9]["delta"]["stop_reason"] == "tool_use"


async def test_count_tokens_uses_our_tokenizer_and_records_nothing(make_harness) -> None:
    h = await make_harness()
    b = {"model": "m", "messages": [{"role": "user", "content": "count me"}], "tools": [BASH]}
    r = await h.client.post("/v1/messages/count_tokens", json=b, headers=KEY)
    assert r.status == 200
    req = parse(b, path="/v1/messages/count_tokens")
    assert (await r.json()) == {"input_tokens": h.core.count_tokens(h.sessions.get("sess-a"), req)}
    assert h.sessions.get("sess-a").records == [] and h.engine.calls == []


async def test_context_limit_is_prompt_too_long(make_harness) -> None:
    h = await make_harness(max_context_tokens=8)
    r = await h.client.post("/v1/messages", json=body([{"role": "user", "content": "a long enough question"}]),
                            headers=KEY)
    err = await r.json()
    assert r.status == 400 and err["error"]["type"] == "invalid_request_error", err
    assert re.fullmatch(r"prompt is too long: \d+ tokens > 8 maximum", err["error"]["message"]), err
    assert h.engine.calls == []


@pytest.mark.parametrize("stream", [False, True])
async def test_stop_sequence_ends_the_text_and_is_reported(make_harness, stream: bool) -> None:
    h = await make_harness(["Hello world. END and more text"])
    r = await h.client.post("/v1/messages", json=body([{"role": "user", "content": "greet"}], stream=stream,
                                                      stop_sequences=["never", "END"]), headers=KEY)
    assert r.status == 200
    reply = await r.text()  # a stream's headers come before the turn has run: read it all first
    (rec,) = h.sessions.get("sess-a").records
    (call,) = h.engine.calls
    assert rec.output_ids == call.output_ids[: len(rec.output_ids)] and rec.text.endswith("END")
    if not stream:
        msg = json.loads(reply)
        assert msg["content"] == [{"type": "text", "text": "Hello world."}]
        assert (msg["stop_reason"], msg["stop_sequence"]) == ("stop_sequence", "END")
        assert msg["usage"]["output_tokens"] == len(rec.output_ids)
        return
    events = parse_sse(reply)
    delta = next(d for name, d in events if name == "message_delta")
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    texts = [d["delta"]["text"] for name, d in events if name == "content_block_delta"]
    assert texts == ["Hello world."]


@pytest.mark.parametrize(("stops", "needle", "param"), [
    ("END", "stop_sequences: expected an array, got a string", "stop_sequences"),
    (["ok", 7], "stop_sequences[1]: expected a string, got an integer", "stop_sequences[1]"),
    ([""], "stop_sequences[0]: a stop sequence must not be empty", "stop_sequences[0]"),
    (list("abcde"), "stop_sequences: at most 4 stop sequences are supported, got 5", "stop_sequences"),
])
async def test_invalid_stop_sequences_are_a_precise_400(
    make_harness, stops: Any, needle: str, param: str
) -> None:
    b = body([{"role": "user", "content": "x"}], stop_sequences=stops)
    with pytest.raises(ProtocolError) as exc:
        parse(b)
    assert exc.value.param == param
    h = await make_harness()
    r = await h.client.post("/v1/messages", json=b, headers=KEY)
    assert r.status == 400
    assert (await r.json())["error"] == {"type": "invalid_request_error", "message": needle}
    assert h.engine.calls == [] and h.sessions.get("sess-a").records == []
