"""Requests over 1 MB from real CLIs: the adapter reads them whole (a body cut at the socket's first
buffer was answered 400 and the CLI exited 1, which a rollout would label ``agent_error_exit``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.netcage import run_caged
from test_claude_code import claude_cmd, claude_env, result_event
from test_codex import codex_cmd, codex_env
from test_opencode import run_opencode, texts
from test_openhands import run_openhands, summary

pytestmark = [pytest.mark.slow, pytest.mark.cli, pytest.mark.root]

END = "END-OF-THE-PIPED-LOG"
LINE = "日志条目 " * 20 + "\n"
LINES = 1_100_000 // len(LINE.encode())


def big_log(path: Path) -> int:
    """~1.1 MB of log lines, mostly 3-byte characters: over 1 MB on the wire while the CLIs' own
    characters/4 token estimates stay under their context windows (which would refuse it locally)."""
    path.write_text(LINE * LINES + END + "\n")
    return path.stat().st_size


def policy(prompt: str, index: int) -> str:
    return "The log ends with " + END + "." if END in prompt else "I did not get the log."


# score=False: the tiny model cannot score a million-token prompt (65536 positions); the CLI, the HTTP
# path and the adapter are what is tested, and they are all real.
async def test_claude_code_megabyte_prompt(start_adapter, cli_path, tmp_path: Path) -> None:
    adapter = await start_adapter(policy, context_limit=4_000_000, score=False)
    work, home = tmp_path / "repo", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    assert big_log(work / "big.log") > 1_000_000
    cmd = ["sh", "-c", 'exec "$0" "$@" < big.log', *claude_cmd(cli_path("claude"), "Where does this log end?", 1)]
    res = await run_caged(cmd, forwards=adapter.forwards, env=claude_env(home, adapter.url, "sess-1"), cwd=work,
                          timeout=300)
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
    assert END in result_event(res.stdout).get("result", "")
    main = adapter.sessions.get("sess-1").main_records()
    prompt = adapter.core.renderer.decode(main[-1].prompt_ids)
    assert END in prompt and prompt.count("日志条目") == 20 * LINES  # every line arrived


async def test_codex_megabyte_prompt(start_adapter, cli_path, tmp_path: Path) -> None:
    adapter = await start_adapter(policy, context_limit=4_000_000, score=False)
    work, home = tmp_path / "repo", tmp_path / "home"
    work.mkdir()
    (home / ".codex").mkdir(parents=True)
    assert big_log(work / "big.log") > 1_000_000
    cmd = ["sh", "-c", 'exec "$0" "$@" < big.log', *codex_cmd(cli_path("codex"), adapter.url, prompt="-")]
    res = await run_caged(cmd, forwards=adapter.forwards, env=codex_env(home, "sess-1"), cwd=work, timeout=300)
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
    assert END in res.stdout
    main = adapter.sessions.get("sess-1").main_records()
    prompt = adapter.core.renderer.decode(main[-1].prompt_ids)
    assert END in prompt and prompt.count("日志条目") == 20 * LINES


async def test_opencode_megabyte_prompt(start_adapter, cli_path, tmp_path: Path) -> None:
    """OpenCode appends piped stdin to its prompt: one 1.1 MB user message on the Chat Completions front end."""
    adapter = await start_adapter(policy, context_limit=4_000_000, score=False)
    (tmp_path / "repo").mkdir()
    assert big_log(tmp_path / "repo" / "big.log") > 1_000_000
    res, _ = await run_opencode(adapter, cli_path, tmp_path, prompt="Where does this log end?", stdin_file="big.log",
                                timeout=300)
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
    assert texts(res.stdout)[-1] == "The log ends with " + END + "."
    session = adapter.sessions.get("sess-1")
    assert session.infra_failure is None
    [main] = session.main_records()
    assert main.stop_reason == "end_turn"
    prompt = adapter.core.renderer.decode(main.prompt_ids)
    assert END in prompt and prompt.count("日志条目") == 20 * LINES


async def test_openhands_megabyte_prompt(start_adapter, cli_path, tmp_path: Path) -> None:
    """The OpenHands SDK sends a 1.1 MB first user message (read by the driver from stdin: over the 128 KiB
    limit of one command-line argument). Its own input limit is raised past the message (the SDK would
    otherwise refuse or condense it before sending; that limit is OpenHands', not the adapter's)."""
    adapter = await start_adapter(policy, context_limit=4_000_000, score=False)
    (tmp_path / "repo").mkdir()
    assert big_log(tmp_path / "repo" / "big.log") > 1_000_000
    res, _ = await run_openhands(adapter, cli_path, tmp_path, prompt_file="big.log", timeout=300,
                                 extra=("--max-input-tokens=4000000",))
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
    assert summary(res.stdout)["last_agent_text"] == "The log ends with " + END + "."
    session = adapter.sessions.get("sess-1")
    assert session.infra_failure is None
    [main] = session.main_records()
    assert main.stop_reason == "end_turn"
    prompt = adapter.core.renderer.decode(main.prompt_ids)
    assert END in prompt and prompt.count("日志条目") == 20 * LINES
