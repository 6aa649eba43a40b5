"""`lego adapter` (standalone): sessions opened on first use, turn records written when it stops."""

from __future__ import annotations

import signal
from pathlib import Path

import aiohttp
from support.scripted_engine import ScriptedPolicyEngine
from support.standalone_adapter import standalone_adapter
from typer.testing import CliRunner

from lego_rl.adapter.sessions import load_turn_records
from lego_rl.cli.main import app


async def test_lego_adapter_command_opens_sessions_and_saves_records(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = ScriptedPolicyEngine(tiny_model_dir, ["Hello from the policy."])
    records = tmp_path / "records"
    async with standalone_adapter(engine, tiny_model_dir, records) as adapter:
        async with aiohttp.ClientSession() as http:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            async with http.post(f"{adapter.url}/v1/chat/completions", json=body,
                                 headers={"Authorization": "Bearer dev-1"}) as r:
                reply = await r.json()
        assert reply["choices"][0]["message"]["content"] == "Hello from the policy."
        stderr = await adapter.stop(signal.SIGTERM)
    assert adapter.proc.returncode == 0, stderr[-2000:]
    saved = load_turn_records(records / "dev-1.turns.jsonl")
    assert [r.output_ids for r in saved] == [engine.calls[0].output_ids]
    assert saved[0].prompt_ids == engine.calls[0].prompt_ids


def test_lego_adapter_without_a_way_to_open_sessions_is_a_usage_error(tiny_model_dir: Path) -> None:
    result = CliRunner().invoke(app, ["adapter", "--serving-url", "http://127.0.0.1:1", "--model", str(tiny_model_dir)])
    assert result.exit_code == 2
    assert "pass --open-sessions DIR or --session ID" in result.output


def test_lego_adapter_bad_template_kwargs_is_a_usage_error(tiny_model_dir: Path) -> None:
    result = CliRunner().invoke(app, ["adapter", "--serving-url", "http://127.0.0.1:1", "--model",
                                      str(tiny_model_dir), "--session", "x", "--template-kwargs", "[1]"])
    assert result.exit_code == 2 and "--template-kwargs" in result.output


def test_adapter_refuses_parser_names_it_cannot_run(tmp_path: Path) -> None:
    """`lego adapter --tool-call-parser` takes vLLM's names: an unknown one, or (here, without vLLM in lego's
    environment) one only vLLM has, exits 2 before anything starts, naming what would work."""
    for flags, needle in ((["--tool-call-parser", "qwen3coder"], "known: apertus,"),
                          (["--tool-call-parser", "kimi_k2"], "only the built-in ones run: qwen3_coder, hermes"),
                          (["--reasoning-parser", "deepseek_r1"], "without --tool-call-parser")):
        result = CliRunner().invoke(app, ["adapter", "--serving-url", "http://127.0.0.1:9", "--model", str(tmp_path),
                                          "--session", "s1", *flags])
        assert result.exit_code == 2, result.output
        assert needle in " ".join(result.output.split()), result.output
