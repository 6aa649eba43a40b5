"""OpenAI Chat Completions: ``POST /v1/chat/completions`` for legacy clients, OpenCode and OpenHands.

Quirks of the real clients (FIELD-NOTES):

* OpenCode always streams with ``stream_options.include_usage``; a JSON reply to its streaming request
  makes it loop, so every reply to a stream (errors included) is a stream. Without ``--title`` it
  first asks for a thread title: that request (a "title generator" system prompt and no tools) is
  labelled ``title`` and kept out of the main chain.
* OpenHands sends list-of-parts content for every role (system and tool included), ``reasoning_effort``
  and, by default, no stream.

Assistant reasoning is read from and written to ``reasoning_content``.

A prompt with no room left in the context window is answered as OpenAI does: a 400 with
``code: "context_length_exceeded"``, ``param: "messages"`` (in the stream for a streaming request), which
OpenCode reads as a context overflow rather than an error to retry.
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
    parse_arguments,
    positive_int,
    stop_sequences,
)
from lego_rl.chat.messages import Message, ToolCall, ToolSpec
from lego_rl.errors import ProtocolError

FINISH_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls",
                  "max_tokens": "length", "context_limit": "length"}
TITLE_PROMPT_PREFIX = "You are a title generator"
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def _text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    expect(content, list, where)
    parts = []
    for i, part in enumerate(content):
        pw = f"{where}[{i}]"
        if isinstance(part, str):
            parts.append(part)
            continue
        expect(part, dict, pw)
        ptype = get_field(part, "type", str, pw, required=True)
        if ptype != "text":
            raise ProtocolError(f"{pw}.type: {ptype!r} content is not supported (the served model reads text)",
                                param=f"{pw}.type")
        parts.append(get_field(part, "text", str, pw, required=True))
    return "\n".join(parts)


def _tool_calls(raw: Any, where: str) -> list[ToolCall]:
    if raw is None:
        return []
    expect(raw, list, where)
    calls = []
    for i, call in enumerate(raw):
        cw = f"{where}[{i}]"
        expect(call, dict, cw)
        fn = get_field(call, "function", dict, cw, required=True)
        calls.append(ToolCall(id=get_field(call, "id", str, cw, required=True),
                              name=get_field(fn, "name", str, f"{cw}.function", required=True),
                              arguments=parse_arguments(fn.get("arguments", ""), f"{cw}.function.arguments")))
    return calls


def parse_messages(raw: Any) -> list[Message]:
    expect(raw, list, "messages")
    if not raw:
        raise ProtocolError("messages: at least one message is required", param="messages")
    out: list[Message] = []
    for i, msg in enumerate(raw):
        where = f"messages[{i}]"
        expect(msg, dict, where)
        role = get_field(msg, "role", str, where, required=True)
        if role not in ROLES:
            raise ProtocolError(f"{where}.role: expected one of {sorted(ROLES)}, got {role!r}",
                                param=f"{where}.role")
        content = _text(msg.get("content"), f"{where}.content")
        if role == "assistant":
            out.append(Message(role="assistant", content=content,
                               reasoning=get_field(msg, "reasoning_content", str, where),
                               tool_calls=_tool_calls(msg.get("tool_calls"), f"{where}.tool_calls")))
        elif role == "tool":
            out.append(Message(role="tool", content=content, name=get_field(msg, "name", str, where),
                               tool_call_id=get_field(msg, "tool_call_id", str, where, required=True)))
        else:
            out.append(Message(role=ROLES[role], content=content))  # type: ignore[arg-type]
    check_tool_results(out, "messages")
    return out


def parse_tools(raw: Any) -> list[ToolSpec]:
    if raw is None:
        return []
    expect(raw, list, "tools")
    tools = []
    for i, tool in enumerate(raw):
        where = f"tools[{i}]"
        expect(tool, dict, where)
        kind = get_field(tool, "type", str, where) or "function"
        if kind != "function":
            raise ProtocolError(f"{where}.type: tool type {kind!r} is not supported (only 'function')",
                                param=f"{where}.type")
        fn = get_field(tool, "function", dict, where, required=True)
        tools.append(ToolSpec(name=get_field(fn, "name", str, f"{where}.function", required=True),
                              description=get_field(fn, "description", str, f"{where}.function") or "",
                              parameters=get_field(fn, "parameters", dict, f"{where}.function") or {}))
    return tools


def _side_label(messages: list[Message], tools: list[ToolSpec]) -> str | None:
    if not tools and messages and messages[0].role == "system" and messages[0].content.startswith(
            TITLE_PROMPT_PREFIX):
        return "title"
    return None


def _wire_calls(resp: CanonicalResponse) -> list[dict[str, Any]]:
    return [{"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
            for c in resp.tool_calls]


class ChatCompletionsDialect(Dialect):
    name = "chat"
    routes = (Route("POST", "/v1/chat/completions"),)

    def parse_request(
        self, body: Any, *, path: str, query: Mapping[str, str], headers: Mapping[str, str]
    ) -> CanonicalRequest:
        body = body_object(body)
        if "messages" not in body:
            raise ProtocolError("messages: required field is missing", param="messages")
        n = get_field(body, "n", int, "")
        if n is not None and n != 1:
            raise ProtocolError(f"n: only n=1 is supported, got {n}", param="n")
        messages = parse_messages(body["messages"])
        tools = parse_tools(body.get("tools"))
        options = get_field(body, "stream_options", dict, "") or {}
        max_tokens = positive_int(body, "max_completion_tokens") or positive_int(body, "max_tokens")
        return CanonicalRequest(
            protocol="chat",
            model=get_field(body, "model", str, "", required=True),
            messages=messages,
            tools=tools,
            max_tokens=max_tokens,
            temperature=get_field(body, "temperature", (int, float), ""),
            top_p=get_field(body, "top_p", (int, float), ""),
            top_k=get_field(body, "top_k", int, ""),
            stop=stop_sequences(body.get("stop"), "stop", single_string=True),
            stream=bool(get_field(body, "stream", bool, "")),
            include_usage=bool(get_field(options, "include_usage", bool, "stream_options")),
            reasoning_effort=get_field(body, "reasoning_effort", str, ""),
            side_label=_side_label(messages, tools),
        )

    def render_response(self, resp: CanonicalResponse, req: CanonicalRequest) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": resp.text or None}
        if resp.reasoning:
            message["reasoning_content"] = resp.reasoning
        if resp.tool_calls:
            message["tool_calls"] = _wire_calls(resp)
        return {"id": resp.id, "object": "chat.completion", "created": int(time.time()),
                "model": resp.model or req.model,
                "choices": [{"index": 0, "message": message, "logprobs": None,
                             "finish_reason": FINISH_REASONS[resp.stop]}],
                "usage": self._usage(resp)}

    @staticmethod
    def _usage(resp: CanonicalResponse) -> dict[str, int]:
        return {"prompt_tokens": resp.prompt_tokens, "completion_tokens": resp.completion_tokens,
                "total_tokens": resp.prompt_tokens + resp.completion_tokens}

    def stream_events(self, resp: CanonicalResponse, req: CanonicalRequest) -> list[SSEEvent]:
        head = {"id": resp.id, "object": "chat.completion.chunk", "created": int(time.time()),
                "model": resp.model or req.model}

        def chunk(delta: dict[str, Any], finish: str | None = None) -> SSEEvent:
            return SSEEvent(None, dict(head, choices=[{"index": 0, "delta": delta, "finish_reason": finish}]))

        events = [chunk({"role": "assistant", "content": ""})]
        if resp.reasoning:
            events.append(chunk({"reasoning_content": resp.reasoning}))
        if resp.text:
            events.append(chunk({"content": resp.text}))
        for index, call in enumerate(_wire_calls(resp)):
            events.append(chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                                 "function": {"name": call["function"]["name"],
                                                              "arguments": ""}}]}))
            events.append(chunk({"tool_calls": [{"index": index,
                                                 "function": {"arguments": call["function"]["arguments"]}}]}))
        events.append(chunk({}, FINISH_REASONS[resp.stop]))
        if req.include_usage:
            events.append(SSEEvent(None, dict(head, choices=[], usage=self._usage(resp))))
        events.append(SSEEvent(None, "[DONE]"))
        return events

    def answer_as_error(self, resp: CanonicalResponse, req: CanonicalRequest) -> WireError | None:
        return context_length_exceeded(resp, "messages")

    def error_body(self, err: WireError) -> dict[str, Any]:
        kind = "server_error" if err.status >= 500 else err.kind
        code = err.code if err.code is not None else err.status
        return {"error": {"message": err.message, "type": kind, "param": err.param, "code": code}}

    def stream_error_events(self, err: WireError, model: str) -> list[SSEEvent]:
        return [SSEEvent(None, self.error_body(err)), SSEEvent(None, "[DONE]")]
