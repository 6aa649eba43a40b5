"""OpenCode (real CLI from npm) through the adapter's Chat Completions front end (always streamed)."""

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


def opencode_setup(work: Path, url: str, key: str) -> None:
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {"lego": {"npm": "@ai-sdk/openai-compatible", "name": "lego",
                              "options": {"baseURL": f"{url}/v1", "apiKey": key},
                              "models": {"tiny": {"name": "tiny", "tool_call": True}}}},
        "model": "lego/tiny",
    }
    (work / "opencode.json").write_text(json.dumps(config))


def opencode_env(home: Path) -> dict[str, str]:
    # TMPDIR: the OpenCode binary (Bun) unpacks a 5.5 MB native library into the temporary directory on every
    # start and never removes it; run on the host, as here, that was the machine's /tmp (135 files in a day).
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    return {"PATH": os.environ["PATH"], "HOME": str(home), "TMPDIR": str(home / "tmp"),
            "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1"}


def opencode_cmd(binary: Path, prompt: str = PROMPT, title: str | None = "lego-test") -> list[str]:
    return [str(binary), "run", "--format", "json", *(["--title", title] if title else []), prompt]


def texts(stdout: str) -> list[str]:
    events = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return [e["part"]["text"] for e in events if e.get("type") == "text"]


async def run_opencode(adapter: Any, cli_path: Any, tmp_path: Path, *, key: str = "sess-1",
                       title: str | None = "lego-test", timeout: float = 180, prompt: str = PROMPT,
                       stdin_file: str | None = None) -> tuple[Any, Path]:
    """Run ``opencode run`` caged; ``stdin_file`` (a file in the work dir) is piped in, which OpenCode appends
    to the prompt."""
    work, home = tmp_path / "repo", tmp_path / "home"
    work.mkdir(parents=True, exist_ok=True)
    home.mkdir(parents=True, exist_ok=True)
    opencode_setup(work, adapter.url, key)
    cmd = opencode_cmd(cli_path("opencode"), prompt, title=title)
    if stdin_file:
        cmd = ["sh", "-c", f'exec "$0" "$@" < {stdin_file}', *cmd]
    res = await run_caged(cmd, forwards=adapter.forwards, env=opencode_env(home), cwd=work, timeout=timeout)
    return res, work


def policy(prompt: str, index: int) -> str:
    if "<tool_response>" in prompt:
        return "Done: hello.txt now contains hello-from-lego."
    return THINK + tool_call_text("bash", {"command": "echo hello-from-lego > hello.txt",
                                   "description": "Write hello.txt"})


async def test_opencode_tool_loop_through_adapter(start_adapter, cli_path, tmp_path: Path) -> None:
    adapter = await start_adapter(policy)
    res, work = await run_opencode(adapter, cli_path, tmp_path)
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
    assert (work / "hello.txt").read_text() == "hello-from-lego\n"
    assert texts(res.stdout)[-1] == "Done: hello.txt now contains hello-from-lego."
    session = adapter.sessions.get("sess-1")
    main = session.main_records()
    assert [r.stop_reason for r in main] == ["tool_use", "end_turn"]
    assert_records_match_engine(session.records, adapter.engine)
    assert [r.render_mode for r in main] == ["full", "bridged"]
    assert session.infra_failure is None


async def test_opencode_title_request_is_a_side_request(start_adapter, cli_path, tmp_path: Path) -> None:
    """Without --title OpenCode first asks for a thread title: it is labelled and kept off the main chain."""

    def answer(prompt: str, index: int) -> str:
        return "Hello title" if "title generator" in prompt else "Hi, nothing to do."

    adapter = await start_adapter(answer)
    res, _ = await run_opencode(adapter, cli_path, tmp_path, title=None)
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
    session = adapter.sessions.get("sess-1")
    side = [r for r in session.records if r.kind == "side"]
    assert [r.side_label for r in side] == ["title"]
    assert [r.text for r in session.main_records()] == ["Hi, nothing to do.<|im_end|>"]


async def test_opencode_plain_tiny_model_to_completion(start_adapter, cli_path, tmp_path: Path) -> None:
    """The embedded engine serving the random tiny model: OpenCode runs to its end on real samples."""
    adapter = await start_adapter(None, max_response_tokens=8)
    res, _ = await run_opencode(adapter, cli_path, tmp_path)
    print(res.returncode, res.stdout[-3000:], res.stderr[-3000:])
    assert not res.timed_out
    session = adapter.sessions.get("sess-1")
    assert session.main_records() and session.infra_failure is None
    for record in session.records:
        assert len(record.logprobs) == len(record.output_ids) > 0
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
