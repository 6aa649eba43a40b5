"""The small contract every wire protocol (dialect) implements, and the helpers they share.

A dialect translates one client protocol straight to and from the canonical form
(``lego_rl.adapter.canonical``): it never routes through another protocol and never re-parses its own
SSE. The HTTP edge (``lego_rl.adapter.server``) owns everything else: sessions, body limits, calling
the core, and mapping any exception once into a ``WireError`` that the dialect shapes with
``error_body`` / ``stream_error_events``.

Streams: the engine answers a whole turn at once, so a dialect renders a finished
``CanonicalResponse`` as the complete, well-formed event sequence its clients expect. While the engine
works the server keeps the connection alive with SSE comments, which every SSE parser ignores.
"""

from __future__ import annotations

import json
import secrets
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, NamedTuple

from lego_rl.adapter.canonical import CanonicalRequest, CanonicalResponse, Protocol
from lego_rl.adapter.stops import MAX_STOP_SEQUENCES
from lego_rl.chat.messages import Message
from lego_rl.errors import ProtocolError

Operation = Literal["generate", "count_tokens", "unsupported"]


class Route(NamedTuple):
    """One HTTP route of a dialect. ``unsupported`` routes always answer a 400 naming the feature."""

    method: str
    path: str
    operation: Operation = "generate"
    feature: str = ""
    """For ``unsupported`` routes: what the client asked for, quoted in the 400 message."""


class SSEEvent(NamedTuple):
    """One server-sent event: ``event:`` name (None for data-only protocols) and its data."""

    event: str | None
    data: Mapping[str, Any] | str

    def encode(self) -> bytes:
        data = self.data if isinstance(self.data, str) else json.dumps(self.data, ensure_ascii=False)
        head = f"event: {self.event}\n" if self.event else ""
        return f"{head}data: {data}\n\n".encode()


@dataclass(frozen=True)
class WireError:
    """An error already mapped at the edge: HTTP status, short type, message naming the problem."""

    status: int
    kind: str
    message: str
    param: str | None = None
    code: str | None = None
    """A machine-readable code clients act on, where the protocol has one (OpenAI's
    ``context_length_exceeded``: Codex and OpenCode stop or compact on it instead of retrying)."""


class Dialect(ABC):
    """One client protocol. Stateless: one instance serves every request."""

    name: ClassVar[Protocol]
    routes: ClassVar[tuple[Route, ...]]

    @abstractmethod
    def parse_request(
        self, body: Any, *, path: str, query: Mapping[str, str], headers: Mapping[str, str]
    ) -> CanonicalRequest:
        """Validate a decoded JSON body and translate it; raise ``ProtocolError`` naming the field."""

    @abstractmethod
    def render_response(self, resp: CanonicalResponse, req: CanonicalRequest) -> dict[str, Any]:
        """The JSON body of a non-streaming reply."""

    @abstractmethod
    def stream_events(self, resp: CanonicalResponse, req: CanonicalRequest) -> list[SSEEvent]:
        """The complete event sequence of a streaming reply, terminator included."""

    @abstractmethod
    def error_body(self, err: WireError) -> dict[str, Any]:
        """The protocol's JSON error shape."""

    @abstractmethod
    def stream_error_events(self, err: WireError, model: str) -> list[SSEEvent]:
        """Events that end an already started stream with ``err``, terminator included."""

    def answer_as_error(self, resp: CanonicalResponse, req: CanonicalRequest) -> WireError | None:
        """An answer of the core that this protocol sends as an error rather than a reply (None: a reply).
        The turn is over either way (recorded, the session's termination set)."""
        return None

    def count_tokens_body(self, input_tokens: int) -> dict[str, Any]:
        """JSON reply of a ``count_tokens`` route (only dialects that declare one override this)."""
        raise NotImplementedError(f"{self.name} has no count_tokens route")


def context_length_exceeded(resp: CanonicalResponse, param: str) -> WireError | None:
    """OpenAI's answer to a prompt that leaves no room in the context window: a 400 with
    ``code: "context_length_exceeded"`` (what the OpenAI APIs send, and what Codex and OpenCode recognise),
    for the core's ``context_limit`` stop; None for any other answer."""
    if resp.stop != "context_limit":
        return None
    # OpenAI's own wording, with both phrases the clients' overflow patterns look for (litellm: "This model's
    # maximum context length is"; OpenCode: that with a number, or "exceeds the context window").
    window = resp.context_window if resp.context_window is not None else "the adapter's window of"
    return WireError(
        400, "invalid_request_error",
        f"This model's maximum context length is {window} tokens (prompt and output together). However, "
        f"your input resulted in at least {resp.prompt_tokens} tokens: it exceeds the context window of this "
        "model. Please reduce the length of the messages or compact the conversation.",
        param=param, code="context_length_exceeded")


# ---------------------------------------------------------------------------------------------------
# Shared parse helpers: every message names the offending field by its JSON path.


