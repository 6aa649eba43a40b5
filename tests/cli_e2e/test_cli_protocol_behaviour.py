"""Protocol behaviour seen with the real CLIs (issue 16), each CLI run as its lego plugin configures it."""

from __future__ import annotations

import asyncio
import itertools
import os
from pathlib import Path
from typing import Any

import pytest
from support.netcage import run_caged

from lego_rl.harness import HarnessOutcome, RunRequest, get_harness, get_plugin_manager
from lego_rl.harness.install import INSTALL_ROOT
from lego_rl.harness.runner import classify_exit

pytestmark = [pytest.mark.slow, pytest.mark.cli, pytest.mark.root]


def plugin_command(name: str, binary: Path, adapter: Any, work: Path, home: Path, *, session: str = "sess-1",
                   prompt: str = "Say hello.", overrides: dict[str, Any] | None = None,
                   **request_kw: Any) -> tuple[list[str], dict[str, str]]:
    """The argv and environment the lego plugin would run in a sandbox, with the sandbox install path
    swapped for the host's npm install and HOME moved into the test's folder."""
    handle = get_harness(name, overrides or {}, environ={}, pm=get_plugin_manager({}))
    request = RunRequest(session_id=session, base_url=adapter.url, model="lego-tiny", prompt=prompt,
                         workdir=str(work), time_budget_s=120, user="root", **request_kw)
    spec = handle.command(request)
    launcher = len(list(itertools.takewhile(lambda a: a.startswith(INSTALL_ROOT), spec.argv)))
    env = {k: str(home) if v.startswith("/var/tmp/lego-") else v for k, v in spec.env.items()}
    return [str(binary), *spec.argv[launcher:]], dict(env, PATH=os.environ["PATH"], HOME=str(home))


def classified(name: str, res: Any) -> HarnessOutcome:
    """The plugin's own reading of a finished CLI run (as the rollout labels it)."""
    pm = get_plugin_manager({})
    request = RunRequest(session_id="sess-1", base_url="http://127.0.0.1:1", model="lego-tiny", prompt="x",
                         workdir="/w", time_budget_s=120)
    outcome = classify_exit(name, res.returncode, res.timed_out, res.stdout, res.stderr, 1.0)
    refined: HarnessOutcome = pm.hook.lego_harness_classify(harness=name, outcome=outcome, request=request)
    return refined


def engine_outage(adapter: Any) -> None:
    """Every engine call fails as the serving client reports an engine that stays down past its deadline."""
    from lego_rl.serving.errors import EngineUnavailable

    async def generate(*args: Any, **kw: Any) -> Any:
        raise EngineUnavailable("generate r-1: no replica answered within 30s after 7 attempt(s)", url="http://e")

    adapter.core.backend.generate = generate


def slow_engine(adapter: Any, delay_s: float) -> None:
    """Make every engine call of the scripted policy take ``delay_s`` longer (without blocking the loop)."""
    inner = adapter.engine.generate

    async def generate(*args: Any, **kw: Any) -> Any:
        await asyncio.sleep(delay_s)
        return await inner(*args, **kw)

    adapter.engine.generate = generate


async def test_codex_plugin_makes_one_request_per_turn_on_a_cut_off_stream(start_adapter, cli_path, tmp_path: Path
                                                                          ) -> None:
    """Codex, as the plugin runs it, whose stream is cut (here: its idle timer, shortened to 1.5 s, runs
    out while the engine works): one request, then the turn fails. With Codex's defaults the same turn
    was sent 6 times ("Reconnecting... 1/5" .. "5/5"), each one an engine call on the session."""
    adapter = await start_adapter(lambda prompt, i: "Hello.")
    slow_engine(adapter, 4.0)
    work, home = tmp_path / "repo", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    argv, env = plugin_command("codex", cli_path("codex"), adapter, work, home)
    assert "model_providers.lego.stream_idle_timeout_ms=120000" in argv  # the run's time budget
    argv[-2:-2] = ["-c", "model_providers.lego.stream_idle_timeout_ms=1500"]
    res = await run_caged(argv, forwards=adapter.forwards, env=env, cwd=work, timeout=120)
    assert not res.timed_out and res.returncode != 0
    assert "idle timeout" in res.stdout and "Reconnecting" not in res.stdout, res.stdout[-3000:]
    assert adapter.sessions.get("sess-1").requests == 1


