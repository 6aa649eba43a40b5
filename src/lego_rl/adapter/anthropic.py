"""Anthropic Messages: ``POST /v1/messages`` (also ``?beta=true``) and ``/v1/messages/count_tokens``.

Quirks of the real client this must accept (Claude Code, measured in FIELD-NOTES):

* ``system`` is a list of text blocks with ``cache_control``; its first block is a billing header
  (``x-anthropic-billing-header: ...``) that Anthropic's servers consume as metadata, so it is not
  shown to the model.
* ``role: "system"`` messages appear *inside* ``messages`` after the first user turn, sometimes as a
  block list and on later turns as a plain string: both render to the same system message.
* ``thinking``, ``context_management`` and ``output_config`` are sent on every call; ``output_config.
  effort`` becomes the request's reasoning effort, the rest is kept as metadata only.
* Side requests are labelled and kept off the main chain (``claude_code_side_label``): ``count_tokens``,
  the quota probe (one user message ``quota``, ``max_tokens: 1``), tool-free structured helpers such as
  the session title (a ``json_schema`` output format, no tools), and any request whose
  ``x-claude-code-request-class`` header names a class other than ``main``.
* A ``DeferredToolPlaceholder`` tool with ``defer_loading: true``: deferred tools are not loaded into
  the model's context, so they are not offered. Tools of unknown ``type`` (Anthropic's versioned
  server/client tools) are passed through to the model as plain function tools.

A prompt with no room left in the context window is answered as Anthropic does: a 400
``invalid_request_error`` "prompt is too long: N tokens > M maximum" (in the stream, an ``error`` event).
Claude Code ends on it as ``prompt_too_long`` after one more request (its recovery attempt). The stop
reason ``model_context_window_exceeded`` it was answered with before, Claude Code took for a cut output
(``max_output_tokens``) and sent three more requests to recover.
"""

from __future__ import annotations

import json
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
    expect,
    get_field,
    positive_int,
    stop_sequences,
)
from lego_rl.chat.messages import Message, ToolCall, ToolSpec
from lego_rl.errors import ProtocolError

BILLING_HEADER_PREFIX = "x-anthropic-billing-header:"
STOP_REASONS = {
    "end_turn": "end_turn",
    "tool_use": "tool_use",
    "max_tokens": "max_tokens",
    "stop_sequence": "stop_sequence",
    # Only reached by a direct render: the server sends a context_limit answer as a 400 (answer_as_error).
    "context_limit": "model_context_window_exceeded",
}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
               503: "overloaded_error"}


def _text_of_blocks(blocks: list[Any], where: str, *, allow: tuple[str, ...] = ("text",)) -> str:
    parts: list[str] = []
    for i, block in enumerate(blocks):
        bw = f"{where}[{i}]"
        expect(block, dict, bw)
        btype = get_field(block, "type", str, bw, required=True)
        if btype not in allow:
            raise ProtocolError(f"{bw}.type: content block type {btype!r} is not supported here "
                                f"(expected {' or '.join(allow)})", param=f"{bw}.type")
        parts.append(get_field(block, "text", str, bw, required=True))
    return "\n".join(parts)


def parse_system(system: Any) -> str | None:
    if system is None:
        return None
    if isinstance(system, str):
        return system
    expect(system, list, "system")
    kept = []
    for i, block in enumerate(system):
        text = _text_of_blocks([block], f"system[{i}]")
        if text.startswith(BILLING_HEADER_PREFIX):
            continue
        kept.append(text)
    return "\n".join(kept)


