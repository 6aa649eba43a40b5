"""Chat Completions front end: OpenHands' list-of-parts content, OpenCode's streams, titles, bad input."""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.scripted_engine import tool_call_text
from support.sse import parse_sse

from lego_rl.adapter.chat_completions import ChatCompletionsDialect
from lego_rl.errors import ProtocolError

AUTH = {"Authorization": "Bearer sess-a"}
TERMINAL = {"type": "function", "function": {"name": "terminal", "description": "Run",
                                             "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}


def body(messages: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    return {"model": "m", "messages": messages, **kw}


def parse(b: dict[str, Any]) -> Any:
    return ChatCompletionsDialect().parse_request(b, path="/v1/chat/completions", query={}, headers={})


def test_openhands_list_of_parts_and_tool_messages() -> None:
    req = parse(body([
        {"role": "system", "content": [{"type": "text", "text": "<SOUL>"}, {"type": "text", "text": "</SOUL>"}]},
        {"role": "user", "content": [{"type": "text", "text": "do it"}]},
        {"role": "assistant", "reasoning_content": "plan", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "terminal", "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "terminal", "content": [{"type": "text", "text": "a.txt"}]},
    ], tools=[TERMINAL], reasoning_effort="high", stream=True, stream_options={"include_usage": True}))
    assert [(m.role, m.content) for m in req.messages] == [
        ("system", "<SOUL>\n</SOUL>"), ("user", "do it"), ("assistant", ""), ("tool", "a.txt")]
    assert req.messages[2].reasoning == "plan" and req.messages[2].tool_calls[0].arguments == {"command": "ls"}
    assert req.messages[3].name == "terminal"
    assert req.reasoning_effort == "high" and req.include_usage and req.stream and req.side_label is None


def test_opencode_title_request_is_labelled() -> None:
    req = parse(body([{"role": "system", "content": "You are a title generator. You output ONLY a thread title."},
                      {"role": "user", "content": "Generate a title for this conversation:\n"}]))
    assert req.side_label == "title"
    assert parse(body([{"role": "system", "content": "You are a title generator."}], tools=[TERMINAL])).side_label is None


@pytest.mark.parametrize(("b", "needle"), [
    ({"model": "m"}, "messages: required field is missing"),
    ({"messages": [{"role": "user", "content": "x"}]}, "model: required field is missing"),
    (body([]), "messages: at least one message is required"),
    (body([{"role": "user", "content": {"text": "x"}}]), "messages[0].content: expected an array, got an object"),
    (body([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
     "messages[0].content[0].type: 'image_url' content is not supported"),
    (body([{"role": "wizard", "content": "x"}]), "messages[0].role: expected one of"),
    (body([{"role": "tool", "content": "x"}]), "messages[0].tool_call_id: required field is missing"),
    (body([{"role": "tool", "tool_call_id": "q", "content": "x"}]),
     "tool result for call 'q' does not match any tool call before it"),
    (body([{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
           {"role": "tool", "tool_call_id": "c", "content": "x"}, {"role": "tool", "tool_call_id": "c", "content": "x"}]),
     "duplicate tool result for call 'c'"),
    (body([{"role": "user", "content": "x"}], n=2), "n: only n=1 is supported, got 2"),
    (body([{"role": "user", "content": "x"}], tools=[{"type": "retrieval"}]), "tools[0].type: tool type 'retrieval'"),
    (body([{"role": "user", "content": "x"}], stream="yes"), "stream: expected a boolean, got a string"),
])
def test_bad_requests_name_the_problem(b: dict[str, Any], needle: str) -> None:
    with pytest.raises(ProtocolError) as exc:
        parse(b)
    assert needle in str(exc.value)


async def test_json_reply_with_parallel_tool_calls(make_harness) -> None:
    text = tool_call_text("terminal", {"command": "ls"}) + "\n" + tool_call_text("terminal", {"command": "pwd"})
    h = await make_harness([text])
    r = await h.client.post("/v1/chat/completions", json=body([{"role": "user", "content": "go"}], tools=[TERMINAL]),
                            headers=AUTH)
    reply = await r.json()
    choice = reply["choices"][0]
    assert reply["object"] == "chat.completion" and choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert [json.loads(c["function"]["arguments"]) for c in choice["message"]["tool_calls"]] == [
        {"command": "ls"}, {"command": "pwd"}]
    assert reply["usage"]["prompt_tokens"] == len(h.sessions.get("sess-a").records[0].prompt_ids)


async def test_stream_with_usage_then_done(make_harness) -> None:
    h = await make_harness(["<think>\nhm\n</think>\n\n" + tool_call_text("terminal", {"command": "ls"})])
    r = await h.client.post("/v1/chat/completions", json=body(
        [{"role": "user", "content": "go"}], tools=[TERMINAL], stream=True, stream_options={"include_usage": True}),
        headers=AUTH)
    events = parse_sse(await r.text())
    assert events[-1] == (None, "[DONE]")
    chunks = [d for _, d in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[1]["choices"][0]["delta"] == {"reasoning_content": "hm"}
    args = "".join(c["choices"][0]["delta"]["tool_calls"][0]["function"].get("arguments", "")
                   for c in chunks if c["choices"] and "tool_calls" in c["choices"][0]["delta"])
    assert json.loads(args) == {"command": "ls"}
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


async def test_parallel_results_out_of_order_are_restored_and_bridged(make_harness) -> None:
    text = tool_call_text("terminal", {"command": "ls"}) + "\n" + tool_call_text("terminal", {"command": "pwd"})
    h = await make_harness([text, "Both done."])
    first = [{"role": "user", "content": "go"}]
    r = await h.client.post("/v1/chat/completions", json=body(first, tools=[TERMINAL]), headers=AUTH)
    message = (await r.json())["choices"][0]["message"]
    c1, c2 = (c["id"] for c in message["tool_calls"])
    second = [*first, message, {"role": "tool", "tool_call_id": c2, "content": "/repo"},
              {"role": "tool", "tool_call_id": c1, "content": "a.txt"}]
    r = await h.client.post("/v1/chat/completions", json=body(second, tools=[TERMINAL]), headers=AUTH)
    assert (await r.json())["choices"][0]["message"]["content"] == "Both done."
    records = h.sessions.get("sess-a").records
    assert records[1].render_mode == "bridged"
    prompt = h.engine.tokenizer.decode(records[1].prompt_ids)
    assert prompt.index("a.txt") < prompt.index("/repo")  # results in call order, not arrival order


@pytest.mark.parametrize("stream", [False, True])
async def test_stop_ends_the_text_with_finish_reason_stop(make_harness, stream: bool) -> None:
    h = await make_harness(["Hello world, and more text"])
    b = body([{"role": "user", "content": "greet"}], stop="world", stream=stream)
    r = await h.client.post("/v1/chat/completions", json=b, headers=AUTH)
    assert r.status == 200
    reply = await r.text()  # a stream's headers come before the turn has run: read it all first
    (rec,) = h.sessions.get("sess-a").records
    assert rec.stop_reason == "stop_sequence" and rec.text.endswith("world")
    if not stream:
        choice = json.loads(reply)["choices"][0]
        assert (choice["message"]["content"], choice["finish_reason"]) == ("Hello", "stop")
        return
    chunks = [d for _, d in parse_sse(reply)[:-1]]
    assert [c["choices"][0]["delta"].get("content") for c in chunks[1:-1]] == ["Hello"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(("stop", "needle", "param"), [
    (7, "stop: expected a string or an array, got an integer", "stop"),
    (["ok", None], "stop[1]: expected a string, got null", "stop[1]"),
    ("", "stop: a stop sequence must not be empty", "stop"),
    (["a", "b", "c", "d", "e"], "stop: at most 4 stop sequences are supported, got 5", "stop"),
])
async def test_invalid_stop_is_a_precise_400(make_harness, stop: Any, needle: str, param: str) -> None:
    h = await make_harness()
    r = await h.client.post("/v1/chat/completions", json=body([{"role": "user", "content": "x"}], stop=stop),
                            headers=AUTH)
    assert r.status == 400
    error = (await r.json())["error"]
    assert (error["message"], error["param"]) == (needle, param)
    assert h.engine.calls == [] and h.sessions.get("sess-a").records == []
