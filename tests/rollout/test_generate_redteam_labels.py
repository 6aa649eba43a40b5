"""Red team for the termination labels: a policy must not turn its own failure into "infrastructure".

An infrastructure label excludes the episode from training, so a policy that could earn one by ending its
own CLI would escape the penalty of a bad episode (and learn to). Each case here is a tool call of the
policy that kills the CLI running it, as the agent user: the rollout must end as a policy outcome
(``agent_error_exit``), graded as usual (reward 0: nothing was fixed), never as ``harness_install`` or
``sandbox_lost``. The counterpart, a kill from outside the sandbox, stays ``sandbox_lost``
(test_generate_faults.py). Real Claude Code in real bwrap sandboxes; the policy is the scripted TEST
DOUBLE at the model boundary (tests/support/scripted_engine.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import assert_nothing_running, make_context, spec_for
from support.scripted_engine import tool_call_text

from lego_rl.harness.toolchain import Toolchain
from lego_rl.rollout.generate import generate
from lego_rl.runstore import read_events
from lego_rl.runstore.events import AgentExited
from lego_rl.termination import TerminationReason

pytestmark = [pytest.mark.slow, pytest.mark.cli, pytest.mark.root]

KILLS = {
    # The Bash tool's shell is a child of the CLI.
    "parent": "kill -9 $PPID",
    # The CLI's whole process group (field 5 of /proc/<pid>/stat; `ps` may not be in the image).
    "process_group": "kill -9 -- -$(cut -d' ' -f5 /proc/$PPID/stat)",
    # Every process the agent user may signal.
    "everything": "kill -9 -1",
}


@pytest.mark.parametrize("kill", sorted(KILLS))
async def test_a_tool_call_that_kills_the_cli_is_the_policys_outcome(
    kill: str, scripted_stack: Any, toolchain: Toolchain, example_rows: dict[str, Any], tmp_path: Path
) -> None:
    def policy(prompt: str, index: int) -> str:
        return tool_call_text("Bash", {"command": KILLS[kill], "description": "stop"})

    stack = await scripted_stack(policy, score=False)
    ctx = make_context(tmp_path / "run", stack.sessions, stack.url, toolchain)
    result = await generate(ctx, spec_for(example_rows["lego-example-median"], "claude_code"))
    ctx.run.close()
    exited = [e for e in read_events(tmp_path / "run" / "events.jsonl") if isinstance(e, AgentExited)]
    # The kill happened: the CLI died at its first tool call, by a signal, without asking for another turn.
    assert len(stack.engine.calls) == 1 and len(exited) == 1, result.detail
    assert exited[0].exit_code is not None and exited[0].exit_code >= 128, exited[0]
    assert result.termination is TerminationReason.AGENT_ERROR_EXIT, result.detail
    assert not result.infrastructure_failure
    # Graded as usual: the patch was captured (empty: nothing changed) and the grader gave its verdict.
    assert result.reward == 0.0
    names = {p.name for p in result.artifacts.iterdir()}
    assert {"patch.diff", "grader.log", "samples.jsonl", "claude_code-events.jsonl"} <= names, sorted(names)
    assert result.samples and all(s.reward == 0.0 for s in result.samples)
    assert_nothing_running(stack.sessions)


async def test_a_workspace_that_defeats_the_patch_capture_is_the_policys_outcome(
    scripted_stack: Any, toolchain: Toolchain, example_rows: dict[str, Any], tmp_path: Path
) -> None:
    """An empty git repository inside the work tree makes `git add` (the capture) fail ("does not have a
    commit checked out") while the sandbox answers: the policy's doing, which was labelled sandbox_lost
    (an infrastructure failure, excluded). Graded as if nothing had changed."""

    def policy(prompt: str, index: int) -> str:
        if "<tool_response>" in prompt:
            return "Done."
        return tool_call_text("Bash", {"command": "git init -q stats/sub && echo made", "description": "init"})

    stack = await scripted_stack(policy, score=False)
    ctx = make_context(tmp_path / "run", stack.sessions, stack.url, toolchain)
    result = await generate(ctx, spec_for(example_rows["lego-example-median"], "claude_code"))
    ctx.run.close()
    assert result.termination is TerminationReason.AGENT_ERROR_EXIT, result.detail
    assert "could not be captured" in result.detail and not result.infrastructure_failure
    assert result.reward == 0.0
    names = {p.name for p in result.artifacts.iterdir()}
    assert "grader.log" in names and "patch.diff" not in names, sorted(names)
    assert_nothing_running(stack.sessions)


async def test_a_tool_call_that_fills_the_disk_fills_only_its_own_sandbox(
    scripted_stack: Any, toolchain: Toolchain, example_rows: dict[str, Any], tmp_path: Path
) -> None:
    """A disk filler under ``disk_mb`` (bwrap's loop-mounted layer): the write fails inside the sandbox with
    ENOSPC (the tool result says so), the host's disk is not touched beyond the cap, and whatever the full disk
    then breaks (the patch capture needs to write) is the policy's outcome, graded, never an infrastructure
    label. The filler stays in place to the end on purpose."""
    prompts: list[str] = []

    def policy(prompt: str, index: int) -> str:
        prompts.append(prompt)
        if "<tool_response>" in prompt:
            return "Done."
        return tool_call_text("Bash", {"command": "head -c 3000M /dev/zero > /tmp/fill; echo exit=$?",
                                       "description": "fill"})

    stack = await scripted_stack(policy, score=False)
    ctx = make_context(tmp_path / "run", stack.sessions, stack.url, toolchain,
                       sandbox_options={"network": "host", "disk_mb": 1024})
    result = await generate(ctx, spec_for(example_rows["lego-example-median"], "claude_code"))
    ctx.run.close()
    assert len(prompts) >= 2 and "No space left on device" in prompts[1], prompts[-1][-2000:]
    assert result.termination in (TerminationReason.COMPLETED, TerminationReason.AGENT_ERROR_EXIT), result.detail
    assert not result.infrastructure_failure and result.reward == 0.0, result.detail
    assert "grader.log" in {p.name for p in result.artifacts.iterdir()}
    assert_nothing_running(stack.sessions)


@pytest.mark.parametrize("kill", ["everything", "parent"])
async def test_a_tool_call_that_kills_the_cli_is_the_policys_outcome_on_sunabako(
    kill: str,
    scripted_stack: Any,
    toolchain: Toolchain,
    sunabako_node: Any,
    example_rows: dict[str, Any],
    tmp_path: Path,
) -> None:
    """The same kills in a real sunabako sandbox (native runtime, test memory mode), where the sandbox is
    a long-lived machine with its own init rather than one bwrap per command."""

    def policy(prompt: str, index: int) -> str:
        return tool_call_text("Bash", {"command": KILLS[kill], "description": "stop"})

    before = sunabako_node.sandbox_ids()
    stack = await scripted_stack(policy, score=False)
    ctx = make_context(
        tmp_path / "run", stack.sessions, stack.url, toolchain, provider="sunabako", grader_provider="sunabako",
        provider_options=sunabako_node.provider_options, sandbox_options={"network": "host", "memory_mb": 2048},
    )  # fmt: skip
    result = await generate(ctx, spec_for(example_rows["lego-example-median"], "claude_code"))
    ctx.run.close()
    assert len(stack.engine.calls) == 1, result.detail
    assert result.termination is TerminationReason.AGENT_ERROR_EXIT, result.detail
    assert result.reward == 0.0 and not result.infrastructure_failure
    assert {"patch.diff", "grader.log"} <= {p.name for p in result.artifacts.iterdir()}
    assert_nothing_running(stack.sessions)
    left = sunabako_node.sandbox_ids() - before
    assert not left, f"sunabako sandboxes left on {sunabako_node.state_dir}: {sorted(left)}"


async def test_a_tool_call_that_runs_the_sandbox_out_of_memory_is_the_policys_outcome_on_sunabako(
    scripted_stack: Any, toolchain: Toolchain, sunabako_node: Any, example_rows: dict[str, Any], tmp_path: Path
) -> None:
    """A memory hog: the node's supervisor kills the whole sandbox (its memory limit), so the next command
    fails. That was sandbox_lost (excluded from training: the policy escaped its penalty); the node says why
    (memory_limit_exceeded), and it is the policy's outcome, graded as a change of nothing."""

    def policy(prompt: str, index: int) -> str:
        return tool_call_text("Bash", {"command": "head -c 2500M /dev/zero | tail", "description": "hog"})

    before = sunabako_node.sandbox_ids()
    stack = await scripted_stack(policy, score=False)
    ctx = make_context(
        tmp_path / "run", stack.sessions, stack.url, toolchain, provider="sunabako", grader_provider="sunabako",
        provider_options=sunabako_node.provider_options, sandbox_options={"network": "host", "memory_mb": 1024},
    )  # fmt: skip
    result = await generate(ctx, spec_for(example_rows["lego-example-median"], "claude_code"))
    ctx.run.close()
    assert len(stack.engine.calls) == 1, result.detail
    assert result.termination is TerminationReason.AGENT_ERROR_EXIT, result.detail
    assert "memory_limit_exceeded" in result.detail and not result.infrastructure_failure
    assert result.reward == 0.0
    names = {p.name for p in result.artifacts.iterdir()}
    assert "grader.log" in names and "patch.diff" not in names, sorted(names)  # nothing left to capture
    assert_nothing_running(stack.sessions)
    left = sunabako_node.sandbox_ids() - before
    assert not left, f"sunabako sandboxes left on {sunabako_node.state_dir}: {sorted(left)}"
