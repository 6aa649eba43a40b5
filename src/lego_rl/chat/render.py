"""Render canonical messages and tools with the served model's own chat template.

``ChatRenderer`` wraps the model's HF tokenizer. It maps canonical messages onto the template's message
dicts, merges template kwargs (the operator's ``CHAT_TEMPLATE_KWARGS`` under the per-sample and
per-request ones) on every call, tokenises text without adding special tokens, and learns the template's
end-of-message boundary (e.g. ``<|im_end|>`` then a newline) from a probe render, which prefix reuse
needs to join a previous turn's sampled ids to a newly rendered suffix.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lego_rl.chat.messages import Message, ToolCall, ToolSpec
from lego_rl.chat.parsers import model_tool_name

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MessageBoundary:
    """How the template ends a message: ``marker`` (one special token, ``marker_id``) then ``trailer``."""

    marker: str
    marker_id: int
    trailer: str


class RenderError(ValueError):
    """The chat template could not render the history (names the template's complaint)."""


def tool_to_template(spec: ToolSpec) -> dict[str, Any]:
    """An OpenAI-style function schema for the template. Custom (free-text) tools take one ``input``."""
    if spec.kind == "custom":
        fmt = spec.format or {}
        hint = "Free-form text input."
        if fmt.get("type") == "grammar":
            syntax, definition = fmt.get("syntax", ""), fmt.get("definition", "")
            hint = f"Text input that must follow this {syntax} grammar:\n{definition}"
        params: dict[str, Any] = {
            "type": "object",
            "properties": {"input": {"type": "string", "description": hint}},
            "required": ["input"],
        }
    else:
        params = spec.parameters or {"type": "object", "properties": {}}
    return {
        "type": "function",
        "function": {"name": model_tool_name(spec), "description": spec.description, "parameters": params},
    }


def _call_to_template(call: ToolCall) -> dict[str, Any]:
    name = f"{call.namespace}.{call.name}" if call.namespace else call.name
    return {"id": call.id, "type": "function", "function": {"name": name, "arguments": call.arguments}}


def message_to_template(msg: Message) -> dict[str, Any]:
    """The template's message dict for one canonical message."""
    out: dict[str, Any] = {"role": msg.role, "content": msg.content}
    if msg.role == "assistant":
        if msg.reasoning is not None:
            out["reasoning_content"] = msg.reasoning
        if msg.tool_calls:
            out["tool_calls"] = [_call_to_template(c) for c in msg.tool_calls]
    elif msg.role == "tool":
        out["tool_call_id"] = msg.tool_call_id
        if msg.name:
            out["name"] = msg.name
    return out


class ChatRenderer:
    """Chat-template rendering and tokenisation for one served model.

    ``template_kwargs`` are the operator-level defaults (``CHAT_TEMPLATE_KWARGS``); every render call may
    add per-sample / per-request kwargs on top. ``boundary`` is None when the template's end of message
    is not one special token followed by whitespace: prefix reuse is then disabled (full renders only).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        chat_template: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        extra_stop_ids: Sequence[int] = (),
    ) -> None:
        self.tokenizer = tokenizer
        # The core enforces the context window itself; silence the tokenizer's own length warning.
        tokenizer.model_max_length = 1 << 40
        self._extra_stop_ids = tuple(extra_stop_ids)
        self.chat_template = chat_template or tokenizer.chat_template
        if not self.chat_template:
            raise RenderError("the tokenizer has no chat template and none was given")
        self.template_kwargs = dict(template_kwargs or {})
        self.vocab_size = len(tokenizer)
        self.boundary = self._probe_boundary()
        self.eos_ids = self._stop_ids()

    @classmethod
    def from_pretrained(
        cls, model_dir: str | Path, *, template_kwargs: Mapping[str, Any] | None = None
    ) -> ChatRenderer:
        """Load the tokenizer (and its chat template) of the model served from ``model_dir``."""
        from transformers import AutoTokenizer  # heavy import, only when a renderer is built

        # generation_config.json may list more stop ids than the tokenizer's eos (Qwen3: <|endoftext|>).
        stops: list[int] = []
        gen_cfg = Path(model_dir) / "generation_config.json"
        if gen_cfg.is_file():
            eos = json.loads(gen_cfg.read_text()).get("eos_token_id")
            stops = [eos] if isinstance(eos, int) else [e for e in eos or [] if isinstance(e, int)]
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        return cls(tokenizer, template_kwargs=template_kwargs, extra_stop_ids=stops)

    # -- rendering -----------------------------------------------------------------------------------

    def merged_kwargs(self, *overrides: Mapping[str, Any] | None) -> dict[str, Any]:
        """Operator defaults, then each override in turn (later wins)."""
        merged = dict(self.template_kwargs)
        for extra in overrides:
            merged.update(extra or {})
        return merged

    def render_text(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        add_generation_prompt: bool = True,
    ) -> str:
        """The template's text for ``messages`` (kwargs are used as given: merge them first)."""
        extra = {k: v for k, v in (kwargs or {}).items() if k not in ("tools", "add_generation_prompt")}
        try:
            return self.tokenizer.apply_chat_template(
                [message_to_template(m) for m in messages],
                tools=[tool_to_template(t) for t in tools] or None,
                chat_template=self.chat_template,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **extra,
            )
        except Exception as exc:  # jinja raises many types (TemplateError, TypeError...)
            raise RenderError(f"chat template failed: {type(exc).__name__}: {exc}") from exc

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token strings in it become their ids, nothing is added."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with special tokens kept (the parsers need ``<think>`` / ``<tool_call>``)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def render_ids(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Full render with a generation prompt, tokenised."""
        return self.encode(self.render_text(messages, tools, kwargs))

    def strip_end_of_message(self, ids: Sequence[int]) -> list[int]:
        """``ids`` without a trailing stop token (for decoding the visible output)."""
        out = list(ids)
        while out and out[-1] in self.eos_ids:
            out.pop()
        return out

    # -- template probing ----------------------------------------------------------------------------

    def _probe_boundary(self) -> MessageBoundary | None:
        """Find the end-of-message marker: the text the template puts after a probe assistant reply."""
        probe = "lego-probe-reply"
        try:
            text = self.render_text(
                [Message(role="user", content="lego-probe-ask"), Message(role="assistant", content=probe)],
                add_generation_prompt=False,
            )
        except RenderError as exc:
            log.warning("prefix reuse disabled: probe render failed (%s)", exc)
            return None
        at = text.rfind(probe)
        tail = text[at + len(probe) :] if at >= 0 else ""
        ids = self.encode(tail)
        if not ids:
            log.warning("prefix reuse disabled: the template ends assistant messages with nothing")
            return None
        marker = self.decode(ids[:1])
        special = set(getattr(self.tokenizer, "all_special_ids", [])) | set(
            getattr(self.tokenizer, "added_tokens_decoder", {}) or {}
        )
        trailer = tail[len(marker) :]
        if ids[0] not in special or not tail.startswith(marker) or trailer.strip():
            log.warning(
                "prefix reuse disabled: assistant messages end with %r, not <special token><space>", tail
            )
            return None
        return MessageBoundary(marker=marker, marker_id=ids[0], trailer=trailer)

    def _stop_ids(self) -> frozenset[int]:
        ids = set(self._extra_stop_ids)
        if self.boundary is not None:
            ids.add(self.boundary.marker_id)
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        return frozenset(ids)
