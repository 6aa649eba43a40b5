"""generate() under faults: each ends with the right termination reason, no exception escapes, the
artifacts are saved and nothing is left running. Real CLIs in real bwrap sandboxes; the policy is the
scripted TEST DOUBLE at the model boundary (tests/support/scripted_engine.py)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, assert_nothing_running, descendants, make_context, spec_for
from support.scripted_engine import tool_call_text
from test_generate_scripted import policy_writing

from lego_rl.harness.toolchain import Toolchain
from lego_rl.rollout.generate import RolloutResult, generate
from lego_rl.runstore import read_events
from lego_rl.runstore.events import RolloutFinished, StageFinished
from lego_rl.termination import TerminationReason

pytestmark = [pytest.mark.slow, pytest.mark.cli, pytest.mark.root]

FIX = (EXAMPLES / "src/median/fix/stats/center.py").read_text()


def assert_ended(result: RolloutResult, reason: TerminationReason, run_root: Path, *saved: str) -> None:
    """The reason, the outcome and the event on disk, and the named artifacts."""
    assert result.termination is reason, (result.termination, result.detail)
    assert result.infrastructure_failure == (reason not in (TerminationReason.COMPLETED,))
    folder = result.artifacts
    assert folder is not None
    names = {p.name for p in folder.iterdir()}
    for name in ("outcome.json", *saved):
        assert name in names, (name, sorted(names))
    assert json.loads((folder / "outcome.json").read_text())["termination"] == reason.value
    finished = [e for e in read_events(run_root / "events.jsonl") if isinstance(e, RolloutFinished)]
    assert [e.termination for e in finished] == [reason]


async def test_sandbox_killed_mid_run_is_sandbox_lost(
    scripted_stack: Any, toolchain: Toolchain, example_rows: dict[str, Any], tmp_path: Path
) -> None:
    killed: list[int] = []

    def policy(prompt: str, index: int) -> str:
        # The CLI is waiting for this answer: kill every process of the agent sandbox right now.
        for pid, name in descendants():
            if name == "bwrap":
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        return tool_call_text("Bash", {"command": "ls", "description": "list"})

    stack = await scripted_stack(policy, score=False)
    ctx = make_context(tmp_path / "run", stack.sessions, stack.url, toolchain)
    result = await generate(ctx, spec_for(example_rows["lego-example-median"], "claude_code"))
    ctx.run.close()
    assert killed
    assert_ended(result, TerminationReason.SANDBOX_LOST, tmp_path / "run", "commands-agent.jsonl")
    assert result.reward is None and "grader.log" not in {p.name for p in result.artifacts.iterdir()}
    assert_nothing_running(stack.sessions)


@pytest.mark.parametrize("fault", ["corrupt", "missing"])
async def test_missing_or_corrupt_harness_binary_is_harness_install(
    fault: str, scripted_stack: Any, toolchain: Toolchain, example_rows: dict[str, Any], tmp_path: Path
) -> None:
    """A toolchain whose Codex archive is garbage (hash mismatch) or gone: install fails, cleanly."""
    broken = tmp_path / "toolchain"
    # Not the archives, nor their unpacked .tar-cache (1.1 GB a copy): both cases must fail before either is read.
    skipped = shutil.ignore_patterns("*.tgz", "*.whl", "*.tar.gz", ".tar-cache")
    shutil.copytree(toolchain.folder, broken, ignore=skipped)
    lock = json.loads((broken / "toolchain.lock.json").read_text())
    for entry in lock["entries"].values():
        if fault == "corrupt":
            (broken / entry["file"]).parent.mkdir(parents=True, exist_ok=True)
            (broken / entry["file"]).write_bytes(b"not the pinned archive")
    stack = await scripted_stack(policy_writing("codex", "stats/center.py", FIX), score=False)
    ctx = make_context(tmp_path / "run", stack.sessions, stack.url, Toolchain(broken))
    result = await generate(ctx, spec_for(example_rows["lego-example-median"], "codex"))
    ctx.run.close()
    assert_ended(result, TerminationReason.HARNESS_INSTALL, tmp_path / "run", "commands-agent.jsonl")
    assert "harness_install" in result.detail and result.samples == [] and not stack.engine.calls
    assert_nothing_running(stack.sessions)


async def test_unknown_harness_is_harness_install_with_a_clear_detail(
    scripted_stack: Any, toolchain: Toolchain, example_rows: dict[str, Any], tmp_path: Path
) -> None:
    stack = await scripted_stack(["never asked"], score=False)
    ctx = make_context(tmp_path / "run", stack.sessions, stack.url, toolchain)
    result = await generate(ctx, spec_for(example_rows["lego-example-median"], "no_such_cli"))
    ctx.run.close()
    assert_ended(result, TerminationReason.HARNESS_INSTALL, tmp_path / "run")
    assert "unknown harness 'no_such_cli'" in result.detail and "claude_code" in result.detail
    assert_nothing_running(stack.sessions)


async def test_unreachable_adapter_is_adapter_error(
    scripted_stack: Any, toolchain: Toolchain, example_rows: dict[str, Any], tmp_path: Path
) -> None:
    """The CLI is pointed at an address where no adapter listens: our fault, not the policy's."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    stack = await scripted_stack(["never asked"], score=False)
    ctx = make_context(tmp_path / "run", stack.sessions, f"http://127.0.0.1:{dead}", toolchain,
                       agent_time_budget_s=90.0)
    result = await generate(ctx, spec_for(example_rows["lego-example-median"], "claude_code"))
    ctx.run.close()
    assert_ended(result, TerminationReason.ADAPTER_ERROR, tmp_path / "run", "commands-agent.jsonl")
    assert "adapter" in result.detail
    assert_nothing_running(stack.sessions)


