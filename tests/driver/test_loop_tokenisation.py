"""The loop writes each step's tokenisation health from its rollouts' trajectories (metric_catalog's
``tokenisation`` group), and what it writes is what the rollouts' segments show.

Real trainer (torch on the tiny model) and real trajectory building (``build_samples`` over turn records);
the rollouts are a TEST DOUBLE at the rollout boundary: scripted turn records instead of a CLI and engine.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.loop_settings import default_loop_settings

from lego_rl.driver.loop import Prompt, RolloutSlot, TrainLoop
from lego_rl.rollout.generate import RolloutResult
from lego_rl.runstore import RunDir
from lego_rl.runstore import metric_catalog as mc
from lego_rl.runstore.turns import NO_PREVIOUS_TURN, TurnRecord
from lego_rl.serving.tiny_model import ensure_tiny_model
from lego_rl.termination import TerminationReason as TR
from lego_rl.train.losses import LossConfig, make_loss
from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings
from lego_rl.trajectory.manager import build_samples


def _rec(turn: int, prompt: list[int], output: list[int], **extra: object) -> TurnRecord:
    fields: dict[str, object] = {"render_mode": "full", **extra}
    return TurnRecord(session_id="s", turn=turn, protocol="anthropic", prompt_ids=prompt, output_ids=output,
                      logprobs=[-1.0] * len(output), finish_reason="stop", **fields)  # type: ignore[arg-type]


async def forking(prompt: Prompt, slot: RolloutSlot) -> RolloutResult:
    """TEST DOUBLE for a ``RolloutFn``: odd slots re-render their second turn with drifted ids (a false fork
    repeating 4 prompt tokens) and fail to parse one call; even slots keep one chain. Odd slots solve."""
    await asyncio.sleep(0)
    first = _rec(0, [11, 12, 13], [40 + slot.index, 50], fallback_reason=NO_PREVIOUS_TURN)
    if slot.index % 2:
        second = _rec(1, [11, 12, 13, 40 + slot.index, 99, 14], [60], parse_failures=1,
                      fallback_reason="the previous output did not end with the end-of-message token")
    else:
        second = _rec(1, [11, 12, 13, 40 + slot.index, 50, 14], [60], render_mode="bridged", bridge_prefix_len=5)
    reward = float(slot.index % 2)
    samples, stats = build_samples([first, second], rollout_id=slot.rollout_id, group_index=slot.group_index,
                                   index=slot.index, reward=reward, termination=TR.COMPLETED)
    return RolloutResult(rollout_id=slot.rollout_id, instance_id=prompt.id, harness="scripted",
                         termination=TR.COMPLETED, reward=reward, samples=samples, timings={}, artifacts=None,
                         group_index=slot.group_index, index=slot.index, trajectory=stats)


@pytest.mark.slow
async def test_step_row_sums_the_rollouts_tokenisation_health(tmp_path: Path) -> None:
    settings = default_loop_settings(top_p=1.0, num_rollout=1, batch_size=1, samples_per_prompt=4,
                                     micro_batch_tokens=64, concurrency=4, max_staleness=0)
    backend = TorchBackend(ensure_tiny_model(), TorchTrainSettings(lr=1e-3, weight_decay=0.0, max_grad_norm=None,
                                                                   device="cpu"))
    loop = TrainLoop(settings, backend=backend, loss_fn=make_loss(LossConfig()), rollout_fn=forking,
                     prompts=[Prompt("p0", {})], run=RunDir.open(tmp_path / "run", config={}))
    row = await loop.run_step(0)
    loop.run_dir.close()
    # 4 rollouts: two with one chain (1 segment), two with a false fork (2 segments, 4 repeated tokens, one
    # fallback and one parse failure each).
    assert {m: row.values[m] for m in (mc.SEGMENTS_PER_ROLLOUT, mc.SEGMENTS_PER_ROLLOUT_MAX, mc.FALSE_FORKS,
                                       mc.REPEATED_PROMPT_TOKENS, mc.RENDER_FALLBACKS, mc.PARSE_FAILURES)} == {
        mc.SEGMENTS_PER_ROLLOUT: 1.5, mc.SEGMENTS_PER_ROLLOUT_MAX: 2.0, mc.FALSE_FORKS: 2.0,
        mc.REPEATED_PROMPT_TOKENS: 8.0, mc.RENDER_FALLBACKS: 2.0, mc.PARSE_FAILURES: 2.0}
