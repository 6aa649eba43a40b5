"""The chat message types: the history in chat-template form, shared by rendering, parsing and the adapter.

They live at the bottom of ``chat`` so that ``chat`` knows no protocol: the adapter's front ends translate their
wire formats into these, and the renderer and parsers read and produce them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


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
