"""A rollout the scheduler cancels leaves nothing behind: no bwrap sandbox, no process, no open adapter
session, and its outcome (``interrupted``) is saved. Real Claude Code in a real bwrap sandbox through the real
adapter and ``generate()``, driven by the real ``RolloutScheduler``; the policy is the scripted TEST DOUBLE at
the model boundary (tests/support/scripted_engine.py), answering with a tool call that holds the CLI.

The cancellation is the scheduler's ``close()`` (a stopped run); a stale group is cancelled by the same
``task.cancel()`` (tests/driver/test_scheduler.py covers when that happens).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_nothing_running, make_context, spec_for
from support.scripted_engine import tool_call_text

from lego_rl.harness.toolchain import Toolchain
from lego_rl.driver.scheduler import Prompt, RolloutScheduler, SchedulerSettings
from lego_rl.compose.train_session import agent_rollout_fn
from lego_rl.runstore import read_events
from lego_rl.runstore.events import RolloutCancelled, RolloutFinished, RunEvent
from lego_rl.termination import TerminationReason
from lego_rl.train.advantages import admission_policy

pytestmark = [pytest.mark.slow, pytest.mark.cli, pytest.mark.root]


async def test_cancelled_rollouts_leave_no_sandbox_process_or_session(
    scripted_stack: Any, toolchain: Toolchain, example_rows: dict[str, Any], tmp_path: Path
) -> None:
    def policy(prompt: str, index: int) -> str:
        # Claude Code refuses a plain long `sleep`; a Python one holds its Bash tool.
        return tool_call_text("Bash", {"command": "python3 -c 'import time; time.sleep(3600)'",
                                       "description": "wait"})

    stack = await scripted_stack(policy, score=False)
    ctx = make_context(tmp_path / "run", stack.sessions, stack.url, toolchain)
    row = spec_for(example_rows["lego-example-median"], "claude_code").row
    emitted: list[RunEvent] = []

    def emit(event: RunEvent) -> None:
        emitted.append(event)
        ctx.run.events.emit(event)

    sched = RolloutScheduler(
        SchedulerSettings(batch_size=1, samples_per_prompt=2, slots=2, max_staleness=1, max_refills=0,
                          replace_zero_variance=False, admission=admission_policy("exclude")),
        rollout_fn=agent_rollout_fn(ctx), draw=lambda: Prompt(row.metadata.instance_id, row), emit=emit,
        policy=0, next_step=0, end_step=1)
    sched.start()
    try:
        # Both CLIs are running the policy's tool call when the run stops.
        async with asyncio.timeout(300):
            while len(stack.engine.calls) < 2:
                await asyncio.sleep(0.2)
        await asyncio.sleep(2)
        assert sched.in_flight == 2
    finally:
        await sched.close()
    assert sched.in_flight == 0
    assert_nothing_running(stack.sessions)
    ctx.run.close()
    cancelled = [e for e in emitted if isinstance(e, RolloutCancelled)]
    assert sorted(e.rollout_id for e in cancelled) == ["g00000-lego-example-median-0", "g00000-lego-example-median-1"]
    assert all(e.reason == "stopped" for e in cancelled)
    finished = [e for e in read_events(tmp_path / "run" / "events.jsonl") if isinstance(e, RolloutFinished)]
    assert sorted(e.rollout_id for e in finished) == sorted(e.rollout_id for e in cancelled)
    assert all(e.termination is TerminationReason.INTERRUPTED for e in finished)
    for e in cancelled:
        assert (tmp_path / "run" / "sandboxes" / e.rollout_id / "outcome.json").exists()
