"""OpenAI Responses front end: Codex's item shapes, custom/namespaced tools, SSE, refusals."""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.scripted_engine import tool_call_text
from support.sse import parse_sse

from lego_rl.adapter.responses import ResponsesDialect
from lego_rl.errors import ProtocolError

AUTH = {"Authorization": "Bearer sess-a"}
EXEC = {"type": "function", "name": "exec_command", "description": "Run", "strict": False,
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
PATCH_TOOL = {"type": "custom", "name": "apply_patch", "description": "Edit files.",
              "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}
NS_TOOL = {"type": "namespace", "name": "agents", "description": "Sub-agents.",
           "tools": [{"type": "function", "name": "spawn", "parameters": {"type": "object",
                                                                          "properties": {"task": {"type": "string"}}}}]}


def body(items: Any, **kw: Any) -> dict[str, Any]:
    return {"model": "m", "input": items, "store": False, "stream": False, **kw}


def msg(role: str, text: str) -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def parse(b: dict[str, Any]) -> Any:
    return ResponsesDialect().parse_request(b, path="/v1/responses", query={}, headers={})


def test_codex_items_translate_to_canonical() -> None:
    req = parse(body([
        msg("developer", "You are Codex."), msg("user", "<env/>"), msg("user", "fix it"),
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}],
         "encrypted_content": None},
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "exec_command", "arguments": '{"cmd": "ls"}'},
        {"type": "custom_tool_call", "id": "ct_1", "call_id": "c2", "name": "apply_patch", "input": "*** Begin"},
        {"type": "function_call", "call_id": "c3", "name": "spawn", "namespace": "agents", "arguments": "{}"},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "patched"},
        {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
        {"type": "function_call_output", "call_id": "c3", "output": [{"type": "input_text", "text": "ok"}]},
    ], tools=[EXEC, PATCH_TOOL, NS_TOOL], instructions="Be brief.", reasoning={"effort": "high"}))
    assert [(m.role, m.content) for m in req.messages] == [
        ("system", "Be brief."), ("system", "You are Codex."), ("user", "<env/>"), ("user", "fix it"),
        ("assistant", ""), ("tool", "patched"), ("tool", "a.txt"), ("tool", "ok")]
    turn = req.messages[4]
    assert turn.reasoning == "think"
    assert [(c.id, c.name, c.kind, c.namespace, c.arguments) for c in turn.tool_calls] == [
        ("c1", "exec_command", "function", None, {"cmd": "ls"}),
        ("c2", "apply_patch", "custom", None, {"input": "*** Begin"}),
        ("c3", "spawn", "function", "agents", {})]
    assert [(t.name, t.kind, t.namespace) for t in req.tools] == [
        ("exec_command", "function", None), ("apply_patch", "custom", None), ("spawn", "function", "agents")]
    assert req.tools[1].format == PATCH_TOOL["format"] and req.reasoning_effort == "high"


