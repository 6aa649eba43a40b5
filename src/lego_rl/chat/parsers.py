"""Parse a sampled assistant turn into reasoning, text and tool calls; restore tool-result order.

The parser works on the decoded text of the sampled ids (special tokens kept). Two tool-call styles
are understood, both inside ``<tool_call> ... </tool_call>``:

* ``qwen3_coder`` (XML): ``<function=NAME><parameter=P>value</parameter>...</function>``; parameter values
  are converted with the tool's JSON schema (strings stay verbatim, other types are read as JSON).
* ``hermes`` (JSON): ``{"name": NAME, "arguments": {...}}``.

These are the built-in twins of vLLM's ``qwen3_coder`` / ``hermes`` tool parsers and ``qwen3`` reasoning
parser, used where vLLM is not importable (``lego_rl.chat.turn_parser``); the conformance test holds them to
vLLM's results, and docs/serving.md lists where they differ on purpose.

Several calls per turn are allowed; plain text after the first parsed call is dropped (as vLLM does). A call
that cannot be parsed is never a crash: its text is handed back to the client as plain text and counted in
``parse_failures``, which the turn record keeps; the calls around it still count (vLLM's hermes parser drops
them all), and a call cut off mid-body is never turned into a call (vLLM's qwen3_coder makes one).
Calls are parsed only when the request offered tools: a request without tools (OpenCode's title
request, Claude Code's quota probe) gets any ``<tool_call>`` text back as text, since a client that
offered nothing has no tool to run and may not even accept a call in its reply.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from lego_rl.chat.messages import Message, ToolCall, ToolSpec
from lego_rl.errors import ProtocolError

ToolParserStyle = Literal["auto", "qwen3_coder", "hermes"]
ReasoningStyle = Literal["qwen3", "none"]

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
_FUNCTION_RE = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
_PARAM_RE = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


@dataclass
class ParsedTurn:
    """What one sampled turn said: reasoning, visible text, tool calls, and how many calls failed."""

    text: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    parse_failures: int = 0


def model_tool_name(spec: ToolSpec) -> str:
    """The name the model sees for a tool: namespaced tools become ``namespace.name``."""
    return f"{spec.namespace}.{spec.name}" if spec.namespace else spec.name


def new_call_id(prefix: str = "call_") -> str:
    """A fresh tool-call id; the client echoes it back and bridging matches calls by it."""
    return prefix + secrets.token_hex(12)


def split_reasoning(text: str) -> tuple[str | None, str]:
    """Split ``<think>...</think>`` reasoning from the rest (vLLM's ``qwen3`` reasoning parser, with the
    differences listed in docs/serving.md).

    Handles templates whose generation prompt already opened ``<think>`` (no opening tag in the output, a
    closing one), outputs cut off inside the reasoning (opening tag, no closing one: all of it is
    reasoning), and a call opened before the reasoning was closed (``<tool_call>`` ends it, as in vLLM).
    Output with neither tag is all text.
    """
    stripped = text.lstrip()
    opened = stripped.startswith(THINK_OPEN)
    close, call = text.find(THINK_CLOSE), text.find(CALL_OPEN)
    if close >= 0 and (call < 0 or close < call or not opened):
        head, rest = text[:close], text[close + len(THINK_CLOSE) :]
        return head.split(THINK_OPEN, 1)[-1].strip("\n"), rest.lstrip("\n")
    if not opened:
        return None, text
    body = stripped[len(THINK_OPEN) :]
    call = body.find(CALL_OPEN)
    if call >= 0:
        return body[:call].strip("\n"), body[call:]
    return body.strip("\n"), ""


def _convert_param(raw: str, schema: dict[str, Any] | None) -> Any:
    """Read one qwen3_coder parameter value according to its JSON-schema type.

    A value that does not read as its declared type stays a string: the call is well formed, and the
    CLI's own argument validation tells the model what was wrong (a better signal than dropping the call).
    """
    value = raw[1:] if raw.startswith("\n") else raw
    value = value[:-1] if value.endswith("\n") else value
    kind = (schema or {}).get("type")
    if isinstance(kind, list):
        if "null" in kind and value.strip().lower() == "null":
            return None  # a nullable string's null (vLLM tries null first, then the other types)
        kind = next((k for k in kind if k != "null"), None)
    if kind == "string":
        return value
    if value.strip() == "null":
        return None
    try:
        return json.loads(value)
    except ValueError:
        return value


def _parse_xml_call(body: str, tools: dict[str, ToolSpec]) -> tuple[str, dict[str, Any]]:
    """One ``<function=NAME>`` block. As in vLLM, text between the parameters is ignored and a parameter given
    twice keeps its last value; text outside the block fails the call."""
    match = _FUNCTION_RE.search(body)
    if match is None or body[: match.start()].strip() or body[match.end() :].strip():
        raise ValueError("expected exactly one <function=...>...</function> block")
    name = match.group(1).strip()
    spec = tools.get(name)
    props = (spec.parameters.get("properties") or {}) if spec and spec.kind == "function" else {}
    args: dict[str, Any] = {}
    for pmatch in _PARAM_RE.finditer(match.group(2)):
        pname = pmatch.group(1).strip()
        if spec is not None and spec.kind == "custom":
            args[pname] = _convert_param(pmatch.group(2), {"type": "string"})
        else:
            args[pname] = _convert_param(pmatch.group(2), props.get(pname))
    return name, args


def _parse_json_call(body: str) -> tuple[str, dict[str, Any]]:
    obj = json.loads(body)
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        raise ValueError("expected an object with a string 'name'")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        args = json.loads(args)
    if not isinstance(args, dict):
        raise ValueError("'arguments' must be an object")
    return obj["name"], args


def parse_turn(
    text: str,
    tools: Sequence[ToolSpec] = (),
    *,
    style: ToolParserStyle = "auto",
    reasoning: ReasoningStyle = "qwen3",
    new_id: Callable[[], str] = new_call_id,
) -> ParsedTurn:
    """Parse decoded sampled text (end-of-message token already removed) into a ``ParsedTurn``.

    With no ``tools`` the body is all text: nothing was offered, so nothing can be called. ``reasoning``
    ``none`` leaves ``<think>`` blocks in the text.
    """
    thought, body = split_reasoning(text) if reasoning == "qwen3" else (None, text)
    out = ParsedTurn(reasoning=thought)
    if not tools:
        out.text = body.strip()
        return out
    by_name = {model_tool_name(t): t for t in tools}
    pieces: list[str] = []
    pos = 0
    while True:
        start = body.find(CALL_OPEN, pos)
        # Plain text after a parsed call is dropped, as vLLM's parsers drop it: the turn's text is what the
        # model said before calling (a failed call's own text is kept, to show the client what went wrong).
        if start < 0:
            pieces.append("" if out.tool_calls else body[pos:])
            break
        pieces.append("" if out.tool_calls else body[pos:start])
        end = body.find(CALL_CLOSE, start)
        # A call left open at the end of the output (cut at the token cap, or the model stopped without
        # the closing tag) counts when its body is complete, as in vLLM; otherwise its text stays text.
        inner = body[start + len(CALL_OPEN) : end if end >= 0 else len(body)].strip()
        pos = end + len(CALL_CLOSE) if end >= 0 else len(body)
        try:
            name, args = _parse_call(inner, by_name, style)
        except ValueError:
            out.parse_failures += 1
            pieces.append(body[start:pos])
            continue
        spec = by_name.get(name)
        out.tool_calls.append(
            ToolCall(
                id=new_id(),
                name=spec.name if spec else name,
                arguments=args,
                kind=spec.kind if spec else "function",
                namespace=spec.namespace if spec else None,
            )
        )
    out.text = "".join(pieces).strip()
    return out


def _parse_call(inner: str, by_name: dict[str, ToolSpec], style: ToolParserStyle) -> tuple[str, dict[str, Any]]:
    if style == "qwen3_coder" or (style == "auto" and inner.startswith("<function=")):
        return _parse_xml_call(inner, by_name)
    return _parse_json_call(inner)


def merge_assistant_runs(messages: Sequence[Message]) -> list[Message]:
    """Fold consecutive assistant messages into one (text joined, calls concatenated, reasoning kept).

    Some wire formats split one assistant turn into items (Responses: reasoning, message, function_call
    items); the template and prefix reuse both need it as the single message it was when sampled.
    """
    out: list[Message] = []
    for msg in messages:
        prev = out[-1] if out else None
        if msg.role == "assistant" and prev is not None and prev.role == "assistant":
            texts = [t for t in (prev.content, msg.content) if t]
            reasonings = [r for r in (prev.reasoning, msg.reasoning) if r]
            out[-1] = prev.model_copy(
                update={
                    "content": "\n\n".join(texts),
                    "reasoning": "\n\n".join(reasonings) if reasonings else None,
                    "tool_calls": [*prev.tool_calls, *msg.tool_calls],
                }
            )
        else:
            out.append(msg)
    return out


def restore_tool_order(messages: Sequence[Message]) -> list[Message]:
    """Put tool results back in the order of the calls they answer, matched by ``tool_call_id``.

    Clients may send parallel results in completion order; chat templates drop the ids, so the order is
    the only link between a call and its result. Each run of tool messages after an assistant message
    is sorted into that message's call order. A result naming no call of the preceding assistant
    message, a duplicate result, or a call left without a result is a ``ProtocolError``.
    """
    out: list[Message] = []
    i = 0
    while i < len(messages):
        msg = messages[i]
        if msg.role == "tool":
            raise ProtocolError(
                f"messages[{i}]: tool result {msg.tool_call_id!r} does not follow an assistant tool call",
                param=f"messages[{i}]",
            )
        out.append(msg)
        i += 1
        if msg.role != "assistant" or not msg.tool_calls:
            continue
        order = {call.id: n for n, call in enumerate(msg.tool_calls)}
        if len(order) != len(msg.tool_calls):
            raise ProtocolError(f"messages[{i - 1}]: duplicate tool call ids", param=f"messages[{i - 1}]")
        results: dict[str, Message] = {}
        while i < len(messages) and messages[i].role == "tool":
            res = messages[i]
            if res.tool_call_id not in order:
                raise ProtocolError(
                    f"messages[{i}]: tool result for unknown call id {res.tool_call_id!r}; "
                    f"the preceding assistant message called {sorted(order)}",
                    param=f"messages[{i}].tool_call_id",
                )
            if res.tool_call_id in results:
                raise ProtocolError(
                    f"messages[{i}]: duplicate tool result for call id {res.tool_call_id!r}",
                    param=f"messages[{i}].tool_call_id",
                )
            results[res.tool_call_id] = res
            i += 1
        missing = [cid for cid in order if cid not in results]
        if missing and (results or i < len(messages)):
            raise ProtocolError(
                f"messages[{i - 1}]: tool call(s) {missing} have no tool result",
                param=f"messages[{i - 1}]",
            )
        out.extend(sorted(results.values(), key=lambda m: order[m.tool_call_id or ""]))
    return out
