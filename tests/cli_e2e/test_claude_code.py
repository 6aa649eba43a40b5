"""Claude Code (real CLI from npm) through the adapter's Anthropic Messages front end."""

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


def claude_env(home: Path, url: str, key: str) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"], "HOME": str(home), "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": key,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "IS_SANDBOX": "1", "DISABLE_AUTOUPDATER": "1",
    }


def claude_cmd(binary: Path, prompt: str = PROMPT, max_turns: int = 4) -> list[str]:
    return [str(binary), "-p", prompt, "--output-format", "stream-json", "--verbose", "--max-turns",
            str(max_turns), "--tools", "Bash,Read,Edit,Write,Glob,Grep", "--dangerously-skip-permissions"]


def result_event(stdout: str) -> dict[str, Any]:
    events = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    results = [e for e in events if e.get("type") == "result"]
    assert results, stdout[-2000:]
    return results[-1]


def policy(prompt: str, index: int) -> str:
    """Call Bash to write the file until a tool result is in the prompt, then answer."""
    if "<tool_response>" in prompt:
        return "Done: hello.txt now contains hello-from-lego."
    return THINK + tool_call_text("Bash", {"command": "echo hello-from-lego > hello.txt && cat hello.txt",
                                   "description": "Write hello.txt"})


async def test_claude_code_tool_loop_through_adapter(start_adapter, cli_path, tmp_path: Path) -> None:
    adapter = await start_adapter(policy)
    work, home = tmp_path / "repo", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    res = await run_caged(claude_cmd(cli_path("claude")), forwards=adapter.forwards,
                          env=claude_env(home, adapter.url, "sess-1"), cwd=work, timeout=240)
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
    assert (work / "hello.txt").read_text() == "hello-from-lego\n"
    final = result_event(res.stdout)
    assert final.get("is_error") is False and "hello-from-lego" in final.get("result", "")

    session = adapter.sessions.get("sess-1")
    main = session.main_records()
    assert [r.stop_reason for r in main] == ["tool_use", "end_turn"]
    assert_records_match_engine(session.records, adapter.engine)
    assert main[0].render_mode == "full"
    assert main[1].render_mode == "bridged"
    assert main[1].prompt_ids[: len(main[0].prompt_ids) + len(main[0].output_ids)] == (
        main[0].prompt_ids + main[0].output_ids)
    assert session.infra_failure is None


async def test_claude_code_plain_tiny_model_to_completion(start_adapter, cli_path, tmp_path: Path) -> None:
    """The embedded engine serving the random tiny model: Claude Code runs until it stops by itself.

    A random model practically never samples its end-of-message token, so its turns stop at the output
    limit (``max_tokens``); Claude Code asks it to continue a few times, then ends with a
    ``max_output_tokens`` error result (exit 1). A turn that did end (exit 0) is accepted too. Either
    way every request was answered and recorded with real logprobs.
    """
    adapter = await start_adapter(None, max_response_tokens=8)
    work, home = tmp_path / "repo", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    res = await run_caged(claude_cmd(cli_path("claude"), "Say hello.", max_turns=2), forwards=adapter.forwards,
                          env=claude_env(home, adapter.url, "sess-1"), cwd=work, timeout=240)
    assert not res.timed_out
    final = result_event(res.stdout)
    session = adapter.sessions.get("sess-1")
    records = session.main_records()
    assert records and session.infra_failure is None
    for record in session.records:
        assert len(record.logprobs) == len(record.output_ids) > 0
    if records[-1].stop_reason == "max_tokens":
        assert res.returncode == 1 and final.get("api_error") == "max_output_tokens", res.stdout[-3000:]
    else:
        assert res.returncode == 0 and final.get("is_error") is False, res.stdout[-3000:]


async def test_claude_code_parallel_tool_calls(start_adapter, cli_path, tmp_path: Path) -> None:
    """Two tool_use blocks in one turn: Claude Code answers both tool_use ids; the next turn is bridged."""

    def policy(prompt: str, index: int) -> str:
        if "<tool_response>" in prompt:
            assert prompt.count("<tool_response>") == 2
            return "Done: both files written."
        return (tool_call_text("Bash", {"command": "echo one > one.txt", "description": "one"}) + "\n"
                + tool_call_text("Bash", {"command": "echo two > two.txt", "description": "two"}))

    adapter = await start_adapter(policy)
    work, home = tmp_path / "repo", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    res = await run_caged(claude_cmd(cli_path("claude")), forwards=adapter.forwards,
                          env=claude_env(home, adapter.url, "sess-1"), cwd=work, timeout=240)
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
    assert (work / "one.txt").read_text() == "one\n" and (work / "two.txt").read_text() == "two\n"
    session = adapter.sessions.get("sess-1")
    main = session.main_records()
    assert [r.tool_calls for r in main] == [2, 0] and [r.render_mode for r in main] == ["full", "bridged"]
    assert_records_match_engine(session.records, adapter.engine)
