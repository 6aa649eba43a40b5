"""generate() end to end with the real CLIs in real bwrap sandboxes (and real sunabako ones: the
``_on_sunabako`` cases, root), against the adapter backed by the scripted policy (TEST DOUBLE at the model boundary, tests/support/scripted_engine.py).

The policy's turns: one tool call that writes a file of the example task's repository (the reference fix,
or a wrong one), then a final answer. A correct fix must score 1 and a wrong one 0, through the whole
chain: adapter session, sandbox, offline CLI install, CLI run, patch capture, fresh grader sandbox,
Samples whose trained tokens are exactly the engine's output ids, artifacts and events on disk.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, assert_nothing_running, interfaces, make_context, spec_for
from support.scripted_engine import tool_call_text

from lego_rl.adapter.sessions import load_turn_records
from lego_rl.rollout.generate import STAGES, RolloutResult, generate
from lego_rl.runstore import read_events
from lego_rl.runstore.events import RolloutFinished, StageFinished
from lego_rl.termination import TerminationReason
from lego_rl.trajectory.sample import load_samples

pytestmark = [pytest.mark.slow, pytest.mark.cli, pytest.mark.root]

WRONG_MEDIAN = """def mean(values):
    return sum(values) / len(values)


def median(values):
    return sorted(values)[len(values) // 2]
"""


def write_file_command(path: str, content: str) -> str:
    """A shell command writing ``content`` to ``path`` (base64: no quoting trouble in any tool)."""
    blob = base64.b64encode(content.encode()).decode()
    return f"printf %s {blob} | base64 -d > {path} && echo written {path}"


def policy_writing(harness: str, path: str, content: str) -> Any:
    """Write the file with the CLI's shell tool until a tool result is in the prompt, then answer."""
    command = write_file_command(path, content)
    if harness == "claude_code":
        call = tool_call_text("Bash", {"command": command, "description": f"Write {path}"})
    else:
        call = tool_call_text("exec_command", {"cmd": command})

    def policy(prompt: str, index: int) -> str:
        if "<tool_response>" in prompt:
            return f"I rewrote {path}; the task is done."
        return call

    return policy


def assert_trained_tokens_are_the_engines(result: RolloutResult, engine: Any) -> None:
    """Issue 5's last line: the Samples' trained tokens are exactly the engine's output ids, in order,
    with the engine's logprobs, and everything else in them is context (mask 0)."""
    assert result.samples, result.detail
    trained: list[int] = []
    trained_lp: list[float] = []
    for sample in sorted(result.samples, key=lambda s: s.segment):
        assert len(sample.tokens) == len(sample.loss_mask) == len(sample.rollout_logprobs)
        trained += [t for t, m in zip(sample.tokens, sample.loss_mask) if m == 1]
        trained_lp += [lp for lp, m in zip(sample.rollout_logprobs, sample.loss_mask) if m == 1]
        assert sample.reward == result.reward and sample.termination == result.termination
    assert trained == [t for call in engine.calls for t in call.output_ids]
    assert trained_lp == [lp for call in engine.calls for lp in call.logprobs]


def assert_artifacts(result: RolloutResult, harness: str, run_root: Path) -> None:
    folder = result.artifacts
    assert folder is not None and folder.is_dir()
    names = {p.name for p in folder.iterdir()}
    for expected in (
        "patch.diff",
        "grader.log",
        "commands-agent.jsonl",
        "outcome.json",
        "samples.jsonl",
        f"{harness}-events.jsonl",
        f"{harness}-command.txt",
    ):
        assert expected in names, (expected, sorted(names))
    turns = [n for n in names if n.endswith(".turns.jsonl")]
    assert len(turns) == 1, sorted(names)
    assert len(load_turn_records(folder / turns[0])) == result.turns
    assert [s.tokens for s in load_samples(folder / "samples.jsonl")] == [s.tokens for s in result.samples]
    outcome = json.loads((folder / "outcome.json").read_text())
    assert outcome["termination"] == result.termination.value and outcome["reward"] == result.reward
    # Tokenisation health as recorded: one chain, no false fork, every scripted call parsed (issue 30).
    health = outcome["tokenisation"]
    assert result.trajectory is not None and health["segments"] == result.trajectory.segments_started
    assert health["false_forks"] == 0 and health["parse_failures"] == 0, health
    commands = [json.loads(line) for line in (folder / "commands-agent.jsonl").read_text().splitlines()]
    assert commands and all(c["sandbox"] == "agent" for c in commands)
    assert (folder / f"{harness}-events.jsonl").stat().st_size > 0

    events = [
        e for e in read_events(run_root / "events.jsonl") if getattr(e, "rollout_id", None) == result.rollout_id
    ]
    kinds = [e.kind for e in events]
    assert kinds[0] == "rollout_started" and kinds[-1] == "rollout_finished", kinds
    stages = {e.stage: e for e in events if isinstance(e, StageFinished)}
    for stage in (
        "harness_lookup",
        "sandbox_setup",
        "harness_install",
        "agent",
        "patch",
        "cleanup",
        "grading",
    ):
        assert stages[stage].status == "ok" and stages[stage].duration_s >= 0, stage
    assert set(result.timings) == set(STAGES)
    # One decision, written once: only rollout_finished names a termination reason.
    assert isinstance(events[-1], RolloutFinished) and events[-1].termination is result.termination
    assert [e.kind for e in events if "termination" in type(e).model_fields] == ["rollout_finished"]


CASES = [
    ("claude_code", "stats/center.py", (EXAMPLES / "src/median/fix/stats/center.py").read_text(), 1.0),
    ("claude_code", "stats/center.py", WRONG_MEDIAN, 0.0),
    ("codex", "textkit/slug.py", (EXAMPLES / "src/slugify/fix/textkit/slug.py").read_text(), 1.0),
    ("codex", "stats/center.py", WRONG_MEDIAN, 0.0),
]


@pytest.mark.parametrize(
    ("harness", "path", "content", "reward"),
    CASES,
    ids=["claude_code-fix", "claude_code-wrong", "codex-fix", "codex-wrong"],
)
async def test_scripted_policy_fix_is_graded_end_to_end(
    harness: str,
    path: str,
    content: str,
    reward: float,
    scripted_stack: Any,
    toolchain: Any,
    example_rows: dict[str, Any],
    tmp_path: Path,
) -> None:
    assert interfaces() == ["lo"]  # the CLIs cannot reach anything but this machine's loopback
    task = "lego-example-slugify" if path.startswith("textkit") else "lego-example-median"
    # Real logprobs (the tiny model scores the scripted ids) for the fixes; zeros for the wrong ones (faster).
    stack = await scripted_stack(policy_writing(harness, path, content), score=reward == 1.0)
    ctx = make_context(tmp_path / "run", stack.sessions, stack.url, toolchain)
    result = await generate(ctx, spec_for(example_rows[task], harness))
    ctx.run.close()

    assert result.termination is TerminationReason.COMPLETED, result.detail
    assert result.reward == reward, (result.detail, (result.artifacts / "grader.log").read_text()[-2000:])
    assert result.turns == 2 and len(stack.engine.calls) == 2
    patch = (result.artifacts / "patch.diff").read_text()
    assert f"+++ b/{path}" in patch
    assert_trained_tokens_are_the_engines(result, stack.engine)
    assert_artifacts(result, harness, tmp_path / "run")
    assert_nothing_running(stack.sessions)


async def test_turn_limit_is_a_policy_termination_that_keeps_its_reward(
    scripted_stack: Any, toolchain: Any, example_rows: dict[str, Any], tmp_path: Path
) -> None:
    """A policy that never stops calling tools hits the CLI's turn limit: graded, reward kept (0 here)."""

    def policy(prompt: str, index: int) -> str:
        return tool_call_text("Bash", {"command": f"echo turn {index}", "description": "echo"})

    stack = await scripted_stack(policy, score=False)
    ctx = make_context(tmp_path / "run", stack.sessions, stack.url, toolchain, max_turns=3)
    result = await generate(ctx, spec_for(example_rows["lego-example-median"], "claude_code"))
    ctx.run.close()
    assert result.termination is TerminationReason.TURN_LIMIT, result.detail
    assert result.reward == 0.0 and not result.infrastructure_failure
    assert result.turns == len(stack.engine.calls) == 3
    assert all(s.reward == 0.0 and s.termination is TerminationReason.TURN_LIMIT for s in result.samples)
    assert_nothing_running(stack.sessions)


@pytest.mark.parametrize(
    ("harness", "path", "content", "reward"),
    CASES,
    ids=["claude_code-fix", "claude_code-wrong", "codex-fix", "codex-wrong"],
)
async def test_scripted_policy_fix_is_graded_end_to_end_on_sunabako(
    harness: str,
    path: str,
    content: str,
    reward: float,
    scripted_stack: Any,
    toolchain: Any,
    sunabako_node: Any,
    example_rows: dict[str, Any],
    tmp_path: Path,
) -> None:
    """The same chain with real sunabako sandboxes (native runtime, test memory mode) for the agent and
    the grader. network="host" is the namespace of the process that spawns the sandbox's supervisor:
    this test's loopback-only cage, so the CLI reaches the adapter and nothing else. Zero logprobs
    (score=False): the bwrap cases above check real ones; here the sandbox provider is what changes."""
    assert interfaces() == ["lo"]
    task = "lego-example-slugify" if path.startswith("textkit") else "lego-example-median"
    before = sunabako_node.sandbox_ids()
    stack = await scripted_stack(policy_writing(harness, path, content), score=False)
    ctx = make_context(
        tmp_path / "run",
        stack.sessions,
        stack.url,
        toolchain,
        provider="sunabako",
        grader_provider="sunabako",
        provider_options=sunabako_node.provider_options,
        sandbox_options={"network": "host", "memory_mb": 2048},
    )
    async with sunabako_node.watch() as seen:
        result = await generate(ctx, spec_for(example_rows[task], harness))
    ctx.run.close()

    assert result.termination is TerminationReason.COMPLETED, result.detail
    assert result.reward == reward, (result.detail, (result.artifacts / "grader.log").read_text()[-2000:])
    assert result.turns == 2 and len(stack.engine.calls) == 2
    assert f"+++ b/{path}" in (result.artifacts / "patch.diff").read_text()
    assert_trained_tokens_are_the_engines(result, stack.engine)
    assert_artifacts(result, harness, tmp_path / "run")
    # The node ran both sandboxes: the agent's and then the grader's (up for a second or so).
    assert len(seen - before) >= 2, f"sandboxes seen running on {sunabako_node.state_dir}: {sorted(seen)}"
    assert_nothing_running(stack.sessions)
    left = sunabako_node.sandbox_ids() - before
    assert not left, f"sunabako sandboxes left on {sunabako_node.state_dir}: {sorted(left)}"
