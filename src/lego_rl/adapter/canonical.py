"""The protocol-neutral request and response every front end translates to and from.

Front ends (Anthropic Messages, OpenAI Responses, Chat Completions) parse their wire body straight into
a ``CanonicalRequest`` and render a ``CanonicalResponse`` back; the core never sees a wire format.
Messages follow the chat-template convention (``system``/``user``/``assistant``/``tool``) so rendering is
a direct mapping onto the served model's template.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

Protocol = Literal["anthropic", "responses", "chat"]


class ToolCall(BaseModel):
    """A tool call made by the assistant. ``arguments`` is the parsed JSON object (or, for custom /
    free-text tools, ``{"input": "<text>"}`` with ``kind="custom"``)."""

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    kind: Literal["function", "custom"] = "function"
    namespace: str | None = None


class Message(BaseModel):
    """One message of the history in template form.

    ``role == "tool"`` carries ``tool_call_id`` and the result text in ``content``.
    ``reasoning`` is assistant thinking the client echoed back (may be absent even if it was sampled).
    """

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    is_error: bool = False
    name: str | None = None


class ToolSpec(BaseModel):
    """A tool offered to the model. ``parameters`` is a JSON schema; custom tools carry ``format``."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)
    kind: Literal["function", "custom"] = "function"
    namespace: str | None = None
    format: dict[str, Any] | None = None


class CanonicalRequest(BaseModel):
    """What the core needs for one turn, whatever the wire protocol."""

    protocol: Protocol
    model: str = ""
    messages: list[Message]
    tools: list[ToolSpec] = Field(default_factory=list)
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: list[str] = Field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    reasoning_effort: str | None = None
    template_kwargs: dict[str, Any] = Field(default_factory=dict)
    side_label: str | None = None
    """Set by a front end for requests kept out of the main chain (e.g. ``title``)."""
    raw_metadata: dict[str, Any] = Field(default_factory=dict)


StopKind = Literal["end_turn", "tool_use", "max_tokens", "context_limit", "stop_sequence"]


class CanonicalResponse(BaseModel):
    """One assistant turn, parsed from the sampled ids, ready for a front end to render."""

    id: str
    model: str
    text: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    stop: StopKind = "end_turn"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    parse_failures: int = 0
