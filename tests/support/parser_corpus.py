"""The conformance corpus: sampled turns in each format we ship built-in parsers for, parsed by vLLM's parsers
(the oracle) and by ours (tests/chat/test_parser_conformance.py).

Pure data and JSON-able, because the vLLM side reads it in the vLLM environment's interpreter. A case is
(id, tool-call parser, reasoning parser, text, whether tools are offered, chat-template kwargs). The tool
offered is ``BASH``, whose schema has one parameter of every JSON type.
"""

from __future__ import annotations

import json
from typing import Any

BASH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "cmd": {"type": "string"},
        "timeout": {"type": "integer"},
        "background": {"type": "boolean"},
        "env": {"type": "object"},
        "ratio": {"type": "number"},
        "paths": {"type": "array", "items": {"type": "string"}},
        "note": {"type": ["string", "null"]},
    },
}
TOOLS: list[dict[str, Any]] = [{"name": "bash", "description": "run a command", "parameters": BASH_SCHEMA}]

ALL_TYPES = {"cmd": "ls -l", "timeout": 30, "background": True, "env": {"A": 1, "B": [True, None]}, "ratio": 0.5,
             "paths": ["a b", "c"], "note": None}


def xml(name: str, args: dict[str, Any], *, close: bool = True) -> str:
    """A qwen3_coder call as the Qwen3-Coder template writes one (strings bare, the rest as JSON)."""
    body = "".join(f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
                   for k, v in args.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n" + ("</tool_call>" if close else "")


def js(name: str, args: dict[str, Any], *, close: bool = True) -> str:
    """A hermes call."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n" + ("</tool_call>" if close else "")


LS = {"cmd": "ls"}
THOUGHT = "<think>\nr\n</think>\n\n"
"""Closed reasoning ahead of text: vLLM's qwen3 reads untagged text as reasoning (a documented difference)."""


def _cases() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def case(cid: str, tool: str, text: str, *, reasoning: str = "qwen3", tools: bool = True,
             kwargs: dict[str, Any] | None = None) -> None:
        out.append({"id": cid, "tool_call_parser": tool, "reasoning_parser": reasoning, "text": text,
                    "tools": tools, "template_kwargs": kwargs or {}})

    for tool, call in (("qwen3_coder", xml), ("hermes", js)):
        case(f"{tool}/one_call", tool, call("bash", LS))
        case(f"{tool}/several_calls", tool, call("bash", LS) + "\n" + call("bash", {"cmd": "pwd", "timeout": 5}))
        case(f"{tool}/every_json_type", tool, call("bash", ALL_TYPES))
        case(f"{tool}/string_that_reads_as_number", tool, call("bash", {"cmd": "42"}))
        case(f"{tool}/text_before_call", tool, THOUGHT + "Let me look.\n" + call("bash", LS))
        case(f"{tool}/untagged_text_before_call", tool, "Let me look.\n" + call("bash", LS))
        case(f"{tool}/text_after_call", tool, call("bash", LS) + "\nDone.")
        case(f"{tool}/text_between_calls", tool, call("bash", LS) + "\nthen\n" + call("bash", LS))
        case(f"{tool}/reasoning_then_call", tool, "<think>\nplan\n</think>\n\n" + call("bash", LS))
        case(f"{tool}/reasoning_unclosed_then_call", tool, "<think>\nplan\n" + call("bash", LS))
        case(f"{tool}/template_opened_reasoning_then_call", tool, "plan\n</think>\n\n" + call("bash", LS))
        case(f"{tool}/unknown_tool", tool, call("grep", {"pattern": "x"}))
        case(f"{tool}/cut_after_call_body", tool, THOUGHT + "ok\n" + call("bash", LS, close=False))
        case(f"{tool}/good_then_cut_mid_second", tool, call("bash", LS) + "\n" + call("bash", LS)[:25])
        case(f"{tool}/cut_mid_first", tool, THOUGHT + "ok\n" + call("bash", ALL_TYPES)[:40])
        case(f"{tool}/no_tools_offered", tool, call("bash", LS), tools=False)
        case(f"{tool}/no_reasoning_parser", tool, "<think>r</think>\n" + call("bash", LS), reasoning="none")
        case(f"{tool}/plain_answer_after_reasoning", tool, "<think>\nr\n</think>\n\nThe answer is 4.")
    case("qwen3_coder/stray_text_in_function", "qwen3_coder",
         "<tool_call>\n<function=bash>\nstray\n<parameter=cmd>\nls\n</parameter>\n</function>\n</tool_call>")
    case("qwen3_coder/duplicate_parameter", "qwen3_coder",
         "<tool_call>\n<function=bash>\n<parameter=cmd>\na\n</parameter>\n<parameter=cmd>\nb\n</parameter>\n"
         "</function>\n</tool_call>")
    case("qwen3_coder/mistyped_integer", "qwen3_coder", xml("bash", {"cmd": "ls", "timeout": "soon"}))
    case("hermes/bad_json", "hermes", THOUGHT + 'Trying.\n<tool_call>\n{"name": "bash", "arguments": {cmd: ls}}\n</tool_call>')
    case("hermes/bad_json_next_to_good", "hermes",
         js("bash", LS) + '\n<tool_call>\n{"name": "bash", "arguments": {cmd}}\n</tool_call>')
    case("hermes/no_name", "hermes", '<tool_call>\n{"arguments": {"cmd": "ls"}}\n</tool_call>')
    case("hermes/arguments_as_string", "hermes",
         '<tool_call>\n{"name": "bash", "arguments": "{\\"cmd\\": \\"ls\\"}"}\n</tool_call>')
    for cid, text in (
        ("closed", "<think>\nplan\n</think>\n\nanswer"),
        ("template_opened", "plan\n</think>\n\nanswer"),
        ("unclosed_cut_at_cap", "<think>\nplan that was cut"),
        ("empty", "<think>\n\n</think>\n\nanswer"),
        ("no_tags", "just an answer"),
    ):
        case(f"qwen3/{cid}", "hermes", text, tools=False)
    case("qwen3/no_tags_thinking_off", "hermes", "just an answer", tools=False, kwargs={"enable_thinking": False})
    return out


CASES: list[dict[str, Any]] = _cases()