def _user_blocks(blocks: list[Any], where: str) -> list[Message]:
    """A user turn's blocks: tool results become tool messages, text runs become user messages."""
    out: list[Message] = []
    texts: list[str] = []
    for i, block in enumerate(blocks):
        bw = f"{where}[{i}]"
        expect(block, dict, bw)
        btype = get_field(block, "type", str, bw, required=True)
        if btype == "text":
            texts.append(get_field(block, "text", str, bw, required=True))
        elif btype == "tool_result":
            if texts:
                out.append(Message(role="user", content="\n".join(texts)))
                texts = []
            content = block.get("content", "")
            if isinstance(content, list):
                content = _text_of_blocks(content, f"{bw}.content")
            else:
                expect(content, str, f"{bw}.content")
            is_error = get_field(block, "is_error", bool, bw) or False
            out.append(Message(role="tool", tool_call_id=get_field(block, "tool_use_id", str, bw, required=True),
                               content=content, is_error=is_error))
        elif btype in ("image", "document"):
            raise ProtocolError(f"{bw}.type: {btype} content is not supported (the served model reads text)",
                                param=f"{bw}.type")
        else:
            raise ProtocolError(f"{bw}.type: unknown content block type {btype!r} in a user message",
                                param=f"{bw}.type")
    if texts or not out:
        out.append(Message(role="user", content="\n".join(texts)))
    return out


def _assistant_blocks(blocks: list[Any], where: str) -> Message:
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[ToolCall] = []
    for i, block in enumerate(blocks):
        bw = f"{where}[{i}]"
        expect(block, dict, bw)
        btype = get_field(block, "type", str, bw, required=True)
        if btype == "text":
            texts.append(get_field(block, "text", str, bw, required=True))
        elif btype == "thinking":
            thinking.append(get_field(block, "thinking", str, bw, required=True))
        elif btype == "redacted_thinking":
            continue  # opaque to us; the exact sampled reasoning is restored by prefix reuse
        elif btype == "tool_use":
            calls.append(ToolCall(id=get_field(block, "id", str, bw, required=True),
                                  name=get_field(block, "name", str, bw, required=True),
                                  arguments=get_field(block, "input", dict, bw) or {}))
        else:
            raise ProtocolError(f"{bw}.type: unknown content block type {btype!r} in an assistant message",
                                param=f"{bw}.type")
    return Message(role="assistant", content="".join(texts),
                   reasoning="".join(thinking) if thinking else None, tool_calls=calls)


def parse_messages(raw: Any) -> list[Message]:
    expect(raw, list, "messages")
    if not raw:
        raise ProtocolError("messages: at least one message is required", param="messages")
    out: list[Message] = []
    for i, msg in enumerate(raw):
        where = f"messages[{i}]"
        expect(msg, dict, where)
        role = get_field(msg, "role", str, where, required=True)
        content = msg.get("content")
        if content is None:
            raise ProtocolError(f"{where}.content: required field is missing", param=f"{where}.content")
        expect(content, (str, list), f"{where}.content")
        if role == "user":
            out.extend([Message(role="user", content=content)] if isinstance(content, str)
                       else _user_blocks(content, f"{where}.content"))
        elif role == "assistant":
            out.append(Message(role="assistant", content=content) if isinstance(content, str)
                       else _assistant_blocks(content, f"{where}.content"))
        elif role == "system":
            text = content if isinstance(content, str) else _text_of_blocks(content, f"{where}.content")
            out.append(Message(role="system", content=text))
        else:
            raise ProtocolError(f"{where}.role: expected 'user', 'assistant' or 'system', got {role!r}",
                                param=f"{where}.role")
    check_tool_results(out, "messages")
    return out


def parse_tools(raw: Any) -> list[ToolSpec]:
    if raw is None:
        return []
    expect(raw, list, "tools")
    tools: list[ToolSpec] = []
    for i, tool in enumerate(raw):
        where = f"tools[{i}]"
        expect(tool, dict, where)
        name = get_field(tool, "name", str, where, required=True)
        if tool.get("defer_loading") is True:
            continue
        schema = get_field(tool, "input_schema", dict, where) or {}
        tools.append(ToolSpec(name=name, description=get_field(tool, "description", str, where) or "",
                              parameters=schema))
    return tools


