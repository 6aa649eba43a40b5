"""Parse a sampled assistant turn into reasoning, text and tool calls; restore tool-result order.

The parser works on the decoded text of the sampled ids (special tokens kept). Two tool-call styles
are understood, both inside ``<tool_call> ... </tool_call>``:

* ``qwen3_coder`` (XML): ``<function=NAME><parameter=P>value</parameter>...</function>``; parameter values
  are converted with the tool's JSON schema (strings stay verbatim, other types are read as JSON).
* ``hermes`` (JSON): ``{"name": NAME, "arguments": {...}}``.

Several calls per turn are allowed. A call that cannot be parsed is never a crash: its text is handed
back to the client as plain text and counted in ``parse_failures``, which the turn record keeps.
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
    """Split ``<think>...</think>`` reasoning from the rest.

    Handles templates whose generation prompt already opened ``<think>`` (no opening tag in the output)
    and outputs cut off inside the reasoning (opening tag but no closing one: all of it is reasoning).
    """
    if THINK_CLOSE in text:
        head, _, rest = text.partition(THINK_CLOSE)
        reasoning = head.split(THINK_OPEN, 1)[-1]
        return reasoning.strip("\n"), rest.lstrip("\n")
    stripped = text.lstrip()
    if stripped.startswith(THINK_OPEN):
        return stripped[len(THINK_OPEN) :].strip("\n"), ""
    return None, text


def _convert_param(raw: str, schema: dict[str, Any] | None) -> Any:
    """Read one qwen3_coder parameter value according to its JSON-schema type.

    A value that does not read as its declared type stays a string: the call is well formed, and the
    CLI's own argument validation tells the model what was wrong (a better signal than dropping the call).
    """
    value = raw[1:] if raw.startswith("\n") else raw
    value = value[:-1] if value.endswith("\n") else value
    kind = (schema or {}).get("type")
    if isinstance(kind, list):
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
    match = _FUNCTION_RE.search(body)
    if match is None or body[: match.start()].strip() or body[match.end() :].strip():
        raise ValueError("expected exactly one <function=...>...</function> block")
    name = match.group(1).strip()
    spec = tools.get(name)
    props = (spec.parameters.get("properties") or {}) if spec and spec.kind == "function" else {}
    args: dict[str, Any] = {}
    for pmatch in _PARAM_RE.finditer(match.group(2)):
        pname = pmatch.group(1).strip()
        if pname in args:
            raise ValueError(f"parameter {pname!r} given twice")
        if spec is not None and spec.kind == "custom":
            args[pname] = _convert_param(pmatch.group(2), {"type": "string"})
        else:
            args[pname] = _convert_param(pmatch.group(2), props.get(pname))
    leftover = _PARAM_RE.sub("", match.group(2)).strip()
    if leftover:
        raise ValueError(f"text outside <parameter> blocks: {leftover[:40]!r}")
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
    new_id: Callable[[], str] = new_call_id,
) -> ParsedTurn:
    """Parse decoded sampled text (end-of-message token already removed) into a ``ParsedTurn``.

    With no ``tools`` the body is all text: nothing was offered, so nothing can be called.
    """
    reasoning, body = split_reasoning(text)
    out = ParsedTurn(reasoning=reasoning)
    if not tools:
        out.text = body.strip()
        return out
    by_name = {model_tool_name(t): t for t in tools}
    pieces: list[str] = []
    pos = 0
    while True:
        start = body.find(CALL_OPEN, pos)
        if start < 0:
            pieces.append(body[pos:])
            break
        pieces.append(body[pos:start])
        end = body.find(CALL_CLOSE, start)
        if end < 0:  # unterminated call: everything left is text
            out.parse_failures += 1
            pieces.append(body[start:])
            break
        inner = body[start + len(CALL_OPEN) : end].strip()
        pos = end + len(CALL_CLOSE)
        try:
            if style == "qwen3_coder" or (style == "auto" and inner.startswith("<function=")):
                name, args = _parse_xml_call(inner, by_name)
            else:
                name, args = _parse_json_call(inner)
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
