"""Model families whose chat format lego-rl renders and parses: template, control tokens, parser names.

Each family's chat template (``lego_rl/serving/data/templates/<name>.jinja``, next to the tiny model whose
template is the qwen3 family's) is written for lego-rl from the family's public
format description (never a vendor's template): how tools are declared, how the model writes its calls and
reasoning, how tool results come back, and which reasoning stays in the history. A real model directory
brings its own template (``ChatRenderer.from_pretrained`` reads it from the tokenizer); these templates let
the tests (and a random-init model at a family's token set) exercise the same format offline.

``added_tokens`` are the family's control tokens in the form the tokenizer needs them (text, special?);
``stop_tokens`` end a sampled turn (the model's generation_config eos ids). ``tool_call_parser`` and
``reasoning_parser`` are vLLM's names of the parsers that read the family's output.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Family:
    name: str
    tool_call_parser: str
    reasoning_parser: str
    added_tokens: tuple[tuple[str, bool], ...]
    stop_tokens: tuple[str, ...]
    description: str

    def chat_template(self) -> str:
        """The family's chat template source (Jinja)."""
        from lego_rl.serving.tiny_model import family_template

        return family_template(self.name)

    def tokenizer_dir(self, out_dir: Path) -> Path:
        """A tokenizer directory in this family's format over the tiny BPE (``build_family_tokenizer``)."""
        from lego_rl.serving.tiny_model import build_family_tokenizer  # tokenizers/transformers: only when used

        return build_family_tokenizer(out_dir, added_tokens=self.added_tokens, stop_tokens=self.stop_tokens,
                                      template=self.chat_template())


QWEN_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<tool_call>", False), ("</tool_call>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
)

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("qwen3", "qwen3_coder", "qwen3", QWEN_TOKENS, ("<|im_end|>", "<|endoftext|>"),
               "Qwen3 / Qwen3-Coder: ChatML turns, qwen3_coder XML calls in <tool_call>, <think> reasoning"),
        Family("hermes", "hermes", "qwen3", QWEN_TOKENS, ("<|im_end|>", "<|endoftext|>"),
               "Hermes-style JSON calls ({\"name\", \"arguments\"} in <tool_call>) on ChatML turns (Qwen2.5, "
               "Qwen3 instruct, Hermes)"),
        Family("glm45", "glm45", "glm45",
               (("<|endoftext|>", True), ("[gMASK]", True), ("<sop>", True), ("<|system|>", True), ("<|user|>", True),
                ("<|assistant|>", True), ("<|observation|>", True), ("<think>", False), ("</think>", False),
                ("<tool_call>", False), ("</tool_call>", False), ("<arg_key>", False), ("</arg_key>", False),
                ("<arg_value>", False), ("</arg_value>", False), ("<tool_response>", False),
                ("</tool_response>", False)),
               ("<|user|>", "<|observation|>", "<|endoftext|>"),
               "GLM-4.5/4.6/4.7: role tokens with no end-of-message token (the model stops on the next role's "
               "token), <arg_key>/<arg_value> calls, reasoning of turns before the last user message dropped"),
        Family("deepseek_v31", "deepseek_v31", "deepseek_v3",
               (("<｜begin▁of▁sentence｜>", True), ("<｜end▁of▁sentence｜>", True), ("<｜User｜>", True),
                ("<｜Assistant｜>", True), ("<think>", False), ("</think>", False),
                ("<｜tool▁calls▁begin｜>", False), ("<｜tool▁calls▁end｜>", False), ("<｜tool▁call▁begin｜>", False),
                ("<｜tool▁call▁end｜>", False), ("<｜tool▁sep｜>", False), ("<｜tool▁output▁begin｜>", False),
                ("<｜tool▁output▁end｜>", False)),
               ("<｜end▁of▁sentence｜>",),
               "DeepSeek V3.1/V3.2 chat format: NAME<｜tool▁sep｜>JSON calls, reasoning (thinking=true) only in the "
               "turns after the last user message"),
        Family("kimi_k2", "kimi_k2", "kimi_k2",
               (("[EOS]", True), ("<|im_end|>", True), ("<|im_user|>", True), ("<|im_assistant|>", True),
                ("<|im_system|>", True), ("<|im_middle|>", True), ("<think>", False), ("</think>", False),
                ("<|tool_calls_section_begin|>", False), ("<|tool_calls_section_end|>", False),
                ("<|tool_call_begin|>", False), ("<|tool_call_argument_begin|>", False), ("<|tool_call_end|>", False)),
               ("<|im_end|>", "[EOS]"),
               "Kimi K2: <|im_*|> role headers, calls named functions.NAME:INDEX with JSON arguments, tool results "
               "as tool-role messages naming the call"),
    )
}
"""The families lego-rl ships templates for (docs/serving.md says what was verified for each)."""


def family(name: str) -> Family:
    """The family called ``name``; ``KeyError`` naming the known ones otherwise."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(f"no chat family {name!r}; known: {', '.join(FAMILIES)}") from None