REQUEST_CLASS_HEADER = "x-claude-code-request-class"
AUXILIARY_TYPE_HEADER = "x-claude-code-auxiliary-type"
AGENT_TYPE_HEADER = "x-claude-code-agent-type"
COMPACTION_ASK = ("CRITICAL: Respond with TEXT ONLY.", "create a detailed summary of the conversation so far")
"""Both are in the text block Claude Code 2.1 appends to the last user message of its compaction request. In
``-p`` mode that request has no request-class header (a real 64k-token run, tests/rollout/test_generate_64k.py):
without this it forked the main chain, where Codex's compaction is a side request."""


def _output_schema(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The JSON schema of a structured-output request (``output_config.format``, or the deprecated
    ``output_format`` the SDK moves there), None for a free-text request."""
    config = body.get("output_config")
    fmt = config.get("format") if isinstance(config, dict) else None
    fmt = fmt if isinstance(fmt, dict) else body.get("output_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict):
        return fmt["schema"]
    return None


def claude_code_side_label(body: Mapping[str, Any], headers: Mapping[str, str], tools: list[ToolSpec]
                           ) -> str | None:
    """The side label of a Claude Code request that is not a turn of the main agent, else None.

    Claude Code 2.1 sends, besides its main turns: a quota probe (``[{"role": "user", "content":
    "quota"}]`` with ``max_tokens: 1``), tool-free helpers that ask for structured output (the session
    title: a ``json_schema`` with one ``title`` property; memory selection and others), and, where it
    classifies its requests, an ``x-claude-code-request-class`` header (``main``, ``subagent``,
    ``compaction``, ``auxiliary``, ``side_reply``...) refined by ``x-claude-code-auxiliary-type`` /
    ``x-claude-code-agent-type``; without the header, compaction is known by its text (``COMPACTION_ASK``).
    Each becomes its own side chain so it never forks the main chain."""
    request_class = headers.get(REQUEST_CLASS_HEADER, "").strip()
    if request_class and request_class != "main":
        if request_class == "subagent" and headers.get(AGENT_TYPE_HEADER):
            return f"subagent:{headers[AGENT_TYPE_HEADER].strip()}"
        return headers.get(AUXILIARY_TYPE_HEADER, "").strip() or request_class
    messages = body.get("messages")
    if _asks_for_compaction(messages):
        return "compaction"
    if body.get("max_tokens") == 1 and messages == [{"role": "user", "content": "quota"}] and not tools:
        return "quota"
    schema = _output_schema(body)
    if schema is not None and not tools:
        props = schema.get("properties")
        names = sorted(props) if isinstance(props, dict) else []
        return "title" if names == ["title"] else "structured:" + ",".join(names)
    return None


def _asks_for_compaction(messages: Any) -> bool:
    """The last message is the user's and one of its text blocks holds both parts of ``COMPACTION_ASK``."""
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return False
    last = messages[-1]
    content = last.get("content")
    if last.get("role") != "user" or not isinstance(content, list):
        return False
    return any(isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)
               and all(part in block["text"] for part in COMPACTION_ASK) for block in content)


def _blocks(resp: CanonicalResponse) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if resp.reasoning:
        blocks.append({"type": "thinking", "thinking": resp.reasoning, "signature": ""})
    if resp.text:
        blocks.append({"type": "text", "text": resp.text})
    for call in resp.tool_calls:
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments})
    return blocks


