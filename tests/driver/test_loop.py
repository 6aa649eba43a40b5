"""The training loop's bookkeeping: refills, zero-variance groups, admission, packing into optimizer steps,
checkpoints and resume, stop, evaluation, the metrics row.

The trainer is the product's torch backend on the tiny HF model (AdamW without weight decay, so a step whose
advantages are all zero moves nothing). The rollouts are a TEST DOUBLE at the rollout boundary
(``ScriptedRollouts``): they return real ``Sample`` objects with outcomes chosen per test, because the
behaviours under test (an infrastructure failure on the 2nd attempt of slot 3, a group that is all
solved) cannot be produced on demand by a real engine. ``test_loop_learning.py`` runs the real engine.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.loop_settings import default_loop_settings
import torch

from lego_rl.errors import ConfigError
from lego_rl.monitor.snapshot import build
from lego_rl.monitor.state import RunState
from lego_rl.monitor.views import tasks as tasks_view
from lego_rl.driver.loop import Prompt, RolloutSlot, TrainingError, TrainLoop
from lego_rl.rollout.generate import RolloutResult
from lego_rl.runstore import RunDir, read_events
from lego_rl.runstore import metric_catalog as mc
from lego_rl.runstore.events import RolloutFinished, RolloutStarted
from lego_rl.runstore.log import follow_metrics
from lego_rl.serving.tiny_model import ensure_tiny_model
from lego_rl.termination import TerminationReason as TR
from lego_rl.trajectory.sample import Sample, TurnSpan
from lego_rl.train.losses import LossConfig, make_loss
from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings

Outcome = tuple[TR, float | None]


class ScriptedRollouts:
    """TEST DOUBLE for a ``RolloutFn``: ``decide(prompt, slot)`` picks each rollout's termination and reward;
    the sample is a short real token sequence of the tiny vocabulary. Records every call."""

    def __init__(self, decide: Callable[[Prompt, RolloutSlot], Outcome]) -> None:
        self.decide = decide
        self.calls: list[tuple[str, RolloutSlot]] = []

    async def __call__(self, prompt: Prompt, slot: RolloutSlot) -> RolloutResult:
        self.calls.append((prompt.id, slot))
        await asyncio.sleep(0)
        reason, reward = self.decide(prompt, slot)
        samples = []
        if reason not in (TR.SANDBOX_SETUP, TR.ENGINE_ERROR):
            samples = [Sample(rollout_id=slot.rollout_id, group_index=slot.group_index, index=slot.index,
                              tokens=[11, 12, 13, 40 + slot.index, 50], loss_mask=[0, 0, 0, 1, 1],
                              rollout_logprobs=[0.0, 0.0, 0.0, -1.5, -2.0], reward=reward, termination=reason)]
        return RolloutResult(rollout_id=slot.rollout_id, instance_id=prompt.id, harness="scripted",
                             termination=reason, reward=reward, samples=samples, timings={}, artifacts=None,
                             detail="engine gone" if reason == TR.ENGINE_ERROR else "",
                             group_index=slot.group_index, index=slot.index)


def alternate(prompt: Prompt, slot: RolloutSlot) -> Outcome:
    """Half of every group solves: every group carries signal."""
    return TR.COMPLETED, float(slot.index % 2)


@pytest.fixture(scope="module")
def tiny() -> Path:
    return ensure_tiny_model()


def prompts(n: int) -> list[Prompt]:
    return [Prompt(f"p{i}", {"i": i}) for i in range(n)]


def make_loop(tmp_path: Path, tiny: Path, rollouts: ScriptedRollouts, *, name: str = "run", resume: bool = False,
              resume_index: int = 0, eval_prompts: list[Prompt] | None = None, **kw: object) -> TrainLoop:
    base: dict[str, object] = dict(num_rollout=2, batch_size=2, samples_per_prompt=4, micro_batch_tokens=64,
                                   concurrency=3, max_staleness=1)
    base.update(kw)
    settings = default_loop_settings(top_p=1.0, **base)  # untruncated: scripted rollouts carry no nucleus
    run = RunDir.open(tmp_path / name, config={"test": True}, resume=resume)
    return TrainLoop(settings, backend=TorchBackend(tiny, TorchTrainSettings(lr=1e-3, weight_decay=0.0, max_grad_norm=None, device="cpu")),
                     loss_fn=make_loss(LossConfig()),
                     rollout_fn=rollouts, prompts=prompts(6), run=run, eval_prompts=eval_prompts or [],
                     resume_index=resume_index)


def params(loop: TrainLoop) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in loop.backend.model.state_dict().items()}  # type: ignore[attr-defined]


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


async def test_step_trains_and_writes_metrics_row_and_events(tmp_path: Path, tiny: Path) -> None:
    loop = make_loop(tmp_path, tiny, ScriptedRollouts(alternate))
    before = params(loop)
    row = await loop.run_step(0)
    assert row.values["trained"] == 1.0 and loop.backend.weight_version == 1
    assert not same(before, params(loop))
    for key in ("reward_mean", "solve_rate", "loss", "grad_norm", "lr", "tokens", "time_rollout_s",
                "time_train_s", "time_sync_s", "admitted_rollouts", "zero_variance_groups"):
        assert key in row.values, key
    assert row.values["reward_mean"] == 0.5 and row.values["solve_rate"] == 0.5
    assert row.values["admitted_rollouts"] == 8 and row.values["tokens"] == 16  # 8 rollouts x 2 sampled tokens
    assert row.terminations == {TR.COMPLETED: 8}
    # Rollout-vs-trainer consistency of the trained tokens, measured before the update, every step.
    for key in ("consistency/mean_abs_diff", "consistency/max_abs_diff", "consistency/first_segment/mean_abs_diff"):
        assert key in row.values, sorted(row.values)
    assert row.values["consistency/max_abs_diff"] >= row.values["consistency/mean_abs_diff"] >= 0.0
    loop.run_dir.close()
    [stored] = list(follow_metrics(loop.run_dir.layout.metrics).read())
    assert stored == row
    kinds = [e.kind for e in read_events(loop.run_dir.layout.events)]
    assert kinds == ["run_started", "step_started", "batch_taken", "step_finished"]


async def test_infrastructure_failure_is_refilled_in_its_slot_not_dropped(tmp_path: Path, tiny: Path) -> None:
    def flaky(prompt: Prompt, slot: RolloutSlot) -> Outcome:
        if slot.index == 1 and slot.attempt == 0:
            return TR.SANDBOX_SETUP, None
        return alternate(prompt, slot)

    rollouts = ScriptedRollouts(flaky)
    loop = make_loop(tmp_path, tiny, rollouts)
    row = await loop.run_step(0)
    assert row.values["refills"] == 2 and row.values["admitted_rollouts"] == 8  # both groups kept 4 rollouts
    refills = [e for e in read_events(loop.run_dir.layout.events) if e.kind == "rollout_refilled"]
    assert len(refills) == 2 and all(e.failed_rollout_id.endswith("-1") for e in refills)
    assert all(e.new_rollout_id == e.failed_rollout_id + "-refill1" and e.attempt == 1 for e in refills)
    assert all(e.termination == TR.SANDBOX_SETUP for e in refills)
    # the refill ran for the same prompt and slot
    again = [(p, s) for p, s in rollouts.calls if s.attempt == 1]
    assert len(again) == 2 and all(s.index == 1 for _, s in again)


async def test_refills_are_bounded_and_the_failure_then_excluded(tmp_path: Path, tiny: Path) -> None:
    def broken_slot(prompt: Prompt, slot: RolloutSlot) -> Outcome:
        return (TR.SANDBOX_SETUP, None) if slot.index == 0 else alternate(prompt, slot)

    rollouts = ScriptedRollouts(broken_slot)
    loop = make_loop(tmp_path, tiny, rollouts, max_refills=3)
    row = await loop.run_step(0)
    assert row.values["refills"] == 6  # 3 per group
    assert row.values["admitted_rollouts"] == 6 and row.values["excluded_rollouts"] == 2
    assert row.terminations[TR.SANDBOX_SETUP] == 2
    assert row.values["trained"] == 1.0


async def test_zero_reward_policy_does_not_refill_but_counts_the_failure_as_failed(tmp_path: Path, tiny: Path) -> None:
    def broken_slot(prompt: Prompt, slot: RolloutSlot) -> Outcome:
        return (TR.SANDBOX_SETUP, None) if slot.index == 0 else (TR.COMPLETED, 1.0)

    loop = make_loop(tmp_path, tiny, ScriptedRollouts(broken_slot), infra_failure_policy="zero_reward")
    row = await loop.run_step(0)
    assert row.values["refills"] == 0 and row.values["admitted_rollouts"] == 8
    assert row.values["trained"] == 1.0  # the failed attempt (reward 0) next to three solved ones is signal


async def test_no_signal_step_leaves_parameters_and_version_untouched(tmp_path: Path, tiny: Path) -> None:
    loop = make_loop(tmp_path, tiny, ScriptedRollouts(lambda p, s: (TR.COMPLETED, 1.0)))
    before = params(loop)
    row = await loop.run_step(0)
    assert row.values["trained"] == 0.0 and row.values["zero_variance_groups"] == 2
    assert row.values["all_solved_groups"] == 2
    assert loop.backend.weight_version == 0 and same(before, params(loop))
    assert "loss" not in row.values


async def test_zero_variance_groups_are_replaced_when_oversampling(tmp_path: Path, tiny: Path) -> None:
    # p0, p1 ... are drawn in a seeded order; prompts with an even number solve in every rollout (no signal).
    def by_prompt(prompt: Prompt, slot: RolloutSlot) -> Outcome:
        return (TR.COMPLETED, 1.0) if int(prompt.id[1:]) % 2 == 0 else alternate(prompt, slot)

    rollouts = ScriptedRollouts(by_prompt)
    loop = make_loop(tmp_path, tiny, rollouts, oversample_zero_variance=True, batch_size=2)
    row = await loop.run_step(0)
    replaced = [e for e in read_events(loop.run_dir.layout.events) if e.kind == "group_replaced"]
    assert row.values["replaced_groups"] == len(replaced) == row.values["zero_variance_groups"]
    assert replaced and all(int(e.prompt_id[1:]) % 2 == 0 for e in replaced)
    assert len(replaced) <= 2  # at most batch_size extra prompts
    assert len({p for p, _ in rollouts.calls}) == 2 + len(replaced)
    # a uniform group stays in training only once the spare budget is spent
    assert row.values["all_solved_groups"] == row.values["zero_variance_groups"] - len(replaced)
    assert row.values["trained"] == 1.0


async def test_oversampling_budget_is_bounded(tmp_path: Path, tiny: Path) -> None:
    rollouts = ScriptedRollouts(lambda p, s: (TR.COMPLETED, 0.0))
    loop = make_loop(tmp_path, tiny, rollouts, oversample_zero_variance=True, batch_size=2)
    row = await loop.run_step(0)
    assert row.values["replaced_groups"] == 2 and row.values["zero_variance_groups"] == 4
    assert len({p for p, _ in rollouts.calls}) == 4  # 2 prompts + 2 replacements, then it stops
    assert row.values["trained"] == 0.0
    # the step's report covers every rollout sampled, replaced groups included
    assert row.values["rollouts"] == 16 and row.terminations == {TR.COMPLETED: 16}


async def test_every_rollout_failing_is_an_error_naming_the_reason(tmp_path: Path, tiny: Path) -> None:
    loop = make_loop(tmp_path, tiny, ScriptedRollouts(lambda p, s: (TR.ENGINE_ERROR, None)), max_refills=1)
    with pytest.raises(TrainingError, match=r"every rollout failed.*engine_error.*engine gone.*engine alive"):
        await loop.run()
    finished = [e for e in read_events(loop.run_dir.layout.events) if e.kind == "training_finished"]
    assert finished[-1].status == "failed"


async def test_global_batch_size_splits_optimizer_steps(tmp_path: Path, tiny: Path) -> None:
    loop = make_loop(tmp_path, tiny, ScriptedRollouts(alternate), global_batch_size=4)
    row = await loop.run_step(0)
    assert row.values["optimizer_steps"] == 2 and loop.backend.weight_version == 2


def test_group_of_one_is_refused(tmp_path: Path, tiny: Path) -> None:
    with pytest.raises(ConfigError, match="samples_per_prompt must be at least 2"):
        make_loop(tmp_path, tiny, ScriptedRollouts(alternate), samples_per_prompt=1)


async def test_checkpoint_resume_continues_with_the_same_prompts(tmp_path: Path, tiny: Path) -> None:
    straight = ScriptedRollouts(alternate)
    ref = make_loop(tmp_path, tiny, straight, name="straight", num_rollout=4)
    assert await ref.run() == "completed"

    first = ScriptedRollouts(alternate)
    a = make_loop(tmp_path, tiny, first, name="resumed", num_rollout=2, checkpoint_every=2)
    assert await a.run() == "completed"
    a.run_dir.close()
    assert (a.run_dir.layout.checkpoints / "latest").read_text().strip() == "step-000001"
    second = ScriptedRollouts(alternate)
    b = make_loop(tmp_path, tiny, second, name="resumed", num_rollout=4, resume=True, resume_index=1)
    assert b.resume() == 1 and b.next_step == 2 and b.backend.weight_version == 2
    assert await b.run() == "completed"
    prompts_of = lambda calls: [p for p, s in calls]  # noqa: E731
    assert prompts_of(first.calls) + prompts_of(second.calls) == prompts_of(straight.calls)
    assert all(s.rollout_id.startswith("r1-") for _, s in second.calls)  # artifact names never reused
    # Same data, same SGD, same shapes and kernels in one process: the weights agree to rounding of the last
    # update at most (a lost or repeated step moves them by ~lr = 1e-3).
    for k, v in params(ref).items():
        torch.testing.assert_close(params(b)[k], v, rtol=1e-5, atol=1e-6)


async def test_stop_abandons_the_step_in_flight_and_checkpoints_the_last_completed(tmp_path: Path,
                                                                                   tiny: Path) -> None:
    hold = asyncio.Event()
    reached = asyncio.Event()
    cancelled: list[str] = []

    class Holding(ScriptedRollouts):
        async def __call__(self, prompt: Prompt, slot: RolloutSlot) -> RolloutResult:
            if slot.group_index >= 2:  # groups 0, 1 are step 0's batch; later ones never finish on their own
                reached.set()
                try:
                    await hold.wait()
                except asyncio.CancelledError:
                    cancelled.append(slot.rollout_id)
                    raise
            return await super().__call__(prompt, slot)

    loop = make_loop(tmp_path, tiny, Holding(alternate), num_rollout=5)
    task = asyncio.create_task(loop.run())
    await asyncio.wait_for(reached.wait(), 60)
    loop.request_stop()
    assert await asyncio.wait_for(task, 60) == "stopped"
    assert loop.backend.weight_version == 1  # step 1 trained nothing
    assert (loop.run_dir.layout.checkpoints / "latest").read_text().strip() == "step-000000"
    events = read_events(loop.run_dir.layout.events)
    assert events[-1].kind == "training_finished" and events[-1].status == "stopped"
    assert events[-1].steps_done == 1
    assert [e.step for e in events if e.kind == "step_finished"] == [0]
    # Both sides stopped: every held rollout was cancelled (and said so) before run() returned.
    stopped = sorted(e.rollout_id for e in events if e.kind == "rollout_cancelled")
    assert stopped and stopped == sorted(cancelled)
    assert all(e.reason == "stopped" for e in events if e.kind == "rollout_cancelled")
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []


async def test_a_second_signal_during_the_cleanup_still_leaves_the_checkpoint(tmp_path: Path,
                                                                              tiny: Path) -> None:
    """Ctrl-C, then Ctrl-C again while the cancelled rollouts are still cleaning up (a sandbox takes its time
    to go): the second one cancels ``run()`` at once, and the checkpoint of the last completed step is already
    there, so the resume continues from it instead of from the initial weights."""
    reached = asyncio.Event()
    cleaning = asyncio.Event()

    class SlowCleanup(ScriptedRollouts):
        async def __call__(self, prompt: Prompt, slot: RolloutSlot) -> RolloutResult:
            if slot.group_index >= 2:  # step 0's batch finishes; later rollouts hang, then clean up slowly
                reached.set()
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    cleaning.set()
                    await asyncio.sleep(3600)  # the cleanup the second signal interrupts
                    raise
            return await super().__call__(prompt, slot)

    loop = make_loop(tmp_path, tiny, SlowCleanup(alternate), num_rollout=5)
    task = asyncio.create_task(loop.run())
    await asyncio.wait_for(reached.wait(), 60)
    loop.request_stop()  # the first signal
    await asyncio.wait_for(cleaning.wait(), 60)
    task.cancel()  # the second signal (train_cmd._drive cancels the session's task)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 60)
    assert (loop.run_dir.layout.checkpoints / "latest").read_text().strip() == "step-000000"
    loop.run_dir.close()
    again = make_loop(tmp_path, tiny, ScriptedRollouts(alternate), resume=True, resume_index=1)
    assert again.resume() == 0 and again.next_step == 1


async def test_evaluation_reports_pass_at_1_over_k_samples(tmp_path: Path, tiny: Path) -> None:
    def graded(prompt: Prompt, slot: RolloutSlot) -> Outcome:
        if slot.rollout_id.startswith("eval"):
            # e0 solved by 3 of 4 samples, e1 by none
            return TR.COMPLETED, float(prompt.id == "e0" and slot.index < 3)
        return alternate(prompt, slot)

    held_out = [Prompt("e0", {}), Prompt("e1", {})]
    loop = make_loop(tmp_path, tiny, ScriptedRollouts(graded), eval_prompts=held_out, eval_every=1,
                     eval_samples=4, num_rollout=1)
    await loop.run()
    [ev] = [e for e in read_events(loop.run_dir.layout.events) if e.kind == "eval_finished"]
    assert ev.pass_at_1 == pytest.approx((0.75 + 0.0) / 2) and ev.rows == 2 and ev.samples_per_row == 4
    # The step's metrics row holds the evaluation of the policy it trained (so TensorBoard and W&B plot it).
    [row] = list(follow_metrics(loop.run_dir.layout.metrics).read())
    assert (mc.read(row.values, mc.EVAL_PASS_AT_1), mc.read(row.values, mc.EVAL_REWARD_MEAN),
            mc.read(row.values, mc.EVAL_ROWS), mc.read(row.values, mc.EVAL_INFRASTRUCTURE_FAILURES)) == (
        ev.pass_at_1, ev.reward_mean, 2.0, 0.0)
    kinds = [e.kind for e in read_events(loop.run_dir.layout.events)]
    assert kinds.index("step_finished") < kinds.index("eval_finished")


def test_eval_every_without_held_out_rows_is_refused(tmp_path: Path, tiny: Path) -> None:
    with pytest.raises(ConfigError, match="train.eval_data"):
        make_loop(tmp_path, tiny, ScriptedRollouts(alternate), eval_every=1)


# -- asynchronous runs (rollout.max_staleness = 1, the default) -------------------------------------


async def test_async_run_refills_an_infrastructure_failure_and_trains_its_group(tmp_path: Path, tiny: Path) -> None:
    def flaky(prompt: Prompt, slot: RolloutSlot) -> Outcome:
        if slot.group_index == 1 and slot.index == 2 and slot.attempt == 0:
            return TR.SANDBOX_SETUP, None
        return alternate(prompt, slot)

    loop = make_loop(tmp_path, tiny, ScriptedRollouts(flaky), num_rollout=3, max_staleness=1)
    assert await loop.run() == "completed"
    events = read_events(loop.run_dir.layout.events)
    [refill] = [e for e in events if e.kind == "rollout_refilled"]
    assert refill.failed_rollout_id.endswith("-2") and refill.new_rollout_id == refill.failed_rollout_id + "-refill1"
    [batch] = [e for e in events if e.kind == "batch_taken" and refill.new_rollout_id in e.rollout_ids]
    assert refill.failed_rollout_id not in batch.rollout_ids and len(batch.rollout_ids) == 8
    row = [r for r in follow_metrics(loop.run_dir.layout.metrics).read() if r.step == batch.step][0]
    assert row.values["refills"] == 1 and row.values["admitted_rollouts"] == 8 and row.values["trained"] == 1.0
    # Later steps trained rollouts started one policy earlier: the overlap happened, within the bound.
    lags = [e.step - p for e in events if e.kind == "batch_taken" for p in e.started_policies]
    assert max(lags) == 1 and all(0 <= x <= 1 for x in lags)
    last = list(follow_metrics(loop.run_dir.layout.metrics).read())[-1]
    assert last.values["policy_lag_max"] == 1.0 and last.values["stale_groups"] == 0.0
    assert 0.0 <= last.values["slots_idle_fraction"] <= 1.0 and last.values["tokens_age/1"] == 16


def test_lego_train_is_asynchronous_by_default_with_staleness_1() -> None:
    from lego_rl.compose.projection import loop_settings
    from lego_rl.config.resolve import resolve

    s = loop_settings(resolve(environ={}).config)
    assert s.max_staleness == 1 and s.partial_rollouts == "off"


class CrashOnTrainStep:
    """TEST DOUBLE around the real ``TorchBackend``: its ``crash_at``-th ``train_step`` raises, as a trainer
    process dying mid-step would end the run (everything else is the real backend)."""

    def __init__(self, inner: TorchBackend, crash_at: int) -> None:
        self.inner = inner
        self.crash_at = crash_at
        self.calls = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    @property
    def weight_version(self) -> int:
        return self.inner.weight_version

    def train_step(self, *args: object, **kwargs: object) -> object:
        self.calls += 1
        if self.calls == self.crash_at:
            raise RuntimeError("the trainer died mid-step")
        return self.inner.train_step(*args, **kwargs)  # type: ignore[arg-type]


async def test_trainer_crash_mid_step_resumes_from_the_checkpoint_training_no_rollout_twice(
        tmp_path: Path, tiny: Path) -> None:
    a = make_loop(tmp_path, tiny, ScriptedRollouts(alternate), name="crash", num_rollout=4, checkpoint_every=1,
                  max_staleness=1)
    a.backend = CrashOnTrainStep(a.backend, crash_at=3)  # type: ignore[assignment]  # step 2 dies
    with pytest.raises(RuntimeError, match="died mid-step"):
        await a.run()
    a.run_dir.close()
    assert (a.run_dir.layout.checkpoints / "latest").read_text().strip() == "step-000001"
    b = make_loop(tmp_path, tiny, ScriptedRollouts(alternate), name="crash", num_rollout=4, resume=True,
                  resume_index=1, max_staleness=1)
    assert b.resume() == 1 and b.backend.weight_version == 2
    assert await b.run() == "completed"
    assert b.backend.weight_version == 4
    events = read_events(b.run_dir.layout.events)
    assert [e.step for e in events if e.kind == "step_finished"] == [0, 1, 2, 3]
    batches = [e for e in events if e.kind == "batch_taken"]
    assert [e.step for e in batches] == [0, 1, 2, 2, 3]  # step 2's first batch died with the trainer
    trained = [rid for e in batches[:2] + batches[3:] for rid in e.rollout_ids]
    assert len(trained) == len(set(trained)) == 4 * 8
    assert all(rid.startswith("r1-") for e in batches[3:] for rid in e.rollout_ids)
    # The prompts drawn but not trained before the crash were drawn again first: none skipped.
    assert set(batches[2].prompt_ids) == set(batches[3].prompt_ids)
    assert [e.status for e in events if e.kind == "training_finished"] == ["failed", "completed"]


class CrossingRollouts(ScriptedRollouts):
    """TEST DOUBLE: ``ScriptedRollouts`` whose two sampled tokens are two turns recorded as a rollout that
    crossed a weight update records them: the first turn on the version before the engines' current one, the
    second on the current one (``version_now``, read when the rollout runs)."""

    def __init__(self, decide: Callable[[Prompt, RolloutSlot], Outcome], version_now: Callable[[], int]) -> None:
        super().__init__(decide)
        self.version_now = version_now

    async def __call__(self, prompt: Prompt, slot: RolloutSlot) -> RolloutResult:
        result = await super().__call__(prompt, slot)
        v = self.version_now()
        spans = [TurnSpan(turn=0, start=3, end=4, render_mode="bridged"),
                 TurnSpan(turn=1, start=4, end=5, render_mode="bridged")]
        result.samples = [s.model_copy(update={"weight_versions": [-1, -1, -1, max(v - 1, 0), v], "turn_spans": spans})
                          for s in result.samples]
        return result


@pytest.mark.parametrize("policy", ["keep", "drop"])
async def test_partial_rollouts_train_or_mask_the_tokens_older_than_the_bound(tmp_path: Path, tiny: Path,
                                                                              policy: str) -> None:
    holder: list[TrainLoop] = []
    rollouts = CrossingRollouts(alternate, lambda: holder[0].backend.weight_version)
    loop = make_loop(tmp_path, tiny, rollouts, max_staleness=0, partial_rollouts=policy)
    holder.append(loop)
    await loop.run_step(0)  # version 0 -> 1; step 1's rollouts sample their first turn on 0, second on 1
    row = await loop.run_step(1)
    assert row.values["tokens_age/0"] == 8 and row.values["tokens_age/1"] == 8  # as sampled, before masking
    assert row.values["rollouts_crossed_version"] == 8 and row.values["turns_crossed_version"] == 8
    if policy == "drop":
        assert row.values["tokens_dropped_stale"] == 8 and row.values["tokens"] == 8  # only the fresh turn
    else:
        assert "tokens_dropped_stale" not in row.values and row.values["tokens"] == 16


async def test_zero_variance_groups_per_task_are_counted_and_retire_the_task(tmp_path: Path, tiny: Path) -> None:
    """p0 is always solved: after 2 of its groups in a row it is retired and never drawn again (synchronous, so
    nothing is drawn ahead of the step that retires it); the counts are in every row and survive a resume."""
    drawn_retired: list[str] = []
    loop: TrainLoop | None = None

    def p0_solved(prompt: Prompt, slot: RolloutSlot) -> Outcome:
        assert loop is not None
        if prompt.id in loop.signal.retired:
            drawn_retired.append(slot.rollout_id)
        return (TR.COMPLETED, 1.0) if prompt.id == "p0" else alternate(prompt, slot)

    # 3 of the 6 prompts a step: each is drawn once in every 2 steps (an epoch), so p0 is retired by step 3 and
    # steps 4-5 (a whole epoch) would draw it again
    class Logged(ScriptedRollouts):
        """The TEST DOUBLE logging its rollouts as the environment rollouts of `lego train` do, for the monitor."""

        async def __call__(self, prompt: Prompt, slot: RolloutSlot) -> RolloutResult:
            assert loop is not None
            loop.run_dir.events.emit(RolloutStarted(rollout_id=slot.rollout_id, instance_id=prompt.id,
                                                    harness="scripted"))
            result = await super().__call__(prompt, slot)
            loop.run_dir.events.emit(RolloutFinished(rollout_id=slot.rollout_id, termination=result.termination,
                                                     reward=result.reward, infrastructure_failure=False))
            return result

    loop = make_loop(tmp_path, tiny, Logged(p0_solved), name="retire", num_rollout=6, max_staleness=0,
                     batch_size=3, retire_zero_variance_after=2, checkpoint_every=6)
    assert await loop.run() == "completed"
    loop.run_dir.close()
    # lego monitor / lego report read it from the run directory: p0 stopped carrying signal and was retired
    state = RunState(loop.run_dir.root)
    state.refresh()
    tasks = build(state, now=time.time(), kl_warn=1e-3).tasks
    assert tasks is not None and tasks.retired == ["p0"] and tasks.stopped_signal == 1
    by_id = {t.instance_id: t for t in tasks.tasks}
    assert (by_id["p0"].zero_variance_streak, by_id["p0"].retired) == (2, True)
    assert all(t.zero_variance_streak == 0 and not t.retired for i, t in by_id.items() if i != "p0")
    view = tasks_view(build(state, now=time.time(), kl_warn=1e-3), 120, 20, 0).plain.splitlines()
    assert "1 stopped carrying signal" in view[1] and "1 retired" in view[1]
    [p0_line] = [line for line in view if line.startswith("p0 ")]
    assert p0_line.endswith("∅×2 retired")
    rows = list(follow_metrics(loop.run_dir.layout.metrics).read())
    streak = [r.zero_variance_tasks.get("p0") for r in rows if "p0" in r.zero_variance_tasks]
    assert streak == [1, 2]  # its two groups, then never again
    assert all(set(r.zero_variance_tasks) <= {"p0"} for r in rows)  # the others always carry signal
    [retiring] = [r for r in rows if r.retired_tasks]
    assert retiring.retired_tasks == ["p0"] and retiring.zero_variance_tasks == {"p0": 2}
    assert [r.values["tasks_retired"] for r in rows] == [float(r.step >= retiring.step) for r in rows]
    assert drawn_retired == [] and loop.signal.retired == ["p0"]

    resumed = make_loop(tmp_path, tiny, Logged(p0_solved), name="retire", num_rollout=8,
                        max_staleness=0, batch_size=3, retire_zero_variance_after=2, resume=True, resume_index=1)
    loop = resumed
    assert resumed.resume() == 5 and resumed.signal.retired == ["p0"] and resumed.stream.retired == {"p0"}
    assert await resumed.run() == "completed" and drawn_retired == []


async def test_zero_advantage_control_trains_the_same_steps_on_zero_advantages(tmp_path: Path,
                                                                              tiny: Path) -> None:
    """``control = "zero_advantage"``: a batch with signal still takes its optimizer step (the same decision
    as training: trained = 1, a new weight version, a sync), but the loss sees every advantage as 0, so
    with no KL and no weight decay (make_loop) the parameters do not move (AdamW's update of a zero
    gradient is 0); the same batch in a training run moves them. The rows and the events say the run is a
    control."""
    control = make_loop(tmp_path, tiny, ScriptedRollouts(alternate), name="control", control="zero_advantage")
    before = params(control)
    row = await control.run_step(0)
    assert row.values["trained"] == 1.0 and control.backend.weight_version == 1
    assert row.values["control_zero_advantage"] == 1.0 and row.values["grad_norm"] == 0.0
    assert row.values["zero_advantage_groups"] == 0.0  # the real advantages had signal: it is the control's
    assert same(before, params(control))
    control.run_dir.close()
    kinds = [(e.kind, getattr(e, "step", None)) for e in read_events(control.run_dir.layout.events)]
    assert kinds[:2] == [("run_started", None), ("control_arm", 0)], kinds

    grpo = make_loop(tmp_path, tiny, ScriptedRollouts(alternate), name="grpo")
    row = await grpo.run_step(0)
    assert "control_zero_advantage" not in row.values and row.values["grad_norm"] > 0.0
    assert not same(before, params(grpo))
    grpo.run_dir.close()
    assert "control_arm" not in {e.kind for e in read_events(grpo.run_dir.layout.events)}
