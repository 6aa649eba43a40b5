"""Small runs of the kinds the monitor must show, written through the run store's own writers.

* ``write_async_train``: a TEST DOUBLE for a two-step asynchronous GRPO run (``rollout.max_staleness`` 1): the
  rollouts of the second step start while step 0 is open and are taken by step 1's ``batch_taken``, as the
  scheduler does; policy lag 1.0 in step 1's row; a stale lock taken over and a resume override on the way.
* ``write_sft``: a TEST DOUBLE for ``lego train --sft`` (three steps, loss 8.2 → 4.0), the events and the
  declared SFT values ``driver.sft`` writes.
* ``write_main_job``: the main job's folder (``demos/`` the recorded rollout-check run, ``sft/``, ``grpo/``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from monitor_runs import CHECK

from lego_rl.runstore import RunDir, StepMetrics
from lego_rl.runstore import metric_catalog as mc
from lego_rl.runstore.events import (
    BatchTaken,
    ResumeOverride,
    RolloutFinished,
    RolloutStarted,
    StaleLockTaken,
    StepFinished,
    StepStarted,
    TrainingFinished,
)


def _cfg(**sections: dict[str, object]) -> dict[str, object]:
    return {sec: {k: {"value": v, "source": "test"} for k, v in keys.items()} for sec, keys in sections.items()}


def write_async_train(root: Path, *, t0: float = 1_796_101_000.0) -> Path:
    """Step 0 trains group A (started and finished in step 0); group B starts while step 0 is open, finishes
    after it, and step 1 takes it. Both groups are task-t, both all-failed: 2 zero-variance groups, one per step."""
    run = RunDir.open(root, config=_cfg(train={"num_rollout": 2}, rollout={"max_staleness": 1}))
    emit = run.events.emit
    emit(StaleLockTaken(ts=t0, step=0, previous_pid=4242, previous_host="node-7", previous_since=t0 - 100))
    emit(StepStarted(ts=t0 + 1, step=0, weight_version=0))
    for group, (start, end) in enumerate([(2, 3), (4, 12)]):
        for i in range(2):
            rid = f"g{group}-r{i}"
            emit(RolloutStarted(ts=t0 + start, rollout_id=rid, instance_id="task-t", harness="claude_code",
                                group_index=group, index=i))
            if group == 0:
                emit(RolloutFinished(ts=t0 + end, rollout_id=rid, termination="completed", reward=0.0,
                                     infrastructure_failure=False, turns=3))
    emit(BatchTaken(ts=t0 + 5, step=0, rollout_ids=["g0-r0", "g0-r1"], prompt_ids=["task-t"],
                    started_policies=[0, 0], wait_s=0.0))
    lag = {mc.POLICY_LAG_MEAN: 0.0, mc.POLICY_LAG_MAX: 0.0}
    values = {mc.LOSS: 0.5, mc.GRAD_NORM: 1.5, mc.ENTROPY: 2.0, mc.LR: 1e-6, mc.REWARD_MEAN: 0.0,
              mc.ZERO_VARIANCE_GROUPS: 1.0, mc.TIME_ROLLOUT_S: 4.0, mc.TIME_TRAIN_S: 2.0, mc.TIME_SYNC_S: 0.5}
    run.metrics.append(StepMetrics(step=0, started_at=t0 + 1, finished_at=t0 + 9,
                                   values=mc.declared_values(mc.TRAIN, {**values, **lag}),
                                   terminations={"completed": 2}))  # type: ignore[dict-item]
    emit(StepFinished(ts=t0 + 9, step=0, admitted_rollouts=2, zero_variance_groups=1, trained=False,
                      weight_version=0))
    emit(ResumeOverride(ts=t0 + 9.5, step=1, key="train.lr", before=1e-6, after=2e-6, recorded_in="config.json"))
    emit(StepStarted(ts=t0 + 10, step=1, weight_version=0))
    for i in range(2):
        emit(RolloutFinished(ts=t0 + 12, rollout_id=f"g1-r{i}", termination="completed", reward=0.0,
                             infrastructure_failure=False, turns=4))
    emit(BatchTaken(ts=t0 + 12, step=1, rollout_ids=["g1-r0", "g1-r1"], prompt_ids=["task-t"],
                    started_policies=[0, 0], wait_s=2.0))
    lag = {mc.POLICY_LAG_MEAN: 1.0, mc.POLICY_LAG_MAX: 1.0}
    run.metrics.append(StepMetrics(step=1, started_at=t0 + 10, finished_at=t0 + 14,
                                   values=mc.declared_values(mc.TRAIN, {**values, mc.LOSS: 0.4, **lag}),
                                   terminations={"completed": 2}))  # type: ignore[dict-item]
    emit(StepFinished(ts=t0 + 14, step=1, admitted_rollouts=2, zero_variance_groups=1, trained=False,
                      weight_version=0))
    emit(TrainingFinished(ts=t0 + 15, status="completed", steps_done=2))
    run.close()
    return root


SFT_LOSSES = (8.2, 6.1, 4.0)


def write_sft(root: Path, *, t0: float = 1_796_100_000.0) -> Path:
    run = RunDir.open(root, config=_cfg(train={"sft_data": "demos.jsonl", "sft_steps": 3}))
    for step, loss in enumerate(SFT_LOSSES):
        ts = t0 + 10 * step
        run.events.emit(StepStarted(ts=ts, step=step, weight_version=step))
        values = {mc.LOSS: loss, mc.NLL: loss, mc.GRAD_NORM: 3.0, mc.LR: 1e-4, mc.TOKENS: 900.0,
                  mc.DEMONSTRATIONS: 1.0, mc.EPOCH: float(step), mc.WEIGHT_VERSION: step + 1.0,
                  mc.TIME_TRAIN_S: 5.0}
        run.metrics.append(StepMetrics(step=step, started_at=ts, finished_at=ts + 5,
                                       values=mc.declared_values(mc.SFT, values)))
        run.events.emit(StepFinished(ts=ts + 5, step=step, admitted_rollouts=1, trained=True,
                                     weight_version=step + 1))
    run.events.emit(TrainingFinished(ts=t0 + 30, status="completed", steps_done=3))
    run.close()
    return root


def write_main_job(parent: Path) -> Path:
    parent.mkdir(parents=True)
    shutil.copytree(CHECK, parent / "demos")
    write_sft(parent / "sft")
    write_async_train(parent / "grpo")
    return parent
