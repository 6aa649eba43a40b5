"""OpenAI Responses: ``POST /v1/responses``, stateless, the full history in ``input`` (Codex's protocol).

Supported: ``developer``/``system``/``user``/``assistant`` messages, reasoning items (their text is
echoed back by Codex and becomes the assistant turn's reasoning), function tools, custom tools (free
text and grammar formats), namespaced tools (``namespace`` items; calls carry the namespace back),
``function_call``/``function_call_output`` and ``custom_tool_call``/``custom_tool_call_output``
correlated by ``call_id``, parallel calls. Replies are JSON or SSE (Codex always streams; its minimal
working sequence is ``response.output_item.done`` per item then ``response.completed``; the full
sequence with ``created``/``added``/deltas is sent).

Refused with a 400 that names the feature: ``previous_response_id`` and ``store: true`` (nothing is
stored), ``background``, ``conversation``, ``item_reference`` inputs, hosted tools (web search, file
search, ...), non-text inputs, ``stop`` (the Responses API has no stop sequences; ignoring one would
hand the client text past the point it asked to stop at), and ``POST /v1/responses/compact``
(server-side compaction).
A ``tool_search`` tool with ``execution: "client"`` is offered to the model as a plain function tool.
Requests of Codex sub-agents (``x-codex-turn-metadata``) are side requests on their own chains.

A prompt with no room left in the context window is answered as OpenAI does: ``code:
"context_length_exceeded"``, ``param: "input"``, as a 400 or, in a stream, a ``response.failed`` (Codex
reads that code as its own context-window error and ends the turn; any other code there it retries).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from lego_rl.adapter.canonical import CanonicalRequest, CanonicalResponse
from lego_rl.adapter.dialect import (
    Dialect,
    Route,
    SSEEvent,
    WireError,
    body_object,
    check_tool_results,
    context_length_exceeded,
    expect,
    get_field,
    new_id,
    parse_arguments,
    positive_int,
)
from lego_rl.chat.messages import Message, ToolCall, ToolSpec
from lego_rl.errors import ProtocolError

HOSTED_TOOLS = frozenset({
    "web_search", "web_search_preview", "web_search_preview_2025_03_11", "file_search", "code_interpreter",
    "computer_use_preview", "computer_use", "image_generation", "mcp", "local_shell", "shell",
})
ROLE_MAP = {"developer": "system", "system": "system", "user": "user", "assistant": "assistant"}
TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text", "refusal")
ASSISTANT_ITEMS = ("reasoning", "function_call", "custom_tool_call")


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    expect(content, list, where)
    parts = []
    for i, part in enumerate(content):
        pw = f"{where}[{i}]"
        expect(part, dict, pw)
        ptype = get_field(part, "type", str, pw, required=True)
        if ptype not in TEXT_PARTS:
            raise ProtocolError(f"{pw}.type: {ptype!r} input is not supported (the served model reads text)",
                                param=f"{pw}.type")
        parts.append(get_field(part, "text", str, pw) or get_field(part, "refusal", str, pw) or "")
    return "\n".join(parts)


def _is_assistant_item(item: dict[str, Any]) -> bool:
    kind = item.get("type", "message")
    return kind in ASSISTANT_ITEMS or (kind == "message" and item.get("role") == "assistant")


def parse_input(raw: Any) -> list[Message]:
    """Translate ``input`` items; runs of assistant-side items become one assistant turn."""
    if isinstance(raw, str):
        return [Message(role="user", content=raw)]
    expect(raw, list, "input")
    out: list[Message] = []
    turn: Message | None = None  # the assistant turn being assembled
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        expect(item, dict, where)
        kind = get_field(item, "type", str, where) or "message"
        if not _is_assistant_item(item):
            turn = None
        elif turn is None:
            turn = Message(role="assistant")
            out.append(turn)
        if kind == "message":
            role = get_field(item, "role", str, where, required=True)
            if role not in ROLE_MAP:
                raise ProtocolError(f"{where}.role: expected one of {sorted(ROLE_MAP)}, got {role!r}",
                                    param=f"{where}.role")
            text = _text(item.get("content", ""), f"{where}.content")
            if turn is not None:
                turn.content += text
            else:
                out.append(Message(role=ROLE_MAP[role], content=text))  # type: ignore[arg-type]
        elif kind == "reasoning":
            text = _text(item.get("content") or [], f"{where}.content")
            assert turn is not None
            turn.reasoning = (turn.reasoning or "") + text if text else turn.reasoning
        elif kind in ("function_call", "custom_tool_call"):
            assert turn is not None
            call_id = get_field(item, "call_id", str, where, required=True)
            name = get_field(item, "name", str, where, required=True)
            if kind == "function_call":
                args = parse_arguments(item.get("arguments", ""), f"{where}.arguments")
                call = ToolCall(id=call_id, name=name, arguments=args,
                                namespace=get_field(item, "namespace", str, where))
            else:
                call = ToolCall(id=call_id, name=name, kind="custom",
                                arguments={"input": get_field(item, "input", str, where, required=True)})
            turn.tool_calls.append(call)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            out.append(Message(role="tool", tool_call_id=get_field(item, "call_id", str, where, required=True),
                               content=_text(item.get("output", ""), f"{where}.output")))
        elif kind == "item_reference":
            raise ProtocolError(f"{where}: item_reference inputs are not supported (nothing is stored); "
                                "send the full item", param=where)
        else:
            raise ProtocolError(f"{where}.type: input item type {kind!r} is not supported", param=f"{where}.type")
    if not out:
        raise ProtocolError("input: at least one input item is required", param="input")
    check_tool_results(out, "input")
    return out


def _tool(tool: Any, where: str, namespace: str | None) -> list[ToolSpec]:
    expect(tool, dict, where)
    kind = get_field(tool, "type", str, where, required=True)
    desc = get_field(tool, "description", str, where) or ""
    if kind == "function" or (kind == "tool_search" and tool.get("execution") == "client"):
        name = "tool_search" if kind == "tool_search" else get_field(tool, "name", str, where, required=True)
        return [ToolSpec(name=name, description=desc, namespace=namespace,
                         parameters=get_field(tool, "parameters", dict, where) or {})]
    if kind == "custom":
        fmt = get_field(tool, "format", dict, where) or {"type": "text"}
        return [ToolSpec(name=get_field(tool, "name", str, where, required=True), description=desc,
                         kind="custom", format=fmt, namespace=namespace)]
    if kind == "namespace" and namespace is None:
        ns = get_field(tool, "name", str, where, required=True)
        inner = get_field(tool, "tools", list, where) or []
        return [spec for j, t in enumerate(inner) for spec in _tool(t, f"{where}.tools[{j}]", ns)]
    if kind in HOSTED_TOOLS or kind.startswith("web_search"):
        raise ProtocolError(f"{where}.type: hosted tool {kind!r} is not supported: only function, custom "
                            "and namespace tools run through this adapter", param=f"{where}.type")
    raise ProtocolError(f"{where}.type: unknown tool type {kind!r}", param=f"{where}.type")


def parse_tools(raw: Any) -> list[ToolSpec]:
    if raw is None:
        return []
    expect(raw, list, "tools")
    return [spec for i, tool in enumerate(raw) for spec in _tool(tool, f"tools[{i}]", None)]


def codex_side_label(headers: Mapping[str, str]) -> str | None:
    """Codex names the agent and the kind of every request in ``x-codex-turn-metadata``: the main agent
    is ``/root`` making ``turn`` requests. A sub-agent's calls get their own side chain
    (``subagent:<name>``); other request kinds (compaction, review...) are labelled by their kind."""
    raw = headers.get("x-codex-turn-metadata")
    if not raw:
        return None
    try:
        meta = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(meta, dict):
        return None
    agent, kind = meta.get("agent_name"), meta.get("request_kind")
    if isinstance(agent, str) and agent not in ("", "/root"):
        return f"subagent:{agent}"
    if isinstance(kind, str) and kind not in ("", "turn"):
        return kind
    return None


def _refuse_stateful(body: dict[str, Any]) -> None:
    if body.get("previous_response_id") is not None:
        raise ProtocolError("previous_response_id is not supported: this adapter is stateless; send the full "
                            "history in input with store=false", param="previous_response_id")
    if body.get("store") is True:
        raise ProtocolError("store=true is not supported: responses are never stored; send store=false and "
                            "the full history in input", param="store")
    for key in ("background", "conversation"):
        if body.get(key):
            raise ProtocolError(f"{key} is not supported by this adapter", param=key)


def output_items(resp: CanonicalResponse, req: CanonicalRequest) -> list[dict[str, Any]]:
    custom = {t.name for t in req.tools if t.kind == "custom"}
    items: list[dict[str, Any]] = []
    if resp.reasoning:
        items.append({"type": "reasoning", "id": new_id("rs_"), "summary": [],
                      "content": [{"type": "reasoning_text", "text": resp.reasoning}],
                      "encrypted_content": None})
    if resp.text or not resp.tool_calls:
        items.append({"type": "message", "id": new_id("msg_"), "status": "completed", "role": "assistant",
                      "content": [{"type": "output_text", "text": resp.text, "annotations": []}]})
    for call in resp.tool_calls:
        if call.kind == "custom" or call.name in custom:
            raw = call.arguments.get("input")
            items.append({"type": "custom_tool_call", "id": new_id("ctc_"), "status": "completed",
                          "call_id": call.id, "name": call.name,
                          "input": raw if isinstance(raw, str) else json.dumps(call.arguments)})
        else:
            item = {"type": "function_call", "id": new_id("fc_"), "status": "completed", "call_id": call.id,
                    "name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}
            if call.namespace:
                item["namespace"] = call.namespace
            items.append(item)
    return items


def _item_events(item: dict[str, Any], index: int) -> list[tuple[str, dict[str, Any]]]:
    """(event type, payload) pairs for one output item, from ``added`` to ``done``."""
    iid, kind = item["id"], item["type"]
    base = {"item_id": iid, "output_index": index}
    if kind == "message":
        text = item["content"][0]["text"]
        part = {"type": "output_text", "text": "", "annotations": []}
        added = dict(item, status="in_progress", content=[])
        body = [("response.content_part.added", dict(base, content_index=0, part=part)),
                ("response.output_text.delta", dict(base, content_index=0, delta=text)),
                ("response.output_text.done", dict(base, content_index=0, text=text)),
                ("response.content_part.done", dict(base, content_index=0, part=dict(part, text=text)))]
    elif kind == "reasoning":
        text = item["content"][0]["text"]
        added = dict(item, content=[])
        body = [("response.reasoning_text.delta", dict(base, content_index=0, delta=text)),
                ("response.reasoning_text.done", dict(base, content_index=0, text=text))]
    elif kind == "function_call":
        added = dict(item, status="in_progress", arguments="")
        body = [("response.function_call_arguments.delta", dict(base, delta=item["arguments"])),
                ("response.function_call_arguments.done", dict(base, arguments=item["arguments"]))]
    else:
        added = dict(item, status="in_progress", input="")
        body = [("response.custom_tool_call_input.delta", dict(base, delta=item["input"])),
                ("response.custom_tool_call_input.done", dict(base, input=item["input"]))]
    return ([("response.output_item.added", {"output_index": index, "item": added})] + body
            + [("response.output_item.done", {"output_index": index, "item": item})])


class ResponsesDialect(Dialect):
    name = "responses"
    routes = (
        Route("POST", "/v1/responses"),
        Route("POST", "/v1/responses/compact", "unsupported",
              "server-side compaction (/v1/responses/compact); compact the history client-side"),
        Route("GET", "/v1/responses/{response_id}", "unsupported",
              "stored responses (GET /v1/responses/{id}); responses are never stored"),
    )

    def parse_request(
        self, body: Any, *, path: str, query: Mapping[str, str], headers: Mapping[str, str]
    ) -> CanonicalRequest:
        body = body_object(body)
        _refuse_stateful(body)
        if body.get("stop") is not None:
            raise ProtocolError("stop: the Responses API has no stop parameter (stop sequences exist in Chat "
                                "Completions and Anthropic Messages); remove it", param="stop")
        if "input" not in body:
            raise ProtocolError("input: required field is missing", param="input")
        messages = parse_input(body["input"])
        instructions = get_field(body, "instructions", str, "")
        if instructions:
            messages.insert(0, Message(role="system", content=instructions))
        reasoning = get_field(body, "reasoning", dict, "") or {}
        return CanonicalRequest(
            protocol="responses",
            model=get_field(body, "model", str, "", required=True),
            messages=messages,
            tools=parse_tools(body.get("tools")),
            max_tokens=positive_int(body, "max_output_tokens"),
            temperature=get_field(body, "temperature", (int, float), ""),
            top_p=get_field(body, "top_p", (int, float), ""),
            stream=bool(get_field(body, "stream", bool, "")),
            reasoning_effort=get_field(reasoning, "effort", str, "reasoning"),
            side_label=codex_side_label(headers),
            raw_metadata={"parallel_tool_calls": body.get("parallel_tool_calls", True)},
        )

    def _response(self, resp: CanonicalResponse, req: CanonicalRequest, output: list[dict[str, Any]],
                  status: str) -> dict[str, Any]:
        return {
            "id": resp.id, "object": "response", "created_at": int(time.time()), "model": resp.model or req.model,
            "status": status, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "output": output, "parallel_tool_calls": req.raw_metadata.get("parallel_tool_calls", True),
            "store": False, "usage": {
                "input_tokens": resp.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": resp.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": resp.prompt_tokens + resp.completion_tokens},
        }

    @staticmethod
    def _status(resp: CanonicalResponse) -> str:
        return "incomplete" if resp.stop == "max_tokens" else "completed"

    def answer_as_error(self, resp: CanonicalResponse, req: CanonicalRequest) -> WireError | None:
        return context_length_exceeded(resp, "input")

    def render_response(self, resp: CanonicalResponse, req: CanonicalRequest) -> dict[str, Any]:
        return self._response(resp, req, output_items(resp, req), self._status(resp))

    def stream_events(self, resp: CanonicalResponse, req: CanonicalRequest) -> list[SSEEvent]:
        items = output_items(resp, req)
        status = self._status(resp)
        pending = self._response(resp, req, [], "in_progress")
        pending["usage"] = None
        pairs: list[tuple[str, dict[str, Any]]] = [("response.created", {"response": pending}),
                                                   ("response.in_progress", {"response": pending})]
        for index, item in enumerate(items):
            pairs.extend(_item_events(item, index))
        final = "response.completed" if status == "completed" else "response.incomplete"
        pairs.append((final, {"response": self._response(resp, req, items, status)}))
        return [SSEEvent(kind, dict({"type": kind, "sequence_number": n}, **payload))
                for n, (kind, payload) in enumerate(pairs)]

    def error_body(self, err: WireError) -> dict[str, Any]:
        kind = "server_error" if err.status >= 500 else err.kind
        return {"error": {"message": err.message, "type": kind, "param": err.param, "code": err.code}}

    def stream_error_events(self, err: WireError, model: str) -> list[SSEEvent]:
        failed = {"id": new_id("resp_"), "object": "response", "created_at": int(time.time()), "model": model,
                  "status": "failed", "output": [],
                  "error": {"code": err.code or ("server_error" if err.status >= 500 else "invalid_request"),
                            "message": err.message}}
        return [SSEEvent("response.failed", {"type": "response.failed", "sequence_number": 0,
                                             "response": failed})]
