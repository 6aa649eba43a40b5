"""A 64k-token rollout with real Claude Code and real Codex: generate() end to end (bwrap sandbox, offline CLI
install, the adapter, grading) while one chain of history grows past 65536 tokens.

The policy is the scripted TEST DOUBLE at the model boundary (tests/support/scripted_engine.py): a random
tiny model never calls tools. Its first turn writes the example task's fix and a 20000-line log of hex
hashes to /tmp (outside the repository, so not in the patch); every later turn reads the next slice of
that log through the CLI's shell tool, sized from the exact prompt length so the last request lands
between ``TARGET`` and the window; then it answers. Everything between the policy and the sandbox is
real, so this is where a production-size history meets each CLI's own limits (output truncation, turn
caps, compaction) and the adapter's bridging over tens of requests.

Checked: the rollout completes and is graded (reward 1), the last prompt is >= 65536 tokens, every line
read reached the engine, every turn extends the one before (no compaction, one segment), and the
recorded Samples rebuild each engine call exactly (prompt ids followed by output ids, the output trained
with the engine's logprobs).

Zero logprobs (``score=False``): scoring a 64k-token prompt with the tiny model on two CPU cores takes
minutes; the scripted and tiny-model tests check real logprobs on shorter histories. With the model not
run, the window is the adapter's and the CLIs' setting only, and it is raised to 128k for the one-chain
cases: each CLI compacts once a turn's prompt passes 70 % of its window. The other tests keep the reference's
65536 window: each CLI compacts there and completes, and Codex told no window fills it (context_limit).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, assert_nothing_running, interfaces, make_context, spec_for
from support.scripted_engine import ScriptedPolicyEngine, tool_call_text
from test_generate_scripted import assert_artifacts, assert_trained_tokens_are_the_engines, write_file_command

from lego_rl.adapter.sessions import load_turn_records
from lego_rl.harness.plugins import get_harness, get_plugin_manager
from lego_rl.rollout.generate import RolloutResult, generate
from lego_rl.termination import TerminationReason

pytestmark = [pytest.mark.slow, pytest.mark.cli, pytest.mark.root]

WINDOW = 131072
"""The adapter's and the rollout's context window (the tiny model's 65536 positions, raised: the scripted
engine does not run the model). At 65536, Claude Code 2.1 compacts after a turn whose prompt passed 70 % of
it (the plugin's autocompact_pct): a 64k-token single chain needs a larger window."""
TARGET = 65536
"""The last request's prompt is at least this long."""
LOG_LINES = 20_000
LOG = "/tmp/big.log"
MAKE_LOG = (
    'python3 -c "import sys; sys.stdout.write(\'\'.join(\'%08x\\n\' % (i * 2654435761 % 4294967296) '
    f'for i in range({LOG_LINES})))" > {LOG}'
)
"""Writes the log inside the sandbox: line i is ``f"{i * 2654435761 % 2**32:08x}"`` (about one token per
byte for the tiny model's tokenizer, so the CLIs' characters/4 estimates see a quarter of the real size)."""
MAX_LINES = {"claude_code": 3000, "codex": 1000}
"""Lines per read, under each CLI's tool-output truncation (Claude Code: 30000 characters per Bash result;
Codex: about 10 KB per exec_command result for a model it does not know)."""
MARGIN = 300
"""Tokens read beyond the gap to TARGET: covers the tool call and the tool result's frame of one turn."""


def log_line(i: int) -> str:
    return f"{i * 2654435761 % 2**32:08x}"


SUMMARY_ASKS = ("create a detailed summary of the conversation so far", "CONTEXT CHECKPOINT COMPACTION")
"""What the last user message of a compaction request says: Claude Code 2.1's (no request-class header in
-p mode; the adapter labels it by this text), Codex 0.162's (a local compaction, named in its metadata header)."""


class LogReader:
    """The policy: fix the task, then read slices of the log until the prompt reaches ``target``, then answer.
    Asked to summarise (Claude Code compacting), it writes a summary, and answers once the history resumes."""

    def __init__(self, harness: str, engine: ScriptedPolicyEngine, fix: str, target: int = TARGET) -> None:
        self.harness, self.engine, self.fix, self.target = harness, engine, fix, target
        self.read = 0  # lines of the log read so far
        self.summaries = 0
        sample = "".join(log_line(i) + "\n" for i in range(1000))
        self.tokens_per_line = len(engine.tokenizer.encode(sample)) / 1000

    def call(self, command: str) -> str:
        if self.harness == "claude_code":
            return tool_call_text("Bash", {"command": command, "description": "Read the log"})
        return tool_call_text("exec_command", {"cmd": command})

    def __call__(self, prompt: str, index: int) -> str:
        have = len(self.engine.prompt_ids)
        if any(ask in prompt.rsplit("<|im_start|>user", 1)[-1] for ask in SUMMARY_ASKS):
            self.summaries += 1
            return ("<analysis>\nThe user asked for a fix of stats/center.py.\n</analysis>\n<summary>\n"
                    f"1. Primary Request: fix the median in stats/center.py. Done. {self.read} lines of {LOG} read."
                    "\n</summary>")
        if have >= self.target or self.summaries:
            return f"I fixed stats/center.py and read {self.read} lines of {LOG}; the task is done."
        gap = self.target - have + MARGIN
        lines = min(MAX_LINES[self.harness], math.ceil(gap / self.tokens_per_line))
        first, self.read = self.read + 1, self.read + lines
        read = f"sed -n {first},{self.read}p {LOG}"
        if index == 0:
            return self.call(f"{write_file_command('stats/center.py', self.fix)} && {MAKE_LOG} && {read}")
        return self.call(read)


def assert_samples_rebuild_engine_calls(result: RolloutResult, engine: ScriptedPolicyEngine) -> None:
    """Each engine call is a prefix of one Sample: its prompt ids, then its output ids trained (mask 1) with
    the engine's logprobs. With the trained-tokens check this is exact token capture over the whole run."""
    for n, call in enumerate(engine.calls):
        whole = call.prompt_ids + call.output_ids
        out = slice(len(call.prompt_ids), len(whole))
        holders = [s for s in result.samples if s.tokens[: len(whole)] == whole]
        assert holders, f"engine call {n} ({len(call.prompt_ids)} prompt ids) is in no sample"
        # Sibling segments share a sampled prefix; it is trained in exactly one of them.
        trained = [s for s in holders if s.loss_mask[out] == [1] * len(call.output_ids)]
        assert len(trained) == 1, (n, [s.segment for s in holders])
        assert trained[0].rollout_logprobs[out] == call.logprobs, n


@pytest.mark.parametrize("harness", ["claude_code", "codex"])
async def test_64k_token_rollout_completes_with_exact_tokens(
    harness: str, scripted_stack: Any, toolchain: Any, example_rows: dict[str, Any], tmp_path: Path
) -> None:
    assert interfaces() == ["lo"]
    fix = (EXAMPLES / "src/median/fix/stats/center.py").read_text()
    stack = await scripted_stack(lambda prompt, index: reader(prompt, index), context_limit=WINDOW, score=False)
    reader = LogReader(harness, stack.engine, fix)
    ctx = make_context(tmp_path / "run", stack.sessions, stack.url, toolchain, max_context_tokens=WINDOW,
                       max_turns=16, agent_time_budget_s=300.0)
    result = await generate(ctx, spec_for(example_rows["lego-example-median"], harness))
    ctx.run.close()

    calls = stack.engine.calls
    sizes = [len(c.prompt_ids) for c in calls]
    assert result.termination is TerminationReason.COMPLETED, (result.detail, sizes)
    assert result.reward == 1.0, (result.detail, (result.artifacts / "grader.log").read_text()[-2000:])
    assert TARGET <= sizes[-1] and sizes[-1] + len(calls[-1].output_ids) <= WINDOW, sizes
    assert calls[-1].text.startswith("I fixed") and result.turns == len(calls), sizes
    # Every line the policy asked for reached the engine: no CLI truncated a tool result it was given.
    final = stack.engine.tokenizer.decode(calls[-1].prompt_ids)
    missing = [i for i in range(reader.read) if log_line(i) not in final]
    assert not missing, (len(missing), missing[:5], sizes)
    assert_trained_tokens_are_the_engines(result, stack.engine)
    assert_samples_rebuild_engine_calls(result, stack.engine)
    assert_artifacts(result, harness, tmp_path / "run")
    # One chain: every turn extends the one before it (no compaction, no re-render), so one Sample holds it all.
    [turns_file] = result.artifacts.glob("*.turns.jsonl")
    records = load_turn_records(turns_file)
    assert [(r.render_mode, r.bridge_from_turn) for r in records[1:]] == [
        ("bridged", r.turn - 1) for r in records[1:]], [(r.render_mode, r.fallback_reason) for r in records]
    assert len(result.samples) == 1 and len(result.samples[0].tokens) == sizes[-1] + len(calls[-1].output_ids)
    assert_nothing_running(stack.sessions)


async def test_claude_code_compacts_at_a_64k_window_and_completes(
    scripted_stack: Any, toolchain: Any, example_rows: dict[str, Any], tmp_path: Path
) -> None:
    """The reference's production setting: a 65536-token window (CLAUDE_CODE_MAX_CONTEXT_TOKENS, autocompact at
    70 %). After a turn whose prompt passed 70 % (60k tokens here) Claude Code compacts: its summary request
    has no request-class header in -p mode; the adapter knows it by its text and labels it a ``compaction``
    side request (before, it forked the main chain), and the session resumes from the summary in a full
    render. The rollout completes, graded, and the Samples rebuild every engine call.

    A policy that answers the summary request with a tool call fails the compaction: Claude Code exits 1
    ("Prompt is too long · automatic compaction failed"), labelled agent_error_exit, a policy outcome."""
    assert interfaces() == ["lo"]
    fix = (EXAMPLES / "src/median/fix/stats/center.py").read_text()
    window = 65536
    stack = await scripted_stack(lambda prompt, index: reader(prompt, index), context_limit=window, score=False)
    reader = LogReader("claude_code", stack.engine, fix, target=window - 1500)
    ctx = make_context(tmp_path / "run", stack.sessions, stack.url, toolchain, max_context_tokens=window,
                       max_turns=16, agent_time_budget_s=300.0)
    result = await generate(ctx, spec_for(example_rows["lego-example-median"], "claude_code"))
    ctx.run.close()

    calls = stack.engine.calls
    sizes = [len(c.prompt_ids) for c in calls]
    assert result.termination is TerminationReason.COMPLETED, (result.detail, sizes)
    assert result.reward == 1.0, (result.detail, (result.artifacts / "grader.log").read_text()[-2000:])
    assert reader.summaries == 1, sizes
    [asked] = [n for n, c in enumerate(calls) if c.text.startswith("<analysis>")]
    assert sizes[asked] > 55_000 and sizes[asked + 1] < sizes[asked] // 4, sizes  # resumed from the summary
    assert calls[-1].text.startswith("I fixed") and result.turns == len(calls) - 1, sizes  # main turns only
    assert max(sizes) + 1024 <= window, sizes
    records = load_turn_records(next(result.artifacts.glob("*.turns.jsonl")))
    assert (records[asked].kind, records[asked].side_label) == ("side", "compaction"), [
        (r.kind, r.side_label, r.render_mode, r.bridge_from_turn) for r in records]
    assert records[asked + 1].render_mode == "full" and len(records) == len(calls)
    assert len(result.samples) == 3  # the main chain before and after compaction, and the compaction
    assert_trained_tokens_are_the_engines(result, stack.engine)
    assert_samples_rebuild_engine_calls(result, stack.engine)
    assert_nothing_running(stack.sessions)


async def test_codex_fills_a_64k_window_and_ends_at_context_limit(
    scripted_stack: Any, toolchain: Any, example_rows: dict[str, Any], tmp_path: Path
) -> None:
    """Told no window (``autocompact_pct=0``) it never compacts for a model it does not know:
    a policy that keeps reading fills the 65536-token window. The adapter answers the request that no longer
    fits with a context_limit stop (no engine call), Codex ends its turn, and the rollout is a graded
    CONTEXT_LIMIT (a policy outcome) whose samples still rebuild every engine call."""
    assert interfaces() == ["lo"]
    fix = (EXAMPLES / "src/median/fix/stats/center.py").read_text()
    window = 65536
    stack = await scripted_stack(lambda prompt, index: reader(prompt, index), context_limit=window, score=False)
    reader = LogReader("codex", stack.engine, fix, target=10 * window)  # never answers: reads until it cannot
    pm = get_plugin_manager({})
    ctx = make_context(tmp_path / "run", stack.sessions, stack.url, toolchain, max_context_tokens=window,
                       max_turns=16, agent_time_budget_s=300.0,
                       harness_for=lambda name: get_harness(name, {"autocompact_pct": 0}, environ={}, pm=pm))
    result = await generate(ctx, spec_for(example_rows["lego-example-median"], "codex"))
    ctx.run.close()

    calls = stack.engine.calls
    sizes = [len(c.prompt_ids) for c in calls]
    assert result.termination is TerminationReason.CONTEXT_LIMIT, (result.detail, sizes)
    assert result.reward == 1.0 and not result.infrastructure_failure, result.detail
    assert sizes[-1] > window - 9000 and max(sizes) < window, sizes  # the next 1000-line read did not fit
    assert_trained_tokens_are_the_engines(result, stack.engine)
    assert_samples_rebuild_engine_calls(result, stack.engine)
    assert_artifacts(result, "codex", tmp_path / "run")
    assert_nothing_running(stack.sessions)


async def test_codex_compacts_at_a_64k_window_and_completes(
    scripted_stack: Any, toolchain: Any, example_rows: dict[str, Any], tmp_path: Path
) -> None:
    """The plugin's default: Codex is told the 65536-token window and compacts at 70 % of it. Past ~46k tokens
    it sends its compaction request (a plain Responses request that the adapter labels a ``compaction`` side
    request: Codex names its kind in its metadata header), resumes from the summary in a full
    render, and the rollout completes, graded, with every engine call rebuilt from the samples."""
    assert interfaces() == ["lo"]
    fix = (EXAMPLES / "src/median/fix/stats/center.py").read_text()
    window = 65536
    stack = await scripted_stack(lambda prompt, index: reader(prompt, index), context_limit=window, score=False)
    reader = LogReader("codex", stack.engine, fix, target=10 * window)  # reads until Codex compacts
    ctx = make_context(tmp_path / "run", stack.sessions, stack.url, toolchain, max_context_tokens=window,
                       max_turns=16, agent_time_budget_s=300.0)
    result = await generate(ctx, spec_for(example_rows["lego-example-median"], "codex"))
    ctx.run.close()

    calls = stack.engine.calls
    sizes = [len(c.prompt_ids) for c in calls]
    assert result.termination is TerminationReason.COMPLETED, (result.detail, sizes)
    assert result.reward == 1.0, (result.detail, (result.artifacts / "grader.log").read_text()[-2000:])
    assert reader.summaries == 1, sizes
    [asked] = [n for n, c in enumerate(calls) if c.text.startswith("<analysis>")]
    assert window * 70 // 100 < sizes[asked] < window and sizes[asked + 1] < sizes[asked] // 4, sizes
    assert calls[-1].text.startswith("I fixed") and result.turns == len(calls) - 1, sizes  # main turns only
    records = load_turn_records(next(result.artifacts.glob("*.turns.jsonl")))
    assert (records[asked].kind, records[asked].side_label) == ("side", "compaction")
    assert records[asked + 1].render_mode == "full", [(r.render_mode, r.fallback_reason) for r in records]
    assert_trained_tokens_are_the_engines(result, stack.engine)
    assert_samples_rebuild_engine_calls(result, stack.engine)
    assert len(records) == len(calls)  # (assert_artifacts expects no side turns: every record is a main turn there)
    assert_nothing_running(stack.sessions)
