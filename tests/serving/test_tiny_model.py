"""The tiny offline model: build, cache, tokenizer and chat template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lego_rl.errors import ConfigError
from lego_rl.serving.tiny_model import ADDED_TOKENS, MARKER, build_tiny_model, ensure_tiny_model

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_shell",
            "description": "Run a command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(cache_dir=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def tokenizer(tiny: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny)


def test_build_is_complete_and_cached(tiny: Path) -> None:
    cfg = json.loads((tiny / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"]
    assert cfg["head_dim"] >= 64 and cfg["max_position_embeddings"] >= 65536
    assert (tiny / MARKER).is_file() and (tiny / "model.safetensors").is_file()
    assert "chat_template" in json.loads((tiny / "tokenizer_config.json").read_text())
    assert ensure_tiny_model(cache_dir=tiny.parent) == tiny  # second call reuses the build
    assert not [p for p in tiny.parent.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_vocab_matches_model_and_added_tokens(tiny: Path, tokenizer) -> None:
    cfg = json.loads((tiny / "config.json").read_text())
    assert len(tokenizer) == cfg["vocab_size"]
    assert 1500 <= cfg["vocab_size"] <= 4096
    for text, _ in ADDED_TOKENS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert len(ids) == 1, text
    assert tokenizer.eos_token == "<|im_end|>"
    assert cfg["eos_token_id"] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    sample = "héllo wörld 世界 def f(x):\n\treturn {'a': 1}  <tool_call>"
    assert tokenizer.decode(tokenizer.encode(sample, add_special_tokens=False)) == sample


def test_chat_template_renders_tools_calls_responses_reasoning(tokenizer) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Fix it."},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Look first.",
            "tool_calls": [{"id": "c1", "type": "function",
                            "function": {"name": "run_shell", "arguments": {"command": "ls", "n": 2}}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
        {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "b.py"}]},
    ]
    text = tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert '<tools>\n{"type": "function", "function": {"name": "run_shell"' in text
    assert "<|im_start|>user\nFix it.<|im_end|>\n" in text
    # reasoning after the last user query is kept; the call is in qwen3_coder XML form
    assert (
        "<|im_start|>assistant\n<think>\nLook first.\n</think>\n\n<tool_call>\n<function=run_shell>\n"
        "<parameter=command>\nls\n</parameter>\n<parameter=n>\n2\n</parameter>\n</function>\n</tool_call>"
        "<|im_end|>\n"
    ) in text
    assert (
        "<|im_start|>user\n<tool_response>\na.py\n</tool_response>\n<tool_response>\nb.py\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    ) in text
    assert text.endswith("<|im_start|>assistant\n")
    # every message ends at "<|im_end|>\n": a rendering of a prefix is a prefix of the rendering
    shorter = tokenizer.apply_chat_template(messages[:3], tools=TOOLS, tokenize=False)
    assert text.startswith(shorter)


def test_chat_template_thinking_switch_and_old_reasoning(tokenizer) -> None:
    messages = [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "A", "reasoning_content": "old thought"},
        {"role": "user", "content": "two"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                         enable_thinking=False, reasoning_effort="low")
    assert text.startswith("<|im_start|>system\nReasoning effort: low<|im_end|>\n")
    assert "old thought" not in text  # reasoning before the last user query is dropped, as in Qwen3
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    kept = tokenizer.apply_chat_template(messages, tokenize=False, keep_all_reasoning=True)
    assert "<think>\nold thought\n</think>\n\nA<|im_end|>" in kept


def test_build_refuses_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not an up-to-date tiny model"):
        build_tiny_model(tmp_path / "x")
    assert (tmp_path / "x" / "keep.txt").read_text() == "mine"


@pytest.mark.slow
def test_cli_model_tiny(tmp_path: Path) -> None:
    from lego_rl.cli.main import app

    runner = CliRunner()
    result = runner.invoke(app, ["model", "tiny", "--out", str(tmp_path / "m")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "m" / MARKER).is_file()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "f").write_text("x")
    result = runner.invoke(app, ["model", "tiny", "--out", str(tmp_path / "other")])
    assert result.exit_code == 2
    result = runner.invoke(app, ["model", "tiny", "--out", str(tmp_path / "other"), "--force"])
    assert result.exit_code == 0 and not (tmp_path / "other" / "f").exists()