@pytest.mark.parametrize("harness", ["claude_code", "codex"])
async def test_engine_stopping_mid_run_is_engine_error(
    harness: str, scripted_stack: Any, toolchain: Toolchain, example_rows: dict[str, Any], tmp_path: Path
) -> None:
    """The engine answers the first turn, then its server goes away: the session fails, the CLI is
    refused further turns, and the rollout is an engine error (excluded from training)."""
    first = policy_writing(harness, "stats/center.py", FIX)
    holder: dict[str, Any] = {}

    def policy(prompt: str, index: int) -> str:
        holder["stop"] = asyncio.get_running_loop().create_task(holder["stack"].stop_engine())
        return first(prompt, index)

    # The client's retry window (an engine restart is waited for that long) is cut to 3 s for the test.
    stack = holder["stack"] = await scripted_stack(policy, score=False, retry_deadline_s=3.0)
    ctx = make_context(tmp_path / "run", stack.sessions, stack.url, toolchain)
    result = await generate(ctx, spec_for(example_rows["lego-example-median"], harness))
    ctx.run.close()
    assert_ended(
        result,
        TerminationReason.ENGINE_ERROR,
        tmp_path / "run",
        "commands-agent.jsonl",
        f"{harness}-events.jsonl",
    )
    assert "engine" in result.detail and result.reward is None
    assert len(stack.engine.calls) == 1 and result.turns == 1
    assert_nothing_running(stack.sessions)


async def test_grader_timeout_is_a_verdict_of_zero(
    scripted_stack: Any, toolchain: Toolchain, example_rows: dict[str, Any], tmp_path: Path
) -> None:
    """Tests that outrun the grader timeout score 0 and keep the policy's termination: a patch that makes
    the tests hang is the policy's doing (excluding it would reward hanging the tests)."""
    row = example_rows["lego-example-median"]
    row = row.model_copy(update={"metadata": row.metadata.model_copy(update={"eval_cmd": "sleep 60"})})
    stack = await scripted_stack(policy_writing("claude_code", "stats/center.py", FIX), score=False)
    ctx = make_context(tmp_path / "run", stack.sessions, stack.url, toolchain, grader_timeout_s=2.0)
    result = await generate(ctx, spec_for(row, "claude_code"))
    ctx.run.close()
    assert_ended(
        result, TerminationReason.COMPLETED, tmp_path / "run", "patch.diff", "grader.log", "samples.jsonl"
    )
    assert result.reward == 0.0 and "timed out" in result.detail
    assert result.timings["grading"] < 30
    assert_nothing_running(stack.sessions)


async def test_grader_that_cannot_grade_is_grader_error(
    scripted_stack: Any, toolchain: Toolchain, example_rows: dict[str, Any], tmp_path: Path
) -> None:
    """An official test patch that does not apply: the grader cannot judge, so no reward at all."""
    row = example_rows["lego-example-median"]
    bad = (
        "diff --git a/tests/x.py b/tests/x.py\n--- a/tests/x.py\n+++ b/tests/x.py\n@@ -1 +1 @@\n-nope\n+yes\n"
    )
    row = row.model_copy(update={"metadata": row.metadata.model_copy(update={"test_patch": bad})})
    stack = await scripted_stack(policy_writing("claude_code", "stats/center.py", FIX), score=False)
    ctx = make_context(tmp_path / "run", stack.sessions, stack.url, toolchain)
    result = await generate(ctx, spec_for(row, "claude_code"))
    ctx.run.close()
    assert_ended(result, TerminationReason.GRADER_ERROR, tmp_path / "run", "patch.diff", "grader.log")
    assert result.reward is None and "apply official test patch" in result.detail
    assert "official test patch" in (result.artifacts / "grader.log").read_text()
    assert_nothing_running(stack.sessions)


async def test_guard_expiring_mid_run_is_guard_timeout(
    scripted_stack: Any, toolchain: Toolchain, example_rows: dict[str, Any], tmp_path: Path
) -> None:
    """The whole-rollout guard expires while the CLI waits for the engine: guard_timeout, the CLI and
    its sandbox are gone, the session's records and the commands are still saved."""

    def policy(prompt: str, index: int) -> str:
        # Claude Code refuses a plain long `sleep`; a Python one still holds its Bash tool (2 min default).
        return tool_call_text(
            "Bash", {"command": "python3 -c 'import time; time.sleep(3600)'", "description": "wait"}
        )

    stack = await scripted_stack(policy, score=False)
    ctx = make_context(tmp_path / "run", stack.sessions, stack.url, toolchain, guard_s=25.0)
    result = await generate(ctx, spec_for(example_rows["lego-example-median"], "claude_code"))
    ctx.run.close()
    assert_ended(result, TerminationReason.GUARD_TIMEOUT, tmp_path / "run", "commands-agent.jsonl")
    assert "25 s" in result.detail and result.reward is None
    stages = [e for e in read_events(tmp_path / "run" / "events.jsonl") if isinstance(e, StageFinished)]
    assert [(e.stage, e.status) for e in stages][-2:] == [("agent", "interrupted"), ("cleanup", "ok")]
    assert sum(result.timings.values()) < 60
    assert_nothing_running(stack.sessions)
