"""`lego adapter` (standalone): sessions opened on first use, turn records written when it stops."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
from pathlib import Path

import aiohttp
from aiohttp import web
from support.scripted_engine import ScriptedPolicyEngine
from typer.testing import CliRunner

from lego_rl.adapter.sessions import load_turn_records
from lego_rl.cli.main import app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_lego_adapter_command_opens_sessions_and_saves_records(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = ScriptedPolicyEngine(tiny_model_dir, ["Hello from the policy."])
    runner = web.AppRunner(engine.app(), access_log=None)
    await runner.setup()
    engine_port, adapter_port = free_port(), free_port()
    await web.TCPSite(runner, "127.0.0.1", engine_port).start()
    records = tmp_path / "records"
    proc = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("lego")), "adapter", "--serving-url", f"http://127.0.0.1:{engine_port}",
        "--model", str(tiny_model_dir), "--open-sessions", str(records), "--port", str(adapter_port),
        stderr=asyncio.subprocess.PIPE)
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(1200):  # the CLI imports transformers: slow on a loaded machine
                assert proc.returncode is None, "lego adapter exited early"
                try:
                    async with http.get(f"http://127.0.0.1:{adapter_port}/health") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.1)
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            async with http.post(f"http://127.0.0.1:{adapter_port}/v1/chat/completions", json=body,
                                 headers={"Authorization": "Bearer dev-1"}) as r:
                reply = await r.json()
        assert reply["choices"][0]["message"]["content"] == "Hello from the policy."
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(proc.communicate(), 60)
        await runner.cleanup()
    assert proc.returncode == 0, stderr.decode()[-2000:]
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
