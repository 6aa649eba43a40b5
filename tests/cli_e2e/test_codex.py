"""Codex (real CLI 0.162.1 from npm) through the adapter's OpenAI Responses front end."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_records_match_engine
from support.netcage import run_caged
from support.scripted_engine import THINK, tool_call_text

pytestmark = [pytest.mark.slow, pytest.mark.cli, pytest.mark.root]

PROMPT = "Create a file hello.txt containing hello-from-lego, then tell me you are done."
PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+hello-from-lego\n*** End Patch"


def codex_env(home: Path, key: str) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "HOME": str(home), "CODEX_HOME": str(home / ".codex"),
            "LEGO_SESSION": key}


def codex_cmd(binary: Path, url: str, model: str = "lego-tiny", prompt: str = PROMPT) -> list[str]:
    provider = [
        "-c", "model_provider=lego", "-c", "model_providers.lego.name=lego",
        "-c", f"model_providers.lego.base_url={url}/v1", "-c", 'model_providers.lego.wire_api="responses"',
        "-c", "model_providers.lego.env_key=LEGO_SESSION", "-c", "model_providers.lego.stream_max_retries=0",
        "-c", "model_providers.lego.request_max_retries=0",
    ]
    return [str(binary), "exec", "--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
            "--disable", "plugins", "-m", model, *provider, "-c", 'web_search="disabled"',
            "-c", "analytics.enabled=false", "-c", "check_for_update_on_startup=false", prompt]


def events(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def agent_messages(stdout: str) -> list[str]:
    return [e["item"]["text"] for e in events(stdout)
            if e.get("type") == "item.completed" and e["item"].get("type") == "agent_message"]


async def run_codex(adapter: Any, cli_path: Any, tmp_path: Path, model: str = "lego-tiny",
                    session: str = "sess-1") -> tuple[Any, Path]:
    work, home = tmp_path / "repo", tmp_path / "home"
    work.mkdir(parents=True, exist_ok=True)
    (home / ".codex").mkdir(parents=True, exist_ok=True)
    res = await run_caged(codex_cmd(cli_path("codex"), adapter.url, model), forwards=adapter.forwards,
                          env=codex_env(home, session), cwd=work, timeout=240)
    return res, work


def assert_bridged_tool_loop(adapter: Any) -> None:
    session = adapter.sessions.get("sess-1")
    main = session.main_records()
    assert [r.stop_reason for r in main] == ["tool_use", "end_turn"]
    assert_records_match_engine(session.records, adapter.engine)
    assert [r.render_mode for r in main] == ["full", "bridged"]
    assert main[1].prompt_ids[: len(main[0].prompt_ids) + len(main[0].output_ids)] == (
        main[0].prompt_ids + main[0].output_ids)
    assert session.infra_failure is None


async def test_codex_function_tool_loop_through_adapter(start_adapter, cli_path, tmp_path: Path) -> None:
    def policy(prompt: str, index: int) -> str:
        if "<tool_response>" in prompt:
            return "Done: hello.txt now contains hello-from-lego."
        return THINK + tool_call_text("exec_command", {"cmd": "echo hello-from-lego > hello.txt"})

    adapter = await start_adapter(policy)
    res, work = await run_codex(adapter, cli_path, tmp_path)
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
    assert (work / "hello.txt").read_text() == "hello-from-lego\n"
    assert agent_messages(res.stdout)[-1] == "Done: hello.txt now contains hello-from-lego."
    assert_bridged_tool_loop(adapter)


async def test_codex_custom_grammar_tool_apply_patch(start_adapter, cli_path, tmp_path: Path) -> None:
    """With a model name Codex knows (gpt-5.5) it offers apply_patch as a custom grammar tool."""

    def policy(prompt: str, index: int) -> str:
        assert "apply_patch" in prompt  # the custom tool was offered to the model
        if "<tool_response>" in prompt:
            return "Done: patched in hello.txt."
        return tool_call_text("apply_patch", {"input": PATCH})

    adapter = await start_adapter(policy)
    res, work = await run_codex(adapter, cli_path, tmp_path, model="gpt-5.5")
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
    assert (work / "hello.txt").read_text() == "hello-from-lego\n"
    assert agent_messages(res.stdout)[-1] == "Done: patched in hello.txt."
    assert_bridged_tool_loop(adapter)


async def test_codex_plain_tiny_model_to_completion(start_adapter, cli_path, tmp_path: Path) -> None:
    """The embedded engine serving the random tiny model: Codex runs until it stops by itself.

    A random model practically never samples its end-of-message token, so its turns end at the output
    limit; the adapter answers those as ``incomplete`` (``max_output_tokens``), on which Codex fails the
    turn and exits 1. An answer that did end (exit 0) is accepted too. Either way every request was
    answered and recorded with real logprobs.
    """
    adapter = await start_adapter(None, max_response_tokens=8)
    res, _ = await run_codex(adapter, cli_path, tmp_path)
    assert not res.timed_out
    session = adapter.sessions.get("sess-1")
    records = session.main_records()
    assert records and session.infra_failure is None
    for record in session.records:
        assert len(record.logprobs) == len(record.output_ids) > 0
    if records[-1].stop_reason == "max_tokens":
        assert res.returncode == 1, res.stdout[-3000:]
        assert "Incomplete response returned, reason: max_output_tokens" in res.stdout
    else:
        assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])


async def test_codex_parallel_calls_results_by_call_id(start_adapter, cli_path, tmp_path: Path) -> None:
    """Two calls in one turn: Codex runs both and answers each by call_id; the next turn is bridged."""

    def policy(prompt: str, index: int) -> str:
        if "<tool_response>" in prompt:
            assert prompt.count("<tool_response>") == 2
            return "Done: both files written."
        return (tool_call_text("exec_command", {"cmd": "echo one > one.txt"}) + "\n"
                + tool_call_text("exec_command", {"cmd": "echo two > two.txt"}))

    adapter = await start_adapter(policy)
    res, work = await run_codex(adapter, cli_path, tmp_path)
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
    assert (work / "one.txt").read_text() == "one\n" and (work / "two.txt").read_text() == "two\n"
    assert agent_messages(res.stdout)[-1] == "Done: both files written."
    assert_bridged_tool_loop(adapter)
    assert adapter.sessions.get("sess-1").main_records()[0].tool_calls == 2
