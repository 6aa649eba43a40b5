"""vLLM's tool-call and reasoning parsers behind our ``TurnParser`` interface.

Imported only where vLLM is importable in the adapter's process (``parser_names.vllm_importable``). It
composes the two parsers exactly as vLLM's chat-completions server does (``ParserManager.get_parser`` with
auto tool choice, one ``Parser`` per answer built with the turn's tools and chat-template kwargs,
``set_prompt_token_ids`` then ``parse``), so a turn parses here as it would in ``vllm serve
--tool-call-parser X --reasoning-parser Y``. What is ours: the call ids (the adapter issues them; prefix
reuse matches calls by them), the tool names mapped back to the offered tools (namespaced tools are shown
to the model as ``namespace.name``), arguments read from vLLM's JSON string into an object, and
``parse_failures`` (vLLM reports none; see ``_failures``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from lego_rl.chat.messages import ToolCall, ToolSpec
from lego_rl.chat.parser_names import NO_REASONING
from lego_rl.chat.parsers import ParsedTurn, model_tool_name


def _tool_param(spec: ToolSpec) -> dict[str, Any]:
    """A tool as vLLM's chat-completions request takes it. A custom (free-text) tool has no JSON schema: it
    is offered as a function without properties, so its parameters stay the strings the model wrote."""
    params = spec.parameters if spec.kind == "function" and spec.parameters else {"type": "object", "properties": {}}
    return {"type": "function", "function": {"name": model_tool_name(spec), "description": spec.description,
                                             "parameters": params}}


class VllmTurnParser:
    """Parses sampled turns with vLLM's parsers named ``tool_call_parser`` / ``reasoning_parser``.

    ``tokenizer`` is the served model's Hugging Face tokenizer: vLLM's parsers look their marker tokens up in
    its vocabulary, and an unknown name or a tokenizer without the markers fails here, at start-up
    (``ValueError`` naming both), not on the first turn.
    """

    engine: Literal["builtin", "vllm"] = "vllm"

    def __init__(self, tool_call_parser: str, reasoning_parser: str, tokenizer: Any) -> None:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.parser.parser_manager import ParserManager

        self.tool_call_parser, self.reasoning_parser = tool_call_parser, reasoning_parser
        self._tokenizer = tokenizer
        self._request_cls = ChatCompletionRequest
        try:
            self._parser_cls = ParserManager.get_parser(
                tool_parser_name=tool_call_parser,
                reasoning_parser_name=None if reasoning_parser == NO_REASONING else reasoning_parser,
                enable_auto_tools=True, tokenizer=tokenizer,
            )
        except (TypeError, KeyError) as exc:
            raise ValueError(f"vLLM cannot use tool_call_parser={tool_call_parser!r} with "
                             f"reasoning_parser={reasoning_parser!r}: {exc}") from exc
        if self._parser_cls is None:
            raise ValueError(f"vLLM composed no parser for tool_call_parser={tool_call_parser!r}")
        # A parser that marks where calls start: a turn holding that marker but parsed to no call failed.
        self._call_marker = _call_marker(self._parser_cls(tokenizer))

    def parse(
        self,
        text: str,
        tools: Sequence[ToolSpec] = (),
        *,
        new_id: Callable[[], str],
        template_kwargs: Mapping[str, Any] | None = None,
        prompt_ids: Sequence[int] | None = None,
        output_ids: Sequence[int] = (),
    ) -> ParsedTurn:
        """Reasoning, text and calls of one sampled turn. Without ``tools`` no call is parsed (vLLM's server
        does the same for a request that offered none), but reasoning still is."""
        offered = [_tool_param(t) for t in tools]
        request = self._request_cls(messages=[{"role": "user", "content": ""}], model="lego",
                                    tools=offered or None, tool_choice="auto" if offered else "none")
        parser = self._parser_cls(self._tokenizer, request.tools, chat_template_kwargs=dict(template_kwargs or {}))
        if prompt_ids is not None:
            parser.set_prompt_token_ids(list(prompt_ids))
        reasoning, content, calls = parser.parse(text, request, enable_auto_tools=bool(offered),
                                                 model_output_token_ids=list(output_ids))
        by_name = {model_tool_name(t): t for t in tools}
        out = ParsedTurn(text=(content or "").strip(), reasoning=reasoning.strip("\n") if reasoning else None)
        for call in calls or []:
            args = _arguments(call.arguments)
            if args is None:
                out.parse_failures += 1
                continue
            spec = by_name.get(call.name)
            out.tool_calls.append(ToolCall(
                id=new_id(), name=spec.name if spec else call.name, arguments=args,
                kind=spec.kind if spec else "function", namespace=spec.namespace if spec else None,
            ))
        out.parse_failures += self._failures(text, out, bool(offered))
        return out

    def _failures(self, text: str, parsed: ParsedTurn, offered: bool) -> int:
        """vLLM hands a call it cannot read back as text and says nothing; ours counts it. One failure when
        the parser's call marker is in the turn's text yet no call came out (the usual: one malformed call
        turns the whole turn to text in vLLM's legacy parsers)."""
        if not offered or self._call_marker is None or parsed.tool_calls:
            return 0
        return 1 if self._call_marker in text and self._call_marker in (parsed.text or "") else 0


def _call_marker(parser: Any) -> str | None:
    """The text that opens a call in this parser's format, when it says: a legacy tool parser's
    ``tool_call_start_token``, or an engine parser's ``TOOL_START`` terminal."""
    tool = getattr(parser, "tool_parser", None)
    marker = getattr(tool, "tool_call_start_token", None)
    if isinstance(marker, str) and marker:
        return marker
    config = getattr(getattr(tool, "_parser_engine", None), "parser_engine_config", None)
    start = getattr(config, "terminals", {}).get("TOOL_START") if config is not None else None
    return start if isinstance(start, str) and start else None


def _arguments(raw: str) -> dict[str, Any] | None:
    """vLLM's argument string as an object (None when it is not one: the call cannot be answered). A model
    that wrote its arguments as a JSON string holding the object (hermes ``"arguments": "{...}"``) gets it
    read, as the built-in parser reads it: vLLM passes the string through."""
    try:
        value = json.loads(raw) if raw.strip() else {}
        if isinstance(value, str):
            value = json.loads(value)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
