"""Red team, through the real CLIs in real bwrap sandboxes: the policy's observation carries nothing of the
rollout's identity. Two rollouts of one task under different rollout ids must send the engine the same
prompt tokens, call for call.

Why it matters: GRPO compares the rollouts of a group as answers to one prompt; the engine's prefix cache
shares a group's system prompt only when it is the same; and a rollout id carries the task's instance id
(``django__django-11099``), which names the upstream fix to a model that memorised it. Claude Code renders its
HOME into the system prompt ("persistent file-based memory at ``$HOME/.claude/...``"), and the plugins used to
put the session id into HOME: every rollout's prompt differed from the ~1.3k-th token on.

The policy is the scripted one (TEST DOUBLE at the model boundary, tests/support/scripted_engine.py): it
answers every call with plain text, so each rollout ends after its first turn (OpenCode adds its title call).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, assert_nothing_running, interfaces, make_context, missing, spec_for

from lego_rl.rollout.generate import generate
from lego_rl.termination import POLICY_OUTCOMES

pytestmark = [pytest.mark.slow, pytest.mark.cli, pytest.mark.root]

ROOTFS_TRIXIE = Path(os.environ.get("LEGO_ROOTFS_TRIXIE_CACHE", "/var/cache/lego-rl/rootfs-trixie"))
"""OpenHands needs Python >= 3.12 in the sandbox: the trixie rootfs of scripts/build_rootfs_trixie.sh."""

IDS = ("django__django-11099-s3", "g00007-lego-example-median-5")
"""Two rollout ids as the run makes them (``lego tasks screen`` / ``lego train``), one with an instance id."""


def answer_at_once(prompt: str, index: int) -> str:
    return "Nothing to change; done."


@pytest.mark.parametrize("harness", ["claude_code", "codex", "opencode", "openhands"])
async def test_two_rollouts_of_one_task_send_the_engine_the_same_prompts(
    harness: str, scripted_stack: Any, toolchain: Any, example_rows: dict[str, Any], tmp_path: Path
) -> None:
    assert interfaces() == ["lo"]
    stack = await scripted_stack(answer_at_once, score=False)
    ctx = make_context(tmp_path / "run", stack.sessions, stack.url, toolchain)
    if harness == "openhands":
        if not (ROOTFS_TRIXIE / ".lego-rootfs-stamp").is_file():
            missing(f"no trixie rootfs at {ROOTFS_TRIXIE}: run scripts/build_rootfs_trixie.sh")
        assert ctx.images is not None
        ctx.images = {k: dataclasses.replace(v, rootfs=str(ROOTFS_TRIXIE)) for k, v in ctx.images.items()}
    prompts: list[list[list[int]]] = []
    for rollout_id in IDS:  # one after the other: the engine's calls split cleanly per rollout
        before = len(stack.engine.calls)
        result = await generate(ctx, spec_for(example_rows["lego-example-median"], harness, rollout_id))
        assert result.termination in POLICY_OUTCOMES, (result.termination, result.detail)
        prompts.append([call.prompt_ids for call in stack.engine.calls[before:]])
    ctx.run.close()

    first, second = prompts
    assert first, "the CLI never reached the engine"
    texts = [stack.engine.tokenizer.decode(ids) for ids in first]
    for text in texts:
        assert "11099" not in text and "g00007" not in text, text[:2000]
    assert len(first) == len(second)
    for a, b in zip(first, second):
        at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        assert a == b, (
            f"prompts differ at token {at} of {len(a)}/{len(b)}: "
            f"{stack.engine.tokenizer.decode(a[max(0, (at or 0) - 30):(at or 0) + 30])!r} vs "
            f"{stack.engine.tokenizer.decode(b[max(0, (at or 0) - 30):(at or 0) + 30])!r}"
        )
    assert_nothing_running(stack.sessions)
