"""The parser of sampled turns the adapter uses: vLLM's where vLLM is importable, else the built-in one.

``make_turn_parser(tool_call_parser, reasoning_parser, tokenizer)`` takes vLLM's parser names
(``lego_rl.chat.parser_names``). With vLLM importable in this process, vLLM's parsers parse every turn
(``lego_rl.chat.vllm_parsers``): a dependency that already reads every format beats our copy. Without it
(the embedded engine's install), the built-in parsers (``lego_rl.chat.parsers``) read the formats we ship:
``qwen3_coder`` and ``hermes`` calls, ``qwen3`` reasoning; a name only vLLM knows is then a ``ConfigError``
naming what would work. The conformance test holds the built-ins to vLLM's results on one corpus per format.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol, cast

from lego_rl.chat.messages import ToolSpec
from lego_rl.chat.parser_names import (
    BUILTIN_REASONING_PARSERS,
    BUILTIN_TOOL_CALL_PARSERS,
    KNOWN_REASONING_PARSERS,
    KNOWN_TOOL_CALL_PARSERS,
    vllm_importable,
)
from lego_rl.chat.parsers import ParsedTurn, ReasoningStyle, ToolParserStyle, parse_turn
from lego_rl.errors import ConfigError


class TurnParser(Protocol):
    """Reads one sampled turn (decoded text, special tokens kept) into reasoning, text and tool calls."""

    engine: Literal["builtin", "vllm"]
    tool_call_parser: str
    reasoning_parser: str

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
        """``new_id`` issues the call ids; the rest is what vLLM's parsers may look at (the built-in reads
        only the text and tools)."""
        ...


class BuiltinTurnParser:
    """Our own parsers (``lego_rl.chat.parsers``): ``auto`` tells qwen3_coder XML from hermes JSON per call."""

    engine: Literal["builtin", "vllm"] = "builtin"

    def __init__(self, tool_call_parser: str = "auto", reasoning_parser: str = "qwen3") -> None:
        if tool_call_parser not in (*BUILTIN_TOOL_CALL_PARSERS, "auto"):
            raise ValueError(f"no built-in tool-call parser {tool_call_parser!r} "
                             f"(built-in: {', '.join(BUILTIN_TOOL_CALL_PARSERS)})")
        if reasoning_parser not in BUILTIN_REASONING_PARSERS:
            raise ValueError(f"no built-in reasoning parser {reasoning_parser!r} "
                             f"(built-in: {', '.join(BUILTIN_REASONING_PARSERS)})")
        self.tool_call_parser, self.reasoning_parser = tool_call_parser, reasoning_parser

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
        return parse_turn(text, tools, style=cast(ToolParserStyle, self.tool_call_parser),
                          reasoning=cast(ReasoningStyle, self.reasoning_parser), new_id=new_id)


def check_parser_names(tool_call_parser: str, reasoning_parser: str, *, use_vllm: bool) -> None:
    """``ConfigError`` for a name nobody knows, or (without vLLM) one only vLLM knows, naming what would work."""
    if tool_call_parser not in KNOWN_TOOL_CALL_PARSERS:
        raise ConfigError(f"serving.tool_call_parser={tool_call_parser!r} is not a parser name; known: "
                          f"{', '.join(KNOWN_TOOL_CALL_PARSERS)}", parameter="serving.tool_call_parser",
                          value=tool_call_parser)
    if reasoning_parser not in KNOWN_REASONING_PARSERS:
        raise ConfigError(f"serving.reasoning_parser={reasoning_parser!r} is not a parser name; known: "
                          f"{', '.join(KNOWN_REASONING_PARSERS)}", parameter="serving.reasoning_parser",
                          value=reasoning_parser)
    if use_vllm:
        return
    for key, name, builtin in (("serving.tool_call_parser", tool_call_parser, BUILTIN_TOOL_CALL_PARSERS),
                               ("serving.reasoning_parser", reasoning_parser, BUILTIN_REASONING_PARSERS)):
        if name not in builtin:
            raise ConfigError(f"{key}={name!r} is one of vLLM's parsers and vLLM is not importable in the "
                              f"adapter's process; without it only the built-in ones run: {', '.join(builtin)}",
                              parameter=key, value=name)


def make_turn_parser(tool_call_parser: str, reasoning_parser: str, tokenizer: Any, *,
                     use_vllm: bool | None = None) -> TurnParser:
    """The parser for these vLLM names: vLLM's when ``use_vllm`` (default: vLLM is importable here), else the
    built-in one. A name nobody knows, or one only vLLM knows without vLLM, is a ``ConfigError``."""
    use_vllm = vllm_importable() if use_vllm is None else use_vllm
    check_parser_names(tool_call_parser, reasoning_parser, use_vllm=use_vllm)
    if use_vllm:
        from lego_rl.chat.vllm_parsers import VllmTurnParser

        try:
            return VllmTurnParser(tool_call_parser, reasoning_parser, tokenizer)
        except ValueError as exc:
            raise ConfigError(str(exc), parameter="serving.tool_call_parser", value=tool_call_parser) from None
    return BuiltinTurnParser(tool_call_parser, reasoning_parser)
