"""Run by the vLLM environment's interpreter (one process: vLLM's import takes 13 s and more), with lego's
``src`` on ``PYTHONPATH``: ``python vllm_parser_oracle.py IN.json OUT.json``.

IN holds the tokenizer directory, the tools and the corpus (tests/support/parser_corpus.py; a case may name its
own tokenizer and ``tool_specs``: the chat families' turns, tests/support/family_turns.py). For every case OUT
gets what vLLM's own parsers make of the text, composed the way its chat-completions server composes them
(``ParserManager.get_parser``, one ``Parser`` per answer, ``parse``), and what lego's adapter over them
(``lego_rl.chat.vllm_parsers.VllmTurnParser``) makes of it; plus the parser names this vLLM registers.
The oracle side is written here from vLLM's public interface, independently of the adapter it checks.
"""

from __future__ import annotations

import itertools
import json
import sys
from typing import Any


def main(inp: str, outp: str) -> None:
    from transformers import AutoTokenizer
    from vllm import __version__ as vllm_version
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser.parser_manager import ParserManager
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    from lego_rl.chat.messages import ToolSpec
    from lego_rl.chat.vllm_parsers import VllmTurnParser

    spec = json.loads(open(inp).read())
    tokenizers: dict[str, Any] = {}
    results: dict[str, Any] = {}
    adapters: dict[tuple[str, str, str], VllmTurnParser] = {}
    ids = itertools.count()
    for case in spec["cases"]:
        # A case may bring its own tokenizer (a model family's control tokens) and tools.
        tok_dir = case.get("tokenizer", spec["tokenizer"])
        if tok_dir not in tokenizers:
            tokenizers[tok_dir] = AutoTokenizer.from_pretrained(tok_dir)
        tok = tokenizers[tok_dir]
        tool_dicts = case.get("tool_specs", spec["tools"])
        tools = [ToolSpec(**t) for t in tool_dicts]
        wire_tools = [{"type": "function", "function": t} for t in tool_dicts]
        tp, rp, text = case["tool_call_parser"], case["reasoning_parser"], case["text"]
        offered = wire_tools if case["tools"] else None
        request = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], model="m", tools=offered,
                                        tool_choice="auto" if offered else "none")
        parser_cls = ParserManager.get_parser(tool_parser_name=tp, reasoning_parser_name=None if rp == "none" else rp,
                                              enable_auto_tools=True, tokenizer=tok)
        parser = parser_cls(tok, request.tools, chat_template_kwargs=case["template_kwargs"])
        output_ids = tok.encode(text, add_special_tokens=False)
        reasoning, content, calls = parser.parse(text, request, enable_auto_tools=bool(offered),
                                                 model_output_token_ids=output_ids)
        key = (tp, rp, tok_dir)
        if key not in adapters:
            adapters[key] = VllmTurnParser(tp, rp, tok)
        ours = adapters[key].parse(text, tools if case["tools"] else [], new_id=lambda: f"id{next(ids)}",
                                   template_kwargs=case["template_kwargs"], output_ids=output_ids)
        results[case["id"]] = {
            "vllm": {"reasoning": reasoning, "content": content,
                     "calls": [[c.name, c.arguments] for c in calls or []]},
            "adapter": {"reasoning": ours.reasoning, "text": ours.text, "parse_failures": ours.parse_failures,
                        "calls": [[c.name, c.arguments] for c in ours.tool_calls]},
        }
    out = {"version": vllm_version, "tool_call_parsers": ToolParserManager.list_registered(),
           "reasoning_parsers": ReasoningParserManager.list_registered(), "cases": results}
    with open(outp, "w") as fh:
        json.dump(out, fh)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
