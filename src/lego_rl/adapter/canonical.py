"""The protocol-neutral request and response every front end translates to and from.

Front ends (Anthropic Messages, OpenAI Responses, Chat Completions) parse their wire body straight into
a ``CanonicalRequest`` and render a ``CanonicalResponse`` back; the core never sees a wire format.
Messages follow the chat-template convention (``system``/``user``/``assistant``/``tool``) so rendering is
a direct mapping onto the served model's template.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from lego_rl.chat.messages import Message, ToolCall, ToolSpec

__all__ = [
    "CanonicalRequest", "CanonicalResponse", "Message", "Protocol", "StopKind", "ToolCall", "ToolSpec",
]

Protocol = Literal["anthropic", "responses", "chat"]


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
    """Client stop sequences (non-empty strings, at most ``adapter.stops.MAX_STOP_SEQUENCES``)."""
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
    stop_sequence: str | None = None
    """The client stop sequence that ended the output (set only when ``stop`` is ``stop_sequence``)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    parse_failures: int = 0
    context_window: int | None = None
    """The window (prompt plus output tokens) a ``context_limit`` stop ran into; None for other stops."""
