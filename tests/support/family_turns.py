"""TEST DOUBLE: a scripted policy's turns written in one model family's output format.

A random tiny model writes no family's format, so this stands in for the policy at the model boundary: it writes
the text a model of the family samples for a turn (reasoning, text, calls), written here from the formats'
public descriptions, independently of the templates under test. The chain tests render the history with the
family's template and check that the prompt after a turn continues exactly the ids of the turn.
"""

from __future__ import annotations

import json
from typing import Any

Call = tuple[str, dict[str, Any]]


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def write_turn(family: str, reasoning: str | None, text: str, calls: list[Call], *, first_call_index: int = 0) -> str:
    """The sampled text of one turn (no stop token); ``first_call_index`` numbers Kimi K2's calls."""
    js = [json.dumps(args, ensure_ascii=False) for _, args in calls]
    if family in ("qwen3", "hermes"):
        out = f"<think>\n{reasoning}\n</think>\n\n" if reasoning is not None else ""
        out += text
        for i, (name, args) in enumerate(calls):
            out += "\n" if text or i else ""
            if family == "qwen3":
                params = "".join(f"<parameter={k}>\n{_value(v)}\n</parameter>\n" for k, v in args.items())
                out += f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"
            else:
                out += f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {js[i]}}}\n</tool_call>'
        return out
    if family == "glm45":
        out = f"<think>{reasoning or ''}</think>" + (f"\n{text}" if text else "")
        for name, args in calls:
            pairs = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{_value(v)}</arg_value>\n" for k, v in args.items())
            out += f"\n<tool_call>{name}\n{pairs}</tool_call>"
        return out
    if family == "deepseek_v31":  # thinking on: the generation prompt opened <think>
        out = f"{reasoning or ''}</think>{text}"
        if calls:
            out += "<｜tool▁calls▁begin｜>" + "".join(
                f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{j}<｜tool▁call▁end｜>" for (name, _), j in zip(calls, js)
            ) + "<｜tool▁calls▁end｜>"
        return out
    if family == "kimi_k2":
        out = (f"<think>{reasoning}</think>" if reasoning is not None else "") + text
        if calls:
            out += "<|tool_calls_section_begin|>" + "".join(
                f"<|tool_call_begin|>functions.{name}:{first_call_index + i}<|tool_call_argument_begin|>{j}"
                "<|tool_call_end|>" for i, ((name, _), j) in enumerate(zip(calls, js))
            ) + "<|tool_calls_section_end|>"
        return out
    raise ValueError(f"no turn writer for family {family!r}")


def stop_token(family: str, calls: list[Call]) -> str:
    """The stop token the model samples after the turn (GLM: the role that comes next)."""
    if family == "glm45":
        return "<|observation|>" if calls else "<|user|>"
    return {"deepseek_v31": "<｜end▁of▁sentence｜>"}.get(family, "<|im_end|>")


SCRIPT: list[tuple[str, str, list[Call]]] = [
    ("I should look at the files first.", "", [("Bash", {"command": "ls -la", "description": "List files"})]),
    ("Two reads at once.", "Reading both.", [("Read", {"file_path": "/repo/a.py"}),
                                             ("Read", {"file_path": "/repo/b.py", "limit": 20})]),
    ("Done.", "The repo has two files.", []),
]
"""The double's rollout: (reasoning, text, calls) per turn: one call, two parallel calls, a final answer."""

TOOL_SPECS: list[dict[str, Any]] = [
    {"name": "Bash", "description": "Run a shell command.", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
        "required": ["command"]}},
    {"name": "Read", "description": "Read a file.", "parameters": {
        "type": "object", "properties": {"file_path": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["file_path"]}},
]
"""The shapes of Claude Code's Bash and Read tools the script calls (for parsers that read argument types)."""

TEMPLATE_KWARGS: dict[str, dict[str, Any]] = {"deepseek_v31": {"thinking": True}}
"""Per family: the chat-template kwargs of the script (DeepSeek V3.1 thinks only when asked)."""


def family_cases(family: str, tool_call_parser: str, reasoning_parser: str, tokenizer: str) -> list[dict[str, Any]]:
    """The script's turns as parser-corpus cases (tests/support/parser_corpus.py's shape) for the vLLM oracle."""
    cases = []
    calls_before = 0
    for step, (reasoning, text, calls) in enumerate(SCRIPT):
        cases.append({"id": f"family/{family}/{step}", "tool_call_parser": tool_call_parser,
                      "reasoning_parser": reasoning_parser, "tools": True, "tool_specs": TOOL_SPECS,
                      "tokenizer": tokenizer, "template_kwargs": TEMPLATE_KWARGS.get(family, {}),
                      "text": write_turn(family, reasoning, text, calls, first_call_index=calls_before),
                      "expect": [reasoning, text, [[n, a] for n, a in calls]]})
        calls_before += len(calls)
    return cases
