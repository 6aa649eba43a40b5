"""Choosing the turn parser: vLLM's names, the built-ins without vLLM, precise refusals."""

from __future__ import annotations

import pytest

from lego_rl.chat.messages import ToolSpec
from lego_rl.chat.parser_names import BUILTIN_REASONING_PARSERS, BUILTIN_TOOL_CALL_PARSERS
from lego_rl.chat.turn_parser import BuiltinTurnParser, make_turn_parser
from lego_rl.errors import ConfigError

BASH = ToolSpec(name="bash", parameters={"type": "object", "properties": {"cmd": {"type": "string"}}})


@pytest.mark.parametrize("tool", BUILTIN_TOOL_CALL_PARSERS)
@pytest.mark.parametrize("reasoning", BUILTIN_REASONING_PARSERS)
def test_builtin_names_give_the_builtin_parser_without_vllm(tool: str, reasoning: str) -> None:
    parser = make_turn_parser(tool, reasoning, tokenizer=None, use_vllm=False)
    assert isinstance(parser, BuiltinTurnParser)
    assert (parser.engine, parser.tool_call_parser, parser.reasoning_parser) == ("builtin", tool, reasoning)


def test_builtin_parser_reads_its_style_and_reasoning() -> None:
    ids = iter(["c1", "c2"])
    text = '<think>r</think>\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>'
    turn = make_turn_parser("hermes", "qwen3", None, use_vllm=False).parse(text, [BASH], new_id=lambda: next(ids))
    assert (turn.reasoning, turn.text, [(c.id, c.arguments) for c in turn.tool_calls]) == ("r", "", [("c1", {"cmd": "ls"})])
    kept = make_turn_parser("hermes", "none", None, use_vllm=False).parse(text, [BASH], new_id=lambda: "x")
    assert kept.reasoning is None and kept.text == "<think>r</think>" and len(kept.tool_calls) == 1


@pytest.mark.parametrize(
    ("tool", "reasoning", "key", "needle"),
    [
        ("kimi_k2", "qwen3", "serving.tool_call_parser", "built-in ones run: qwen3_coder, hermes"),
        ("hermes", "deepseek_r1", "serving.reasoning_parser", "built-in ones run: qwen3, none"),
        ("nope", "qwen3", "serving.tool_call_parser", "known: apertus,"),
        ("hermes", "nope", "serving.reasoning_parser", "known: cohere_command3,"),
    ],
)
def test_refusals_name_the_key_and_what_would_work(tool: str, reasoning: str, key: str, needle: str) -> None:
    with pytest.raises(ConfigError) as exc:
        make_turn_parser(tool, reasoning, None, use_vllm=False)
    assert exc.value.parameter == key and needle in str(exc.value)
