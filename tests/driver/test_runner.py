"""RolloutRunner: every spec through generate(), at most N in flight, results in (group, index) order.

The rollouts are real generate() calls over the example tasks; they end early and fast because the
sandbox provider is one that does not exist (sandbox_setup), and the boot gate is a TEST DOUBLE that
counts how many rollouts are inside it at once."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from lego_rl.adapter.sessions import SessionRegistry
from lego_rl.config.resolve import resolve
from lego_rl.harness.toolchain import Toolchain
from lego_rl.compose.rollout_check import settings_from_config
from lego_rl.driver.runner import RolloutRunner, plan
from lego_rl.rollout.generate import RolloutContext
from lego_rl.runstore import RunDir, read_events
from lego_rl.swe.task_sandbox import SandboxTarget
from lego_rl.tasks.rows import load_tasks
from lego_rl.termination import TerminationReason

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"


class CountingGate(asyncio.Semaphore):
    """TEST DOUBLE of the boot gate: admits everyone, records the most rollouts inside at once."""

    def __init__(self) -> None:
        super().__init__(1000)
        self.inside = self.most = 0

    async def __aenter__(self) -> None:
        self.inside += 1
        self.most = max(self.most, self.inside)
        await asyncio.sleep(0.05)

    async def __aexit__(self, *exc: object) -> None:
        self.inside -= 1


def context(tmp_path: Path, gate: asyncio.Semaphore) -> RolloutContext:
    nowhere = SandboxTarget("no_such_provider")
    settings = dataclasses.replace(
        settings_from_config(resolve(environ={})), agent_sandbox=nowhere, grader_sandbox=nowhere
    )

    class Harness:  # TEST DOUBLE: never reached beyond its adapter options
        def adapter_options(self) -> dict[str, Any]:
            return {}

    return RolloutContext(
        settings=settings,
        run=RunDir.open(tmp_path / "run", config={}),
        sessions=SessionRegistry(),
        adapter_url="http://127.0.0.1:9",
        harness_for=lambda name: Harness(),  # type: ignore[arg-type,return-value]
        toolchain=Toolchain(tmp_path),
        dataset_dir=EXAMPLES,
        boot=gate,
    )


async def test_runs_every_spec_with_bounded_concurrency_in_group_order(tmp_path: Path) -> None:
    rows = load_tasks(EXAMPLES / "tasks.jsonl").rows[:3]
    specs = plan(rows, 2, harness="double")
    assert [(s.group_index, s.index) for s in specs] == [(g, i) for g in range(3) for i in range(2)]
    assert all(s.row.metadata.agent == "double" for s in specs)
    gate = CountingGate()
    ctx = context(tmp_path, gate)
    seen: list[tuple[str, str]] = []
    results = await RolloutRunner(ctx, concurrency=2).run(
        list(reversed(specs)), lambda ev, spec, res: seen.append((ev, spec.rollout_id))
    )
    ctx.run.close()
    assert gate.most == 2
    assert [(r.group_index, r.index) for r in results] == [(s.group_index, s.index) for s in specs]
    assert {r.termination for r in results} == {TerminationReason.SANDBOX_SETUP}
    assert sorted(seen) == sorted(
        [("started", s.rollout_id) for s in specs] + [("finished", s.rollout_id) for s in specs]
    )
    finished = [e for e in read_events(tmp_path / "run" / "events.jsonl") if e.kind == "rollout_finished"]
    assert len(finished) == 6


async def test_refuses_repeated_rollout_ids_and_nonsense_sizes(tmp_path: Path) -> None:
    rows = load_tasks(EXAMPLES / "tasks.jsonl").rows[:1]
    ctx = context(tmp_path, CountingGate())
    spec = plan(rows, 1)[0]
    with pytest.raises(ValueError, match="repeated: .*lego-example"):
        await RolloutRunner(ctx).run([spec, spec])
    with pytest.raises(ValueError, match="concurrency must be at least 1, got 0"):
        RolloutRunner(ctx, concurrency=0)
    with pytest.raises(ValueError, match="samples_per_task must be at least 1"):
        plan(rows, 0)
    ctx.run.close()