def new_id(prefix: str) -> str:
    """A fresh random id such as ``msg_3f2a...`` (24 hex digits)."""
    return f"{prefix}{secrets.token_hex(12)}"


_TYPE_NAMES = {dict: "an object", list: "an array", str: "a string", int: "an integer",
               float: "a number", bool: "a boolean"}


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    for typ, name in _TYPE_NAMES.items():
        if type(value) is typ:
            return name
    return type(value).__name__


def expect(value: Any, types: type | tuple[type, ...], where: str) -> Any:
    """Return ``value`` if it has one of ``types`` (bool is never accepted as a number)."""
    tup = types if isinstance(types, tuple) else (types,)
    ok = isinstance(value, tup) and not (isinstance(value, bool) and bool not in tup)
    if not ok:
        wanted = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in tup)
        raise ProtocolError(f"{where}: expected {wanted}, got {_type_name(value)}", param=where)
    return value


def get_field(
    obj: Mapping[str, Any], key: str, types: type | tuple[type, ...], where: str, *, required: bool = False
) -> Any:
    """``obj[key]`` checked against ``types``; None when absent (or JSON null) and not required."""
    path = f"{where}.{key}" if where else key
    if key not in obj or obj[key] is None:
        if required:
            raise ProtocolError(f"{path}: required field is missing", param=path)
        return None
    return expect(obj[key], types, path)


def body_object(body: Any) -> dict[str, Any]:
    """The request body must be a JSON object."""
    if not isinstance(body, dict):
        raise ProtocolError(f"request body: expected a JSON object, got {_type_name(body)}")
    return body


def positive_int(obj: Mapping[str, Any], key: str, where: str = "", *, required: bool = False) -> int | None:
    value = get_field(obj, key, int, where, required=required)
    if value is not None and value <= 0:
        path = f"{where}.{key}" if where else key
        raise ProtocolError(f"{path}: must be a positive integer, got {value}", param=path)
    return value


def stop_sequences(raw: Any, where: str, *, single_string: bool) -> list[str]:
    """Client stop sequences: an array of non-empty strings (or one string where the protocol allows
    it), at most ``MAX_STOP_SEQUENCES``. An empty string would match before the first character."""
    if raw is None:
        return []
    if single_string and isinstance(raw, str):
        items, paths = [raw], [where]
    else:
        items = expect(raw, (str, list) if single_string else list, where)
        paths = [f"{where}[{i}]" for i in range(len(items))]
    if len(items) > MAX_STOP_SEQUENCES:
        raise ProtocolError(f"{where}: at most {MAX_STOP_SEQUENCES} stop sequences are supported, got "
                            f"{len(items)}", param=where)
    for item, path in zip(items, paths, strict=True):
        if not expect(item, str, path):
            raise ProtocolError(f"{path}: a stop sequence must not be empty", param=path)
    return list(items)


def parse_arguments(raw: Any, where: str) -> dict[str, Any]:
    """Tool-call arguments as the client echoes them: a JSON object, or a string holding one."""
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        if not raw.strip():
            return {}
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ProtocolError(f"{where}: tool-call arguments are not valid JSON ({exc.msg})",
                                param=where) from exc
        if isinstance(value, dict):
            return value
        raise ProtocolError(f"{where}: tool-call arguments must be a JSON object, got {_type_name(value)}",
                            param=where)
    raise ProtocolError(f"{where}: expected a JSON object or string, got {_type_name(raw)}", param=where)


def check_tool_results(messages: Sequence[Message], where: str) -> None:
    """Every tool result must answer a call of the assistant turn just before it, exactly once.

    Results of parallel calls may arrive in any order (the renderer restores call order by id), but a
    result for an unknown id, a result repeated, or a result after the conversation moved on would
    attach an observation to the wrong call, so each is refused with the id named.
    """
    open_calls: dict[str, str] = {}
    answered: set[str] = set()
    seen_calls: set[str] = set()
    for msg in messages:
        if msg.role == "assistant":
            open_calls = {c.id: c.name for c in msg.tool_calls}
            answered = set()
            for call in msg.tool_calls:
                if call.id in seen_calls:
                    raise ProtocolError(f"{where}: tool call id {call.id!r} is used by more than one call",
                                        param=where)
                seen_calls.add(call.id)
        elif msg.role == "tool":
            cid = msg.tool_call_id or ""
            if cid in answered:
                raise ProtocolError(f"{where}: duplicate tool result for call {cid!r}", param=where)
            if cid not in open_calls:
                why = ("answers a call made earlier in the conversation, not by the assistant turn just "
                       "before it" if cid in seen_calls else "does not match any tool call before it")
                raise ProtocolError(f"{where}: tool result for call {cid!r} {why}", param=where)
            answered.add(cid)
        else:
            # A user/system message closes the assistant turn's calls: later results are out of order.
            if msg.role == "user":
                open_calls, answered = {}, set()