@pytest.mark.parametrize(("b", "needle"), [
    ({"model": "m"}, "input: required field is missing"),
    ({"input": "hi"}, "model: required field is missing"),
    (body("hi", previous_response_id="resp_1"), "previous_response_id is not supported"),
    (body("hi", store=True), "store=true is not supported"),
    (body("hi", background=True), "background is not supported"),
    (body([{"type": "item_reference", "id": "x"}]), "item_reference inputs are not supported"),
    (body("hi", tools=[{"type": "web_search"}]), "hosted tool 'web_search' is not supported"),
    (body("hi", tools=[{"type": "file_search", "vector_store_ids": []}]), "hosted tool 'file_search'"),
    (body([{"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
     "input[0].content[0].type: 'input_image' input is not supported"),
    (body([{"type": "message", "role": "critic", "content": "x"}]), "input[0].role: expected one of"),
    (body([{"type": "function_call_output", "call_id": "zz", "output": "x"}]),
     "tool result for call 'zz' does not match any tool call before it"),
    (body([{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
           {"type": "function_call_output", "call_id": "c1", "output": "x"},
           {"type": "function_call_output", "call_id": "c1", "output": "y"}]), "duplicate tool result for call 'c1'"),
    (body([{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{not json"}]),
     "input[0].arguments: tool-call arguments are not valid JSON"),
    (body("hi", max_output_tokens=-3), "max_output_tokens: must be a positive integer, got -3"),
    (body(7), "input: expected an array, got an integer"),
])
def test_bad_requests_name_the_problem(b: dict[str, Any], needle: str) -> None:
    with pytest.raises(ProtocolError) as exc:
        parse(b)
    assert needle in str(exc.value)


async def test_json_reply_carries_custom_and_namespaced_calls(make_harness) -> None:
    text = (tool_call_text("apply_patch", {"input": "*** Begin Patch\n*** End Patch"})
            + "\n" + tool_call_text("agents.spawn", {"task": "look"}))
    h = await make_harness([text])
    r = await h.client.post("/v1/responses", json=body("go", tools=[PATCH_TOOL, NS_TOOL]), headers=AUTH)
    assert r.status == 200
    resp = await r.json()
    assert resp["object"] == "response" and resp["status"] == "completed"
    kinds = [(i["type"], i["name"], i.get("namespace")) for i in resp["output"]]
    assert kinds == [("custom_tool_call", "apply_patch", None), ("function_call", "spawn", "agents")]
    assert resp["output"][0]["input"] == "*** Begin Patch\n*** End Patch"
    assert json.loads(resp["output"][1]["arguments"]) == {"task": "look"}
    assert resp["usage"]["input_tokens"] == len(h.sessions.get("sess-a").records[0].prompt_ids)


async def test_stream_is_the_full_event_sequence(make_harness) -> None:
    h = await make_harness(["<think>\nhm\n</think>\n\n" + tool_call_text("exec_command", {"cmd": "ls"}, before="Checking.")])
    r = await h.client.post("/v1/responses", json=body("go", tools=[EXEC], stream=True), headers=AUTH)
    events = parse_sse(await r.text())
    names = [n for n, _ in events]
    assert names[:2] == ["response.created", "response.in_progress"] and names[-1] == "response.completed"
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    done = [d["item"] for n, d in events if n == "response.output_item.done"]
    assert [i["type"] for i in done] == ["reasoning", "message", "function_call"]
    assert done[0]["content"][0]["text"] == "hm" and done[1]["content"][0]["text"] == "Checking."
    assert events[-1][1]["response"]["output"] == done
    assert "response.function_call_arguments.done" in names and "response.output_text.delta" in names


async def test_reasoning_item_echoed_back_bridges_the_next_turn(make_harness) -> None:
    h = await make_harness(["<think>\nhm\n</think>\n\n" + tool_call_text("exec_command", {"cmd": "ls"}), "Done."])
    r = await h.client.post("/v1/responses", json=body([msg("user", "go")], tools=[EXEC]), headers=AUTH)
    out = (await r.json())["output"]
    call = next(i for i in out if i["type"] == "function_call")
    r = await h.client.post("/v1/responses", json=body(
        [msg("user", "go"), *out, {"type": "function_call_output", "call_id": call["call_id"], "output": "a.txt"}],
        tools=[EXEC]), headers=AUTH)
    assert (await r.json())["output"][0]["content"][0]["text"] == "Done."
    records = h.sessions.get("sess-a").records
    assert [x.render_mode for x in records] == ["full", "bridged"]


async def test_truncated_output_is_incomplete(make_harness) -> None:
    """(A prompt over the window is a context_length_exceeded error: test_context_overflow.py.)"""
    h = await make_harness(["word " * 50])
    r = await h.client.post("/v1/responses", json=body("go", max_output_tokens=4), headers=AUTH)
    resp = await r.json()
    assert resp["status"] == "incomplete" and resp["incomplete_details"] == {"reason": "max_output_tokens"}


def test_client_tool_search_and_free_text_custom_tools_are_offered() -> None:
    req = parse(body("hi", tools=[
        {"type": "tool_search", "execution": "client", "description": "Find tools.",
         "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}},
        {"type": "custom", "name": "notes", "description": "Free text."}]))
    assert [(t.name, t.kind, t.format) for t in req.tools] == [
        ("tool_search", "function", None), ("notes", "custom", {"type": "text"})]
    with pytest.raises(ProtocolError, match="unknown tool type 'tool_search'"):
        parse(body("hi", tools=[{"type": "tool_search"}]))  # server-executed search is not ours to run


@pytest.mark.parametrize(("meta", "label"), [
    ({"agent_name": "/root", "request_kind": "turn"}, None),
    ({"agent_name": "/root/explorer", "request_kind": "turn"}, "subagent:/root/explorer"),
    ({"agent_name": "/root", "request_kind": "compact"}, "compact"),
    (None, None),
])
def test_codex_sub_agent_requests_are_side_requests(meta: Any, label: str | None) -> None:
    headers = {} if meta is None else {"x-codex-turn-metadata": json.dumps(meta)}
    req = ResponsesDialect().parse_request(body("hi"), path="/v1/responses", query={}, headers=headers)
    assert req.side_label == label


@pytest.mark.parametrize("stop", [["END"], "END"])
async def test_stop_is_refused_because_the_responses_api_has_none(make_harness, stop: Any) -> None:
    h = await make_harness()
    r = await h.client.post("/v1/responses", json=body("hi", stop=stop), headers=AUTH)
    assert r.status == 400
    error = (await r.json())["error"]
    assert error["param"] == "stop"
    assert error["message"].startswith("stop: the Responses API has no stop parameter")
    assert h.engine.calls == [] and h.sessions.get("sess-a").records == []
