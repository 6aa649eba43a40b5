"""The metrics the GRPO loop and SFT write are the declared ones (lego_rl.runstore.metric_catalog), both ways:
every name written is declared for its run kind (the write itself checks), and every declaration a run kind
always writes is in a real run's rows, so no view can read a declared name that nobody writes.

Real trainer: the torch backend on the tiny model. The rollouts are a TEST DOUBLE at the rollout boundary
(fixed token sequences, half of each group solved), as in test_loop.py: the metric names do not depend on
what the policy sampled.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from support.loop_settings import default_loop_settings, default_sft_settings

from lego_rl.driver.loop import Prompt, RolloutSlot, TrainLoop
from lego_rl.driver.sft import Demonstration, SftRunner
from lego_rl.monitor.snapshot import build
from lego_rl.monitor.state import RunState
from lego_rl.rollout.generate import RolloutResult
from lego_rl.runstore import RunDir
from lego_rl.runstore import metric_catalog as mc
from lego_rl.runstore.log import follow_metrics
from lego_rl.serving.tiny_model import ensure_tiny_model
from lego_rl.termination import TerminationReason as TR
from lego_rl.train.losses import LossConfig, make_loss
from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings
from lego_rl.trajectory.sample import Sample

ALWAYS = {None, mc.LOSS.when}
"""``when`` of the declarations every row of a run whose steps all trained holds."""


@pytest.fixture(scope="module")
def tiny() -> Path:
    return ensure_tiny_model()


def _backend(tiny: Path) -> TorchBackend:
    return TorchBackend(tiny, TorchTrainSettings(lr=1e-3, weight_decay=0.0, max_grad_norm=None, device="cpu"))


def _sample(rollout_id: str, index: int, reward: float | None) -> Sample:
    return Sample(rollout_id=rollout_id, group_index=0, index=index, tokens=[11, 12, 13, 40 + index, 50],
                  loss_mask=[0, 0, 0, 1, 1], rollout_logprobs=[0.0, 0.0, 0.0, -1.5, -2.0], reward=reward,
                  termination=TR.COMPLETED)


async def half_solved(prompt: Prompt, slot: RolloutSlot) -> RolloutResult:
    """TEST DOUBLE for a ``RolloutFn``: half of every group solves, so every step trains."""
    await asyncio.sleep(0)
    reward = float(slot.index % 2)
    return RolloutResult(rollout_id=slot.rollout_id, instance_id=prompt.id, harness="scripted",
                         termination=TR.COMPLETED, reward=reward,
                         samples=[_sample(slot.rollout_id, slot.index, reward)], timings={}, artifacts=None,
                         detail="", group_index=slot.group_index, index=slot.index)


def _names(root: Path) -> tuple[list[dict[str, float]], set[str]]:
    rows = [r.values for r in follow_metrics(root / "metrics.jsonl").read()]
    return rows, {n for v in rows for n in v}


def _always(kind: mc.RunKind) -> set[str]:
    return {str(m) for m in mc.written_by(kind) if m.when in ALWAYS and not m.is_family}


async def test_the_loop_writes_what_is_declared_and_the_monitor_shows_its_policy_lag(tmp_path: Path,
                                                                                      tiny: Path) -> None:
    settings = default_loop_settings(top_p=1.0, num_rollout=3, batch_size=2, samples_per_prompt=4, micro_batch_tokens=64,
                            concurrency=8, max_staleness=1)
    run = RunDir.open(tmp_path / "run", config={"rollout": {"max_staleness": {"value": 1, "source": "test"}}})
    loop = TrainLoop(settings, backend=_backend(tiny), loss_fn=make_loss(LossConfig()), rollout_fn=half_solved,
                     prompts=[Prompt(f"p{i}", {"i": i}) for i in range(6)], run=run)
    assert await loop.run() == "completed"
    run.close()
    rows, written = _names(run.root)
    assert len(rows) == 3 and all(v[mc.TRAINED] == 1.0 for v in rows)
    assert all(mc.declaration(n) is not None and mc.TRAIN in mc.declaration(n).written_by for n in written)  # type: ignore[union-attr]
    assert _always(mc.TRAIN) <= written, f"declared as always written, not written: {_always(mc.TRAIN) - written}"
    assert all(mc.read_family(v, mc.TOKENS_AGE) for v in rows)
    # The monitor's staleness is what the loop wrote (it once read staleness*, which nobody writes).
    state = RunState(run.root)
    state.refresh()
    snap = build(state, now=time.time(), kl_warn=1.0, sections=["overview"])
    assert snap.overview is not None
    assert snap.overview.staleness == {str(m): rows[-1][m] for m in (mc.POLICY_LAG_MEAN, mc.POLICY_LAG_MAX)}


async def test_sft_writes_what_is_declared_for_sft(tmp_path: Path, tiny: Path) -> None:
    demos = [Demonstration(f"d{i}", [_sample(f"d{i}", i, 1.0)], [i + 1]) for i in range(3)]
    run = RunDir.open(tmp_path / "sft", config={})
    runner = SftRunner(default_sft_settings(steps=2, batch_size=2, micro_batch_tokens=64), backend=_backend(tiny),
                       demos=demos, run=run)
    assert await runner.run() == "completed"
    run.close()
    rows, written = _names(run.root)
    assert len(rows) == 2
    assert all(mc.SFT in (mc.declaration(n) or mc.KL).written_by for n in written), written
    assert _always(mc.SFT) <= written, f"declared as always written, not written: {_always(mc.SFT) - written}"
