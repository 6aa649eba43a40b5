"""Artifacts of rollouts that ended in an infrastructure failure: what existed is saved before cleanup.

The reference example promises artifacts "saved before sandbox cleanup"; issue 18 found ``sandbox_lost``
losing the CLI's event log, and no patch captured for any infrastructure failure even with the sandbox
still answering. Real Claude Code in real bwrap sandboxes; the policy is the scripted TEST DOUBLE at the
model boundary (tests/support/scripted_engine.py). Each policy first writes the task's fix, so the patch
has something to show.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, assert_nothing_running, descendants, make_context, spec_for
from test_generate_scripted import policy_writing

from lego_rl.harness.toolchain import Toolchain
from lego_rl.rollout.generate import RolloutResult, generate
from lego_rl.termination import TerminationReason

pytestmark = [pytest.mark.slow, pytest.mark.cli, pytest.mark.root]

FIX = (EXAMPLES / "src/median/fix/stats/center.py").read_text()


def assert_salvaged(result: RolloutResult, reason: TerminationReason) -> None:
    """The infrastructure reason, no verdict, and the CLI's log and the agent's patch on disk."""
    assert result.termination is reason and result.infrastructure_failure, result.detail
    assert result.reward is None
    folder = result.artifacts
    assert folder is not None
    names = {p.name for p in folder.iterdir()}
    for name in ("outcome.json", "commands-agent.jsonl", "claude_code-events.jsonl", "claude_code-command.txt",
                 "patch.diff"):
        assert name in names, (name, sorted(names))
    assert "grader.log" not in names  # saved, not graded: an infrastructure failure has no verdict
    patch = (folder / "patch.diff").read_text()
    assert "+++ b/stats/center.py" in patch and "def median" in patch, patch[:2000]
    # The CLI's event log holds the turn that wrote the fix (Claude Code's stream-json).
    events = (folder / "claude_code-events.jsonl").read_text()
    assert "stats/center.py" in events, events[:2000]


async def test_sandbox_lost_mid_run_keeps_the_cli_log_and_the_patch(
    scripted_stack: Any, toolchain: Toolchain, example_rows: dict[str, Any], tmp_path: Path
) -> None:
    write = policy_writing("claude_code", "stats/center.py", FIX)
    killed: list[int] = []

    def policy(prompt: str, index: int) -> str:
        if "<tool_response>" in prompt:
            # The fix is written; the CLI waits for this answer: kill the sandbox's processes from outside.
            for pid, name in descendants():
                if name == "bwrap":
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
        return write(prompt, index)

    stack = await scripted_stack(policy, score=False)
    ctx = make_context(tmp_path / "run", stack.sessions, stack.url, toolchain)
    result = await generate(ctx, spec_for(example_rows["lego-example-median"], "claude_code"))
    ctx.run.close()
    assert killed
    assert_salvaged(result, TerminationReason.SANDBOX_LOST)
    assert_nothing_running(stack.sessions)


async def test_engine_error_keeps_the_cli_log_and_the_patch(
    scripted_stack: Any, toolchain: Toolchain, example_rows: dict[str, Any], tmp_path: Path
) -> None:
    """The engine answers the first turn (the fix is written), then its server goes away."""
    write = policy_writing("claude_code", "stats/center.py", FIX)
    holder: dict[str, Any] = {}

    def policy(prompt: str, index: int) -> str:
        holder.setdefault("stop", asyncio.get_running_loop().create_task(holder["stack"].stop_engine()))
        return write(prompt, index)

    stack = holder["stack"] = await scripted_stack(policy, score=False, retry_deadline_s=3.0)
    ctx = make_context(tmp_path / "run", stack.sessions, stack.url, toolchain)
    result = await generate(ctx, spec_for(example_rows["lego-example-median"], "claude_code"))
    ctx.run.close()
    assert len(stack.engine.calls) == 1
    assert_salvaged(result, TerminationReason.ENGINE_ERROR)
    assert_nothing_running(stack.sessions)
