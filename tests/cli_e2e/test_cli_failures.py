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


async def test_full_context_window_ends_claude_code_and_codex(start_adapter, cli_path, tmp_path: Path) -> None:
    """A first turn larger than the session's window: no engine call, a protocol stop, and the CLI ends."""
    adapter = await start_adapter(["never used"], sessions=("sess-1",), max_context_tokens=64)
    claude = await run_claude(adapter, cli_path, tmp_path / "claude")
    assert not claude.timed_out, claude.stdout[-2000:]
    final = result_event(claude.stdout)
    codex, _ = await run_codex(adapter, cli_path, tmp_path / "codex")
    assert not codex.timed_out and codex.returncode == 0, (codex.stdout[-2000:], codex.stderr[-2000:])
    assert any(e.get("type") == "turn.completed" for e in events(codex.stdout))
    session = adapter.sessions.get("sess-1")
    assert adapter.engine.calls == [] and session.termination == "context_limit"
    # The text alone is over the window, so the adapter answered before rendering: no ids, nothing recorded.
    assert session.records == []
    print("claude:", claude.returncode, final.get("subtype"), final.get("terminal_reason"), final.get("api_error"))


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