class AnthropicDialect(Dialect):
    name = "anthropic"
    routes = (
        Route("POST", "/v1/messages"),
        Route("POST", "/v1/messages/count_tokens", "count_tokens"),
    )

    def parse_request(
        self, body: Any, *, path: str, query: Mapping[str, str], headers: Mapping[str, str]
    ) -> CanonicalRequest:
        body = body_object(body)
        counting = path.endswith("/count_tokens")
        system = parse_system(body.get("system"))
        messages = parse_messages(body.get("messages") if "messages" in body else _missing("messages"))
        if system:
            messages.insert(0, Message(role="system", content=system))
        stops = stop_sequences(body.get("stop_sequences"), "stop_sequences", single_string=False)
        output_config = get_field(body, "output_config", dict, "") or {}
        thinking = get_field(body, "thinking", dict, "")
        tools = parse_tools(body.get("tools"))
        return CanonicalRequest(
            protocol="anthropic",
            model=get_field(body, "model", str, "", required=not counting) or "",
            messages=messages,
            tools=tools,
            max_tokens=positive_int(body, "max_tokens", required=not counting),
            temperature=get_field(body, "temperature", (int, float), ""),
            top_p=get_field(body, "top_p", (int, float), ""),
            top_k=get_field(body, "top_k", int, ""),
            stop=stops,
            stream=bool(get_field(body, "stream", bool, "")),
            reasoning_effort=get_field(output_config, "effort", str, "output_config"),
            side_label="count_tokens" if counting else claude_code_side_label(body, headers, tools),
            raw_metadata={k: v for k, v in (("thinking", thinking), ("tool_choice", body.get("tool_choice")))
                          if v is not None},
        )

    def render_response(self, resp: CanonicalResponse, req: CanonicalRequest) -> dict[str, Any]:
        return {
            "id": resp.id, "type": "message", "role": "assistant", "model": resp.model or req.model,
            "content": _blocks(resp), "stop_reason": STOP_REASONS[resp.stop],
            "stop_sequence": resp.stop_sequence,
            "usage": {"input_tokens": resp.prompt_tokens, "output_tokens": resp.completion_tokens,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
        }

    def stream_events(self, resp: CanonicalResponse, req: CanonicalRequest) -> list[SSEEvent]:
        message = self.render_response(resp, req)
        start = dict(message, content=[], stop_reason=None,
                     usage=dict(message["usage"], output_tokens=0))
        events = [SSEEvent("message_start", {"type": "message_start", "message": start}),
                  SSEEvent("ping", {"type": "ping"})]
        for index, block in enumerate(message["content"]):
            btype = block["type"]
            empty = {"thinking": {"type": "thinking", "thinking": "", "signature": ""},
                     "text": {"type": "text", "text": ""},
                     "tool_use": dict(block, input={})}[btype]
            events.append(SSEEvent("content_block_start",
                                   {"type": "content_block_start", "index": index, "content_block": empty}))
            if btype == "thinking":
                deltas = [{"type": "thinking_delta", "thinking": block["thinking"]},
                          {"type": "signature_delta", "signature": block["signature"]}]
            elif btype == "text":
                deltas = [{"type": "text_delta", "text": block["text"]}]
            else:
                deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block["input"])}]
            events.extend(SSEEvent("content_block_delta", {"type": "content_block_delta", "index": index,
                                                           "delta": d}) for d in deltas)
            events.append(SSEEvent("content_block_stop", {"type": "content_block_stop", "index": index}))
        events.append(SSEEvent("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]},
            "usage": {"output_tokens": resp.completion_tokens}}))
        events.append(SSEEvent("message_stop", {"type": "message_stop"}))
        return events

    def answer_as_error(self, resp: CanonicalResponse, req: CanonicalRequest) -> WireError | None:
        if resp.stop != "context_limit":
            return None
        # Anthropic's wording, which Claude Code matches (N is a lower bound when the text alone was over).
        window = resp.context_window if resp.context_window is not None else "the adapter's"
        return WireError(400, "invalid_request_error",
                         f"prompt is too long: {resp.prompt_tokens} tokens > {window} maximum")

    def error_body(self, err: WireError) -> dict[str, Any]:
        kind = err.kind if err.kind != "invalid_request_error" else ERROR_TYPES.get(err.status, err.kind)
        if err.status >= 500 and err.status != 503:
            kind = "api_error"
        return {"type": "error", "error": {"type": kind, "message": err.message}}

    def stream_error_events(self, err: WireError, model: str) -> list[SSEEvent]:
        return [SSEEvent("error", self.error_body(err))]

    def count_tokens_body(self, input_tokens: int) -> dict[str, Any]:
        return {"input_tokens": input_tokens}


def _missing(field: str) -> Any:
    raise ProtocolError(f"{field}: required field is missing", param=field)
