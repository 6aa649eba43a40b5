"""The OpenHands SDK (real, from PyPI, on trixie's Python 3.13) through the Chat Completions front end."""

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

DRIVER = Path(__file__).with_name("openhands_driver.py")
PROMPT = "Create a file hello.txt containing hello-from-lego, then tell me you are done."


def openhands_env(home: Path) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "HOME": str(home), "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "OPENHANDS_SUPPRESS_BANNER": "1", "LOG_LEVEL": "WARNING"}


async def run_openhands(adapter: Any, cli_path: Any, tmp_path: Path, *, stream: bool = False,
                        key: str = "sess-1", timeout: float = 240, prompt: str = PROMPT,
                        prompt_file: str | None = None, extra: tuple[str, ...] = ()) -> tuple[Any, Path]:
    """Run the driver caged; ``prompt_file`` (a file in the work dir) is the prompt, fed on stdin."""
    work, home = tmp_path / "repo", tmp_path / "home"
    work.mkdir(parents=True, exist_ok=True)
    home.mkdir(parents=True, exist_ok=True)
    cmd = [str(cli_path("openhands")), str(DRIVER), adapter.url, key, str(work),
           "-" if prompt_file else prompt, *(["--stream"] if stream else []), *extra]
    if prompt_file:
        cmd = ["sh", "-c", f'exec "$0" "$@" < {prompt_file}', *cmd]
    res = await run_caged(cmd, forwards=adapter.forwards, env=openhands_env(home), cwd=work, timeout=timeout)
    return res, work


def summary(stdout: str) -> dict[str, Any]:
    lines = [line for line in stdout.splitlines() if line.startswith('{"status"')]
    assert lines, stdout[-3000:]
    return json.loads(lines[-1])


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_openhands_tool_loop_through_adapter(start_adapter, cli_path, tmp_path: Path, stream: bool) -> None:
    work = tmp_path / "repo"

    def policy(prompt: str, index: int) -> str:
        if "<tool_response>" in prompt:
            return "Done: hello.txt now contains hello-from-lego."
        return THINK + tool_call_text("file_editor", {"command": "create", "path": str(work / "hello.txt"),
                                              "file_text": "hello-from-lego"})

    adapter = await start_adapter(policy)
    res, work = await run_openhands(adapter, cli_path, tmp_path, stream=stream)
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
    assert (work / "hello.txt").read_text().strip() == "hello-from-lego"
    assert summary(res.stdout)["last_agent_text"] == "Done: hello.txt now contains hello-from-lego."
    session = adapter.sessions.get("sess-1")
    main = session.main_records()
    assert [r.stop_reason for r in main] == ["tool_use", "end_turn"]
    assert_records_match_engine(session.records, adapter.engine)
    assert [r.render_mode for r in main] == ["full", "bridged"]
    assert session.infra_failure is None


async def test_openhands_plain_tiny_model_to_completion(start_adapter, cli_path, tmp_path: Path) -> None:
    """The embedded engine serving the random tiny model: the OpenHands SDK runs to its end on real samples."""
    adapter = await start_adapter(None, max_response_tokens=8)
    res, _ = await run_openhands(adapter, cli_path, tmp_path)
    print(res.returncode, res.stdout[-3000:], res.stderr[-3000:])
    assert not res.timed_out
    session = adapter.sessions.get("sess-1")
    assert session.main_records() and session.infra_failure is None
    for record in session.records:
        assert len(record.logprobs) == len(record.output_ids) > 0
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
