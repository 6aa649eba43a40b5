"""The real CLIs on the adapter's refusals and limits: each ends promptly, none loops or hangs."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.netcage import run_caged
from test_claude_code import claude_cmd, claude_env, result_event
from test_codex import events, run_codex
from test_opencode import run_opencode
from test_openhands import run_openhands

pytestmark = [pytest.mark.slow, pytest.mark.cli, pytest.mark.root]


async def run_claude(adapter, cli_path, tmp_path: Path, key: str = "sess-1"):
    work, home = tmp_path / "repo", tmp_path / "home"
    work.mkdir(parents=True, exist_ok=True)
    home.mkdir(parents=True, exist_ok=True)
    return await run_caged(claude_cmd(cli_path("claude"), "Say hello.", max_turns=2), forwards=adapter.forwards,
                           env=claude_env(home, adapter.url, key), cwd=work, timeout=120)


async def test_unknown_session_ends_each_cli_with_the_adapters_message(start_adapter, cli_path, tmp_path: Path) -> None:
    adapter = await start_adapter(["never used"])
    claude = await run_claude(adapter, cli_path, tmp_path / "claude", key="no-such-session")
    assert not claude.timed_out and claude.returncode != 0
    codex, _ = await run_codex(adapter, cli_path, tmp_path / "codex", session="no-such-session")
    assert not codex.timed_out and codex.returncode != 0
    assert "unknown session 'no-such-session'" in codex.stdout + codex.stderr
    opencode, _ = await run_opencode(adapter, cli_path, tmp_path / "opencode", key="no-such-session", timeout=180)
    assert not opencode.timed_out, "OpenCode kept retrying a refused session"
    assert "unknown session 'no-such-session'" in opencode.stdout + opencode.stderr
    openhands, _ = await run_openhands(adapter, cli_path, tmp_path / "openhands", key="no-such-session", timeout=120)
    assert not openhands.timed_out and openhands.returncode != 0
    assert adapter.engine.calls == [] and adapter.sessions.get("sess-1").records == []


async def test_full_context_window_ends_each_cli(start_adapter, cli_path, tmp_path: Path) -> None:
    """A first turn larger than the session's window: no engine call, and each CLI ends, naming the window.
    Claude Code gets Anthropic's 400 "prompt is too long" (one more request, its recovery attempt, then it
    ends as ``prompt_too_long``; on the stop ``model_context_window_exceeded`` it sent before, it read a cut
    output, ``max_output_tokens``, and sent three more requests). Codex gets OpenAI's
    ``context_length_exceeded`` in ``response.failed`` and reports it as its own context-window error (any
    other code there it retries); OpenCode gets it as a stream error and ends on it; OpenHands' litellm reads
    the 400 as its ContextWindowExceededError."""
    sessions = ("sess-1", "sess-codex", "sess-opencode", "sess-openhands")
    adapter = await start_adapter(["never used"], sessions=sessions, max_context_tokens=64)
    claude = await run_claude(adapter, cli_path, tmp_path / "claude")
    assert not claude.timed_out, claude.stdout[-2000:]
    final = result_event(claude.stdout)
    assert final.get("terminal_reason") == "prompt_too_long", final
    codex, _ = await run_codex(adapter, cli_path, tmp_path / "codex", session="sess-codex")
    assert not codex.timed_out and codex.returncode == 1, (codex.stdout[-2000:], codex.stderr[-2000:])
    [failed] = [e for e in events(codex.stdout) if e.get("type") == "turn.failed"]
    assert "ran out of room in the model's context window" in failed["error"]["message"], failed
    opencode, _ = await run_opencode(adapter, cli_path, tmp_path / "opencode", key="sess-opencode",
                                     timeout=120)
    said = opencode.stdout + opencode.stderr
    assert not opencode.timed_out and "context" in said.lower(), said[-3000:]
    openhands, _ = await run_openhands(adapter, cli_path, tmp_path / "openhands", key="sess-openhands",
                                       timeout=120)
    assert not openhands.timed_out and openhands.returncode != 0
    assert "ContextWindowExceededError" in openhands.stdout + openhands.stderr, openhands.stderr[-2000:]
    assert adapter.engine.calls == []
    for sid in sessions:
        session = adapter.sessions.get(sid)
        # The text alone is over the window: answered before rendering, no ids, nothing recorded.
        assert session.termination == "context_limit" and session.records == [], sid
    # One request each (no retry of the refusal); Claude Code makes one recovery attempt.
    assert [adapter.sessions.get(sid).requests for sid in sessions] == [2, 1, 1, 1]


async def test_request_cap_stops_opencode_instead_of_looping(start_adapter, cli_path, tmp_path: Path) -> None:
    """OpenCode is the loop-prone client: when its session's request cap is reached it must stop."""
    from support.scripted_engine import tool_call_text

    adapter = await start_adapter(
        lambda prompt, i: tool_call_text("bash", {"command": "echo again", "description": "loop"}), max_requests=2)
    res, _ = await run_opencode(adapter, cli_path, tmp_path, timeout=240)
    assert not res.timed_out, "OpenCode kept going past the session's request cap"
    assert "limit of 2 model requests" in res.stdout + res.stderr
    session = adapter.sessions.get("sess-1")
    assert len(session.records) == 2 and session.termination == "request_limit"