async def test_opencode_title_request_answered_with_a_call_gets_text(start_adapter, cli_path, tmp_path: Path
                                                                     ) -> None:
    """OpenCode's title request offers no tools. A policy answering it with a tool call must get text back
    (the title), not a call OpenCode has no tool for; the main turn is unaffected."""
    from support.scripted_engine import tool_call_text
    from test_opencode import run_opencode

    call = tool_call_text("bash", {"command": "echo owned"})

    def answer(prompt: str, index: int) -> str:
        return f"Title {call}" if "title generator" in prompt else "Hi, nothing to do."

    adapter = await start_adapter(answer)
    res, _ = await run_opencode(adapter, cli_path, tmp_path, title=None)
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
    session = adapter.sessions.get("sess-1")
    (title,) = [r for r in session.records if r.kind == "side"]
    assert title.side_label == "title" and title.tool_calls == 0 and title.stop_reason == "end_turn"
    assert "owned" not in res.stdout + res.stderr
    assert [r.text for r in session.main_records()] == ["Hi, nothing to do.<|im_end|>"]


async def test_engine_outage_reads_as_a_server_error_in_every_cli(start_adapter, cli_path, tmp_path: Path) -> None:
    """An engine outage fails the session; each real CLI must end on a server error that names it (not
    Claude Code's "Failed to authenticate ... 403", not OpenCode's ``UnknownError``), and each plugin must
    classify the run as the adapter's failure, never the policy's."""
    from test_opencode import run_opencode

    adapter = await start_adapter(["never used"], sessions=("sess-1",))
    engine_outage(adapter)
    work, home = tmp_path / "claude" / "repo", tmp_path / "claude" / "home"
    work.mkdir(parents=True)
    home.mkdir(parents=True)
    argv, env = plugin_command("claude_code", cli_path("claude"), adapter, work, home)
    claude = await run_caged(argv, forwards=adapter.forwards, env=env, cwd=work, timeout=180)
    assert not claude.timed_out
    result = [line for line in claude.stdout.splitlines() if '"type":"result"' in line][-1]
    assert "API Error: 503" in result and "no replica answered" in result, result[-1500:]
    assert "Failed to authenticate" not in claude.stdout
    assert classified("claude_code", claude).kind == "adapter_error"

    adapter = await start_adapter(["never used"], sessions=("sess-1",))
    engine_outage(adapter)
    opencode, _ = await run_opencode(adapter, cli_path, tmp_path / "opencode", timeout=180)
    assert not opencode.timed_out
    errors = [line for line in opencode.stdout.splitlines() if '"type":"error"' in line]
    assert errors and '"name":"APIError"' in errors[-1] and "no replica answered" in errors[-1], errors[-1:]
    assert "UnknownError" not in errors[-1]
    assert classified("opencode", opencode).kind == "adapter_error"

    adapter = await start_adapter(["never used"], sessions=("sess-1",))
    engine_outage(adapter)
    work, home = tmp_path / "codex" / "repo", tmp_path / "codex" / "home"
    work.mkdir(parents=True)
    home.mkdir(parents=True)
    argv, env = plugin_command("codex", cli_path("codex"), adapter, work, home)
    codex = await run_caged(argv, forwards=adapter.forwards, env=env, cwd=work, timeout=180)
    assert not codex.timed_out and codex.returncode != 0
    assert "no replica answered" in codex.stdout, codex.stdout[-2000:]
    outcome = classified("codex", codex)
    assert outcome.kind == "adapter_error", outcome


async def test_claude_code_names_the_sessions_output_cap(start_adapter, cli_path, tmp_path: Path) -> None:
    """A rollout's output cap of 48 tokens: Claude Code, as the plugin runs it, must report that cap, not
    its own default ("exceeded the 128000 output token maximum"), and ask for no more than it."""
    adapter = await start_adapter(lambda prompt, i: "word " * 200, max_response_tokens=48)
    work, home = tmp_path / "repo", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    argv, env = plugin_command("claude_code", cli_path("claude"), adapter, work, home, max_response_tokens=48)
    assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "48"
    argv[argv.index("--max-turns") + 1] = "2"
    res = await run_caged(argv, forwards=adapter.forwards, env=env, cwd=work, timeout=400)  # 4 slow scored turns on 2 shared cores
    assert not res.timed_out
    result = [line for line in res.stdout.splitlines() if '"type":"result"' in line][-1]
    assert "exceeded the 48 output token maximum" in result, result[-1500:]
    records = adapter.sessions.get("sess-1").records
    assert records and {r.stop_reason for r in records} == {"max_tokens"}
    assert all(len(r.output_ids) == 48 for r in records)
