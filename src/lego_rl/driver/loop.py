"""The training loop: rollouts → admission → GRPO advantages → packing → train → sync, steps overlapped.

The rollouts come from a ``RolloutScheduler`` (``driver.scheduler``): ``rollout.concurrency`` slots
kept busy while the trainer works, the groups of a step started at most ``rollout.max_staleness`` policies
before the step trains them (0: the synchronous loop, through the same code). One step (``run``):

1. take ``rollout.batch_size`` complete groups of ``rollout.samples_per_prompt`` rollouts from the
   scheduler (waiting for them if they are not ready). Infrastructure failures were refilled per sample
   slot (``train.max_refills``); with ``train.oversample_zero_variance`` uniform-reward groups were
   replaced by fresh prompts (at most ``batch_size`` per step); groups too old for this step were cancelled;
2. ``admit`` (``train.infra_failure_policy``), ``grpo_advantages`` over distinct rollouts per group;
3. when some advantage is non-zero: ``plan_steps`` into optimizer steps of ``train.global_batch_size``
   rollouts and micro-batches of ``train.micro_batch_tokens`` tokens; old logprobs for *all* of them
   are computed before the first update (the PPO ratio's base is the trainer's policy at the start of the
   step; the rollout's own per-token logprobs, whatever version sampled each token, are the behaviour
   policy of the TIS/MIS correction), then ``backend.train_step`` per optimizer step. When every advantage
   is zero nothing is trained: the parameters (and the weight version) stay exactly as they were. A control
   arm (``control = "zero_advantage"``) trains the same steps with every advantage replaced by 0;
4. weight sync (the ``WeightSyncFn`` hook) when the weights changed, with rollouts still in flight (the
   sync decides what happens to their requests: ``driver.weight_sync``); the scheduler then serves
   groups on the new policy;
5. a ``StepMetrics`` row and ``step_finished`` event; a checkpoint every ``train.checkpoint_every``
   steps; held-out pass@1 every ``train.eval_every`` steps.

Stopping: ``request_stop()`` (the CLI calls it on Ctrl-C / SIGTERM) abandons the batch being waited for,
saves a checkpoint of the last *completed* step with the data cursor and the prompts drawn but not trained as
they were then (so a resume draws those prompts again first and trains no rollout twice), then cancels every
rollout in flight (each cleans up its sandbox and session). The checkpoint comes first so that a second
signal, which cancels the cleanup, still leaves it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from lego_rl.errors import ConfigError, LegoError
from lego_rl.driver.scheduler import (
    Group,
    Prompt,
    RolloutFn,
    RolloutScheduler,
    RolloutSlot,
    SchedulerSettings,
    StepRollouts,
)
from lego_rl.driver.task_signal import TaskSignal
from lego_rl.driver.weight_sync import WeightSync
from lego_rl.rollout.generate import RolloutResult
from lego_rl.runstore import RunDir, StepMetrics
from lego_rl.runstore import checkpoint_state as ckpt
from lego_rl.runstore import metric_catalog as mc
from lego_rl.runstore.checkpoint_state import DataCursor, RlState
from lego_rl.runstore.events import (
    ControlArm,
    EvalFinished,
    RolloutRefilled,
    StepFinished,
    StepStarted,
    TrainingFinished,
)
from lego_rl.train.advantages import (
    AdmissionPolicy,
    SamplelessOutcome,
    admission_policy,
    admit,
    grpo_advantages,
)
from lego_rl.train.backend import LossFn, TrainerBackend
from lego_rl.train.batching import OptimizerStep, plan_steps
from lego_rl.train.consistency import TokenKinds, consistency_report, micro_batch_kinds
from lego_rl.trajectory.sample import Sample


class TrainingError(LegoError):
    """The loop cannot go on (e.g. every rollout of a step failed: a dead engine). The message says why."""


__all__ = ["Group", "Prompt", "RolloutFn", "RolloutSlot", "StepRollouts"]  # re-exported: the loop's vocabulary

WeightSyncFn = Callable[[TrainerBackend, int], Awaitable[None]]
"""Push the backend's weights to the engines and label them with the given version."""


async def no_sync(backend: TrainerBackend, version: int) -> None:
    """For a run whose engine shares the trainer's parameters (or a test that samples nothing)."""


@dataclass(frozen=True)
class LoopSettings:
    """Everything the loop needs to know, projected once from the config by ``compose.projection.loop_settings``."""

    num_rollout: int
    batch_size: int
    samples_per_prompt: int
    micro_batch_tokens: int
    concurrency: int
    """Rollout slots: rollouts in flight at most (``rollout.concurrency``; its default is the config's)."""
    max_staleness: int
    """Policies a trained rollout may lag behind the step that trains it (0: synchronous;
    ``rollout.max_staleness``, whose one default is the config's)."""
    global_batch_size: int | None
    """Rollouts per optimizer step; None = every rollout of the step in one optimizer step."""
    # No defaults: every value comes from the config's projection (compose.projection.loop_settings), which
    # holds the one default of each quantity. Tests and benchmarks that build a loop by hand start from that
    # projection of a default config (tests/support/loop_settings.py) and override what they study.
    temperature: float
    top_p: float
    """The sampler's truncation: the trainer scores tokens under the same distribution (serving.protocol)."""
    top_k: int
    partial_rollouts: Literal["off", "keep", "drop"]
    """off: a rollout is as old as the policy it started on (stale ones cancelled); keep/drop: rollouts run on
    across updates, and their sampled tokens older than ``max_staleness`` policies are trained (keep) or
    masked out (drop)."""
    max_refills: int
    oversample_zero_variance: bool
    retire_zero_variance_after: int
    """Retire a task after this many zero-variance groups in a row (0: never; ``driver.task_signal``)."""
    checkpoint_every: int
    eval_every: int
    eval_samples: int
    infra_failure_policy: Literal["exclude", "zero_reward"]
    seed: int
    control: Literal["none", "zero_advantage"]
    """``zero_advantage``: the control arm (``train.control``). Which steps train is decided on the real
    advantages, as in training; the loss then sees them all as 0."""
    solved_reward: float = 1.0
    """The reward a solved rollout earns: graders give 0 or 1. Not a config key, so its one default is here."""

    def check(self, *, has_eval_rows: bool) -> None:
        """Refuse settings the loop cannot run (called before anything is started)."""
        if self.samples_per_prompt < 2:
            # One rollout per prompt is a group of one: GRPO's advantage is then always 0.
            raise ConfigError("rollout.samples_per_prompt must be at least 2 for GRPO (a group of one has no "
                              "baseline, so every advantage is 0)", parameter="rollout.samples_per_prompt",
                              value=self.samples_per_prompt)
        if self.eval_every and not has_eval_rows:
            raise ConfigError("train.eval_every is set but there are no held-out rows (train.eval_data)",
                              parameter="train.eval_data")

    @property
    def admission(self) -> AdmissionPolicy:
        return admission_policy(self.infra_failure_policy)


class PromptStream:
    """Prompts in a seeded order, reshuffled every epoch; the cursor is all a resume needs."""

    def __init__(self, prompts: Sequence[Prompt], *, seed: int, cursor: DataCursor | None = None) -> None:
        if not prompts:
            raise ConfigError("the training data has no rows", parameter="rollout.prompt_data")
        self.prompts = list(prompts)
        self.seed = seed
        self.cursor = cursor or DataCursor()
        self._order = self._shuffled(self.cursor.epoch)
        self.retired: set[str] = set()
        """Ids never drawn again (``TaskSignal`` keeps at least one prompt out of it)."""

    def _shuffled(self, epoch: int) -> list[int]:
        order = list(range(len(self.prompts)))
        random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def next(self) -> Prompt:
        if len(self.retired) >= len({p.id for p in self.prompts}):
            raise TrainingError("every task of the training data is retired: nothing left to draw")
        while True:
            if self.cursor.position >= len(self._order):
                self.cursor = DataCursor(epoch=self.cursor.epoch + 1, position=0)
                self._order = self._shuffled(self.cursor.epoch)
            prompt = self.prompts[self._order[self.cursor.position]]
            self.cursor = DataCursor(epoch=self.cursor.epoch, position=self.cursor.position + 1)
            if prompt.id not in self.retired:
                return prompt


@dataclass
class LoopProgress:
    """Live state for a progress view; the loop updates it in place (read it from the same event loop)."""

    step: int = 0
    total_steps: int = 0
    in_flight: int = 0
    rollouts_done: int = 0
    rollouts_planned: int = 0
    phase: str = "starting"
    last_reward: float | None = None
    last_solve_rate: float | None = None
    last_pass_at_1: float | None = None
    step_seconds: list[float] = field(default_factory=list)

    def eta_s(self) -> float | None:
        """Remaining steps × mean step time so far (None before the first step ends)."""
        if not self.step_seconds:
            return None
        mean = sum(self.step_seconds) / len(self.step_seconds)
        return max(self.total_steps - self.step, 0) * mean


@dataclass
class TrainOutcome:
    trained: bool
    metrics: dict[str, float]
    weight_version: int


@dataclass(frozen=True)
class _Trained:
    """One step's training and sync, as ``finish_step`` reports them."""

    outcome: TrainOutcome
    stats: dict[str, float]
    excluded: Counter[str]
    t_train: float
    t_sync: float


def eval_values(event: EvalFinished) -> dict[str, float]:
    """A held-out evaluation's figures as metric values (the numbers of its ``eval_finished`` event; no pass@1
    or reward where no held-out rollout was graded, which the event writes as 0)."""
    values: dict[str, float] = {mc.EVAL_ROWS: float(event.rows),
                                mc.EVAL_INFRASTRUCTURE_FAILURES: float(event.infrastructure_failures)}
    if event.rows:
        values |= {mc.EVAL_PASS_AT_1: event.pass_at_1, mc.EVAL_REWARD_MEAN: event.reward_mean}
    return values


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _tokenisation_values(sampled: Sequence[RolloutResult]) -> dict[str, float]:
    """The step's tokenisation health over its rollouts that built segments from turn records (none: no values)."""
    built = [r.trajectory for r in sampled if r.trajectory is not None]
    if not built:
        return {}
    segments = [float(t.segments_started) for t in built]
    return {
        mc.SEGMENTS_PER_ROLLOUT: sum(segments) / len(segments), mc.SEGMENTS_PER_ROLLOUT_MAX: max(segments),
        mc.FALSE_FORKS: float(sum(t.false_forks for t in built)),
        mc.REPEATED_PROMPT_TOKENS: float(sum(t.repeated_prompt_tokens for t in built)),
        mc.RENDER_FALLBACKS: float(sum(t.render_fallbacks for t in built)),
        mc.PARSE_FAILURES: float(sum(t.parse_failures for t in built)),
    }


class TrainLoop:
    """Drives ``backend`` with rollouts from ``rollout_fn``, writing everything to ``run``."""

    def __init__(
        self,
        settings: LoopSettings,
        *,
        backend: TrainerBackend,
        loss_fn: LossFn,
        rollout_fn: RolloutFn,
        prompts: Sequence[Prompt],
        run: RunDir,
        sync: WeightSyncFn = no_sync,
        eval_prompts: Sequence[Prompt] = (),
        resume_index: int = 0,
    ) -> None:
        settings.check(has_eval_rows=bool(eval_prompts))
        self.s = settings
        self.backend = backend
        self.loss_fn = loss_fn
        self.rollout_fn = rollout_fn
        self.run_dir = run
        self.sync = sync
        self.eval_prompts = list(eval_prompts)
        self.stream = PromptStream(prompts, seed=settings.seed)
        self.signal = TaskSignal([p.id for p in self.stream.prompts], retire_after=settings.retire_zero_variance_after)
        self.admission = settings.admission
        self.progress = LoopProgress(total_steps=settings.num_rollout)
        self.next_step = 0
        # Rollout ids name artifact folders, which are never reused: a resumed run tags its ids.
        self._tag = f"r{resume_index}-" if resume_index else ""
        self._gate = asyncio.Semaphore(settings.concurrency)
        self._stop = asyncio.Event()
        self._committed = DataCursor()
        self._committed_pending: list[str] = []
        """Ids of prompts drawn but not trained when the last completed step ended (launched groups)."""
        self._redo: list[Prompt] = []
        """Prompts a resumed run draws first: those its checkpoint had drawn but not trained."""
        self._resumed = False
        self._control_announced = False
        self._last_checkpoint_step: int | None = None
        self._policy_of_version: dict[int, int] = {}
        """Engine weight version -> the policy (step index) it was first served for: a token's age is the
        training step minus this."""

    # -- checkpoints --------------------------------------------------------------------------------

    def save_checkpoint(self, step: int) -> Path:
        """Checkpoint after ``step`` (the last completed one) with the cursor as that step left it."""
        state = RlState(step=step, seed=self.s.seed, cursor=self._committed, pending=list(self._committed_pending),
                        task_signal=self.signal.state())
        path = ckpt.save_checkpoint(self.run_dir, self.backend, state)
        self._last_checkpoint_step = step
        return path

    def resume(self) -> int | None:
        """Load the newest checkpoint of the run directory; the step it holds (None: nothing saved). The rows
        of later steps are set aside: they are not this run's any more."""
        by_id = {p.id: p for p in self.stream.prompts}

        def known_prompts(state: RlState, path: Path) -> None:
            unknown = [x for x in state.pending if x not in by_id]
            if unknown:
                raise ConfigError(f"checkpoint {path} names prompts the training data no longer has: {unknown[:5]}; "
                                  "resume with the data the run started with", parameter="rollout.prompt_data")

        state = ckpt.resume_checkpoint(self.run_dir, self.backend, RlState, seed=self.s.seed, check=known_prompts)
        if state is None:
            return None
        self.stream = PromptStream(self.stream.prompts, seed=self.s.seed, cursor=state.cursor)
        self.signal.load(state.task_signal)
        self.stream.retired = set(self.signal.retired)
        self._committed = state.cursor
        self._committed_pending = list(state.pending)
        self._redo = [by_id[x] for x in state.pending]
        self._resumed = True
        self._last_checkpoint_step = state.step
        self.next_step = state.step + 1
        self.progress.step = self.next_step
        return state.step

    # -- rollouts -----------------------------------------------------------------------------------

    async def _one(self, prompt: Prompt, slot: RolloutSlot) -> RolloutResult:
        async with self._gate:
            self.progress.in_flight += 1
            try:
                return await self.rollout_fn(prompt, slot)
            finally:
                self.progress.in_flight -= 1
                self.progress.rollouts_done += 1

    async def _slot(self, step: int, prompt: Prompt, base_id: str, group_index: int, index: int,
                    counts: Counter[str]) -> RolloutResult:
        """One sample slot, refilled while it fails for a reason admission excludes."""
        attempt = 0
        result = await self._one(prompt, RolloutSlot(base_id, group_index, index, 0))
        while result.termination in self.admission.excluded and attempt < self.s.max_refills:
            attempt += 1
            new_id = f"{base_id}-refill{attempt}"
            self.run_dir.events.emit(RolloutRefilled(step=step, failed_rollout_id=result.rollout_id,
                                                     new_rollout_id=new_id, termination=result.termination,
                                                     attempt=attempt))
            counts["refills"] += 1
            self.progress.rollouts_planned += 1
            result = await self._one(prompt, RolloutSlot(new_id, group_index, index, attempt))
        return result

    async def _group(self, step: int, prompt: Prompt, group_index: int, counts: Counter[str],
                     *, kind: str = "s", samples: int | None = None) -> Group:
        n = samples or self.s.samples_per_prompt
        self.progress.rollouts_planned += n
        base = f"{self._tag}{kind}{step:05d}-g{group_index}-{prompt.id}"
        results = await asyncio.gather(*(
            self._slot(step, prompt, f"{base}-{i}", group_index, i, counts) for i in range(n)))
        return Group(prompt, group_index, list(results))

    async def _counted(self, prompt: Prompt, slot: RolloutSlot) -> RolloutResult:
        """The rollout function as the scheduler calls it, counted in the progress view: toward the step waiting
        for its batch; one that ends while a step trains counts for the next step, which recounts at its start
        (``_step_started``). Capped at the batch: a failed attempt and its refill fill one slot."""
        self.progress.in_flight += 1
        try:
            return await self.rollout_fn(prompt, slot)
        finally:
            self.progress.in_flight -= 1
            p = self.progress
            if p.phase == "rollout":
                p.rollouts_done = min(p.rollouts_done + 1, p.rollouts_planned)

    def scheduler(self, *, first_step: int, end_step: int) -> RolloutScheduler:
        """A scheduler for steps ``first_step`` .. ``end_step - 1`` (drawing from this loop's prompt stream)."""
        s = self.s
        redo, self._redo = self._redo, []
        return RolloutScheduler(
            SchedulerSettings(batch_size=s.batch_size, samples_per_prompt=s.samples_per_prompt, slots=s.concurrency,
                              max_staleness=s.max_staleness, max_refills=s.max_refills,
                              replace_zero_variance=s.oversample_zero_variance, admission=self.admission,
                              partial=s.partial_rollouts != "off"),
            rollout_fn=self._counted, draw=self.stream.next, emit=self.run_dir.events.emit,
            policy=first_step, next_step=first_step, end_step=end_step, id_prefix=self._tag, redo=redo)

    def _token_policy(self, version: int, started: int) -> int:
        """The policy a sampled token came from: its weight version's, or (version unknown) the rollout's start."""
        return self._policy_of_version.get(version, started)

    def _drop_stale_tokens(self, step: int, groups: Sequence[Group]) -> int:
        """``partial_rollouts = "drop"``: mask out (loss mask 0) every sampled token older than ``max_staleness``
        policies, in place in the groups' results. Returns how many tokens were masked."""
        dropped = 0
        for g in groups:
            started = g.policies
            for k, r in enumerate(g.results):
                new_samples = []
                for smp in r.samples:
                    if not smp.weight_versions:
                        new_samples.append(smp)
                        continue
                    mask = [0 if m and step - self._token_policy(v, started.get(r.rollout_id, step)) > self.s.max_staleness
                            else m for m, v in zip(smp.loss_mask, smp.weight_versions, strict=True)]
                    dropped += sum(smp.loss_mask) - sum(mask)
                    new_samples.append(smp.model_copy(update={"loss_mask": mask}) if mask != smp.loss_mask else smp)
                g.results[k] = dataclasses.replace(r, samples=new_samples)
        return dropped

    def _commit(self, sched: RolloutScheduler | None) -> None:
        """The data state a checkpoint of the step just completed holds: the cursor and, read at the same
        instant, the prompts drawn but not trained (a resume draws those first)."""
        self._committed = self.stream.cursor
        self._committed_pending = [p.id for p in sched.pending_prompts()] if sched is not None else []

    # -- training -----------------------------------------------------------------------------------

    def train_on(self, results: Sequence[RolloutResult]) -> tuple[TrainOutcome, dict[str, float], Counter[str]]:
        """Admission, advantages, packing and the optimizer steps over one batch of finished rollouts.

        Returns the training outcome, the rollout statistics and excluded counts per reason.
        """
        samples: list[Sample] = [s for r in results for s in r.samples]
        admitted, report = admit(samples, self.admission)
        # Admitted rollouts with no trainable token still count in their group's mean and std.
        trained_tokens: Counter[str] = Counter()
        for s in admitted:
            trained_tokens[s.rollout_id] += s.num_trained_tokens
        with_samples = {s.rollout_id for s in admitted}
        sampleless = []
        for r in results:
            if r.termination in self.admission.excluded:
                continue
            if r.rollout_id not in with_samples or trained_tokens[r.rollout_id] == 0:
                reward = 0.0 if r.termination in self.admission.zero_reward else r.reward
                if reward is None:
                    continue  # admit() raises for a sampled rollout without reward; a sampleless one just leaves
                sampleless.append(SamplelessOutcome(rollout_id=r.rollout_id, group_index=r.group_index,
                                                    reward=reward))
        trainable = [s for s in admitted if trained_tokens[s.rollout_id] > 0]
        adv = grpo_advantages(trainable, sampleless=sampleless, solved_reward=self.s.solved_reward)
        stats: dict[str, float] = {
            mc.ZERO_ADVANTAGE_GROUPS: float(adv.stats.uniform_groups),
            mc.ALL_SOLVED_GROUPS: float(adv.stats.all_solved_groups),
            mc.ALL_FAILED_GROUPS: float(adv.stats.all_failed_groups),
            # admit() sees only rollouts with samples; one that failed before sampling is admitted too
            # (with reward 0) under infra_failure_policy = "zero_reward".
            mc.ADMITTED_ROLLOUTS: float(sum(1 for r in results if r.termination not in self.admission.excluded)),
        }
        excluded = Counter(report.excluded_rollouts)
        # Excluded rollouts without samples never reach admit(): count them from the results.
        seen = {s.rollout_id for s in samples}
        for r in results:
            if r.rollout_id not in seen and r.termination in self.admission.excluded:
                excluded[r.termination.value] += 1
        version = self.backend.weight_version
        if not trainable or not any(a != 0.0 for a in adv.per_sample):
            return TrainOutcome(False, {}, version), stats, excluded
        n_rollouts = len({s.rollout_id for s in trainable})
        per_step = self.s.global_batch_size or n_rollouts
        num_steps = max(1, min(n_rollouts, round(n_rollouts / per_step)))
        advantages = adv.per_sample.tolist()  # [N_samples]
        if self.s.control == "zero_advantage":
            # The control arm: the step trains exactly when the real run would (decided above), on zeros.
            advantages = [0.0] * len(advantages)  # [N_samples]
        steps = plan_steps(trainable, advantages, num_steps=num_steps,
                           max_tokens_per_micro_batch=self.s.micro_batch_tokens)
        # The ratio's base is the policy that sampled this batch: every optimizer step's old logprobs are
        # taken before the first update.
        old = [self.backend.compute_logprobs(st.micro_batches, temperature=self.s.temperature, top_p=self.s.top_p,
                                              top_k=self.s.top_k) for st in steps]
        consistency = self._consistency(steps, old, trainable)
        sums: dict[str, float] = defaultdict(float)
        last: dict[str, float] = {}
        for st, old_lp in zip(steps, old, strict=True):
            res = self.backend.train_step(st, self.loss_fn, old_logprobs=old_lp, temperature=self.s.temperature,
                                          top_p=self.s.top_p, top_k=self.s.top_k)
            for k, v in res.metrics.items():
                if not math.isfinite(v):
                    raise TrainingError(f"optimizer step produced a non-finite {k} = {v}; the run stops here "
                                        "(lower train.lr or check the data)")
                sums[k] += v
                last[k] = v
            version = res.weight_version
        metrics = {k: v / len(steps) for k, v in sums.items()}
        # Averaged over optimizer steps, except the learning rate (the last one's) and the tokens (summed).
        if mc.LR in last:
            metrics[mc.LR] = last[mc.LR]
        if mc.TOKENS in sums:
            metrics[mc.TOKENS] = sums[mc.TOKENS]
        metrics[mc.OPTIMIZER_STEPS] = float(len(steps))
        metrics.update(consistency)
        return TrainOutcome(True, metrics, version), stats, excluded

    @staticmethod
    def _consistency(steps: list[OptimizerStep], old: list[list[torch.Tensor]],
                     samples: list[Sample]) -> dict[str, float]:
        """Rollout vs trainer logprobs of every trained token before the update, overall and by turn kind
        (bridged vs fully re-rendered, first vs later segments): a template drift shows in one kind only."""
        mbs = [mb for st in steps for mb in st.micro_batches]
        kinds = [micro_batch_kinds(mb, samples) for mb in mbs]
        report = consistency_report(
            torch.cat([mb.rollout_logprobs for mb in mbs]),  # [T_all]
            torch.cat([lp for step_old in old for lp in step_old]),  # [T_all]
            torch.cat([mb.loss_mask for mb in mbs]),  # [T_all]
            TokenKinds(bridged=torch.cat([k.bridged for k in kinds]), full=torch.cat([k.full for k in kinds]),
                       later_segment=torch.cat([k.later_segment for k in kinds])),
        )
        return {k: v for k, v in report.as_values().items() if math.isfinite(v)}

    # -- one step -----------------------------------------------------------------------------------

    async def run_step(self, step: int) -> StepMetrics:
        """One whole step on its own: its rollouts (nothing is started for a later step), training, sync and
        the metrics row. ``run()`` overlaps the steps instead."""
        self._announce_control(step)
        sched = self.scheduler(first_step=step, end_step=step + 1)
        sched.start()
        try:
            started = self._step_started(step, sched)
            rolled = await sched.take(step)
        finally:
            await sched.close()
        row = await self.finish_step(step, started, rolled)
        self.next_step = step + 1
        self._commit(None)
        return row

    def _announce_control(self, step: int) -> None:
        """A control arm says so in the run's events, once per launch, before its first step."""
        if self.s.control == "zero_advantage" and not self._control_announced:
            self._control_announced = True
            self.run_dir.events.emit(ControlArm(step=step, control=self.s.control))

    def _step_started(self, step: int, sched: RolloutScheduler) -> float:
        self.progress.step = step
        self.progress.phase = "rollout"
        self.progress.rollouts_planned = self.s.batch_size * self.s.samples_per_prompt
        # Rollouts of groups not trained yet may have finished during the previous step (the scheduler keeps
        # its slots busy across steps): they count toward this one, not from zero.
        self.progress.rollouts_done = min(sched.finished_rollouts(), self.progress.rollouts_planned)
        self.run_dir.events.emit(StepStarted(step=step, weight_version=self.backend.weight_version))
        self._policy_of_version.setdefault(self.backend.weight_version, step)
        return time.time()

    def _age_metrics(self, step: int, groups: Sequence[Group]) -> dict[str, float]:
        """How old what this step trains is, in policies: per rollout (the policy it started on) and per sampled
        token (the weight version that produced it, or the rollout's start where no version was recorded);
        rollouts whose tokens came from more than one version crossed a weight update."""
        lags = [step - p for g in groups for p in g.policies.values()]
        ages: Counter[int] = Counter()
        crossed = turns_crossed = 0
        for g in groups:
            for r in g.results:
                start = g.policies.get(r.rollout_id, step)
                versions: set[int] = set()
                turn_versions: list[int] = []
                for smp in r.samples:
                    for m, v in zip(smp.loss_mask, smp.weight_versions or [-1] * len(smp.loss_mask), strict=True):
                        if not m:
                            continue
                        versions.add(v)
                        ages[step - self._token_policy(v, start)] += 1
                    if smp.weight_versions:
                        turn_versions += [smp.weight_versions[t.start] for t in smp.turn_spans
                                          if t.end > t.start and smp.weight_versions[t.start] >= 0]
                # Turns sampled on newer weights than the rollout's first turn (a turn is never split: the
                # sync lets requests in flight finish on the old weights).
                first = min(turn_versions, default=0)
                turns_crossed += sum(1 for v in turn_versions if v > first)
                crossed += len(versions - {-1}) > 1
        out = {mc.TOKENS_AGE.key(k): float(n) for k, n in sorted(ages.items())}
        if lags:
            out |= {mc.POLICY_LAG_MEAN: sum(lags) / len(lags), mc.POLICY_LAG_MAX: float(max(lags))}
        out[mc.ROLLOUTS_CROSSED_VERSION] = float(crossed)
        out[mc.TURNS_CROSSED_VERSION] = float(turns_crossed)
        return out

    async def finish_step(self, step: int, started: float, rolled: StepRollouts, *, evaluate: bool = False,
                          synced: Callable[[], None] | None = None) -> StepMetrics:
        """Train on the step's rollouts, sync, write the row. Not to be cancelled halfway: the optimizer
        step runs in a worker thread that a cancellation would not stop. ``synced`` runs once the engines
        serve the new policy; with ``evaluate`` the held-out evaluation of that policy runs next, and its
        figures go into the step's row (a stop requested during it leaves them out)."""
        results = [r for g in rolled.groups for r in g.results]
        # The step's own count from here on (replaced groups too), not the slots' running total.
        self.progress.rollouts_done = self.progress.rollouts_planned = (
            len(results) + sum(len(g.results) for g in rolled.dropped))
        self._require_admissible(step, results)
        # The batch's ages as sampled, before the drop policy masks anything.
        ages = self._age_metrics(step, rolled.groups)
        if self.s.partial_rollouts == "drop":
            ages[mc.TOKENS_DROPPED_STALE] = float(self._drop_stale_tokens(step, rolled.groups))
            results = [r for g in rolled.groups for r in g.results]
        trained = await self._train_and_sync(step, results, ages)
        if synced is not None:
            synced()
        # What the policy did this step, replaced groups included (training saw only ``results``).
        sampled = results + [r for g in rolled.dropped for r in g.results]
        # Per task: zero-variance groups in a row (replaced groups too), and the tasks that retires.
        zero_tasks, retired_now = self.signal.observe([*rolled.groups, *rolled.dropped], self.admission)
        self.stream.retired.update(retired_now)
        values = self._step_values(rolled, sampled, trained, ages)
        finished_at = max(time.time(), started)
        self.run_dir.events.emit(StepFinished(
            step=step, admitted_rollouts=int(trained.stats[mc.ADMITTED_ROLLOUTS]),
            excluded_rollouts=dict(trained.excluded), zero_variance_groups=rolled.zero_variance_groups,
            trained=trained.outcome.trained, weight_version=trained.outcome.weight_version,
            reward_mean=values.get(mc.REWARD_MEAN)))
        if evaluate:
            stopped, event = await self._until_stopped(self.evaluate(step))
            if not stopped:
                values = {**values, **mc.declared_values(mc.TRAIN, eval_values(event))}
        row = StepMetrics(step=step, started_at=started, finished_at=finished_at, values=values,
                          terminations=dict(Counter(r.termination for r in sampled)),
                          zero_variance_tasks=zero_tasks, retired_tasks=retired_now)
        self.run_dir.metrics.append(row)
        self.progress.last_reward = values.get(mc.REWARD_MEAN)
        self.progress.last_solve_rate = values.get(mc.SOLVE_RATE)
        self.progress.step_seconds.append(values[mc.TIME_STEP_S])
        return row

    def _require_admissible(self, step: int, results: Sequence[RolloutResult]) -> None:
        """A step whose every rollout failed for an infrastructure reason cannot train: the engine is likely dead."""
        if any(r.termination not in self.admission.excluded for r in results):
            return
        reasons = Counter(r.termination.value for r in results)
        detail = next((r.detail for r in results if r.detail), "")
        raise TrainingError(f"step {step}: every rollout failed for an infrastructure reason ({dict(reasons)}"
                            f"{', last: ' + detail[:300] if detail else ''}); is the engine alive?")

    async def _train_and_sync(self, step: int, results: list[RolloutResult], ages: dict[str, float]) -> _Trained:
        """The optimizer step in a worker thread, then the new weights to the engines (``ages`` gets the sync's
        drain and staging times)."""
        self.progress.phase = "train"
        t1 = time.monotonic()
        outcome, stats, excluded = await asyncio.to_thread(self.train_on, results)
        t_train = time.monotonic() - t1
        t_sync = 0.0
        if outcome.trained:
            self.progress.phase = "sync"
            t2 = time.monotonic()
            await self.sync(self.backend, outcome.weight_version)
            t_sync = time.monotonic() - t2
            self._policy_of_version[outcome.weight_version] = step + 1
            if isinstance(self.sync, WeightSync) and self.sync.last is not None:
                # Of the sync: waiting for requests in flight (in_flight = wait) and staging the checkpoint.
                ages[mc.TIME_SYNC_DRAIN_S] = self.sync.last.drain_seconds
                ages[mc.TIME_SYNC_STAGE_S] = self.sync.last.stage_seconds
        return _Trained(outcome, stats, excluded, t_train, t_sync)

    def _step_values(self, rolled: StepRollouts, sampled: list[RolloutResult], trained: _Trained,
                     ages: dict[str, float]) -> dict[str, float]:
        """The step's metrics row values: training statistics, counts, timings, slot use, reward. Every name is a
        declaration of ``runstore.metric_catalog`` (an undeclared one is an ``UndeclaredMetric`` here)."""
        outcome, t_rollout = trained.outcome, rolled.wait_s
        values: dict[str, float] = {
            **trained.stats, **outcome.metrics,
            mc.TRAINED: float(outcome.trained), mc.WEIGHT_VERSION: float(outcome.weight_version),
            mc.ROLLOUTS: float(len(sampled)), mc.REFILLS: float(rolled.refills),
            mc.ZERO_VARIANCE_GROUPS: float(rolled.zero_variance_groups),
            mc.REPLACED_GROUPS: float(rolled.replaced_groups),
            mc.SAMPLED_TOKENS: float(sum(s.num_trained_tokens for r in sampled for s in r.samples)),
            mc.TIME_ROLLOUT_S: t_rollout, mc.TIME_TRAIN_S: trained.t_train, mc.TIME_SYNC_S: trained.t_sync,
            mc.TIME_STEP_S: t_rollout + trained.t_train + trained.t_sync,
            mc.EXCLUDED_ROLLOUTS: float(sum(trained.excluded.values())),
            mc.STALE_GROUPS: float(rolled.stale_groups), mc.CANCELLED_ROLLOUTS: float(rolled.cancelled_rollouts),
            mc.TASKS_RETIRED: float(len(self.signal.retired)),
            **ages,
        }
        if self.s.control == "zero_advantage":
            values[mc.CONTROL_ZERO_ADVANTAGE] = 1.0
        if rolled.slot_capacity_s > 0:
            values[mc.SLOTS_IDLE_FRACTION] = max(0.0, 1.0 - rolled.slot_busy_s / rolled.slot_capacity_s)
            values[mc.SLOTS_WASTED_FRACTION] = rolled.slot_wasted_s / rolled.slot_capacity_s
        values.update(_tokenisation_values(sampled))
        rewards = [r.reward for r in sampled
                   if r.reward is not None and r.termination not in self.admission.excluded]
        reward_mean = _mean(rewards)
        if reward_mean is not None:
            values[mc.REWARD_MEAN] = reward_mean
            values[mc.SOLVE_RATE] = sum(1 for x in rewards if x >= self.s.solved_reward) / len(rewards)
        return mc.declared_values(mc.TRAIN, values)

    # -- evaluation ---------------------------------------------------------------------------------

    async def evaluate(self, step: int) -> EvalFinished:
        """pass@1 over ``eval_samples`` rollouts of every held-out row (mean per-row solve rate)."""
        self.progress.phase = "eval"
        counts: Counter[str] = Counter()
        groups = await asyncio.gather(*(
            self._group(step, p, g, counts, kind="eval", samples=self.s.eval_samples)
            for g, p in enumerate(self.eval_prompts)))
        per_row: list[float] = []
        rewards: list[float] = []
        failures = 0
        for g in groups:
            scored = [r for r in g.results if not r.infrastructure_failure and r.reward is not None]
            failures += len(g.results) - len(scored)
            rewards.extend(r.reward for r in scored if r.reward is not None)
            if scored:
                per_row.append(sum(1 for r in scored if (r.reward or 0.0) >= self.s.solved_reward) / len(scored))
        event = EvalFinished(step=step, pass_at_1=_mean(per_row) or 0.0, reward_mean=_mean(rewards) or 0.0,
                             rows=len(per_row), samples_per_row=self.s.eval_samples,
                             infrastructure_failures=failures)
        self.run_dir.events.emit(event)
        self.progress.last_pass_at_1 = event.pass_at_1
        return event

    # -- the run ------------------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop after abandoning the step in flight; a checkpoint of the last completed step is saved."""
        self._stop.set()

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    async def _until_stopped(self, work: Awaitable[Any]) -> tuple[bool, Any]:
        """Run ``work`` unless a stop is requested first; (stopped, result)."""
        task = asyncio.ensure_future(work)
        stopper = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
        if task.done():
            return False, task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return True, None

    def _checkpoint_last(self, last_done: int) -> None:
        """A checkpoint of the last completed step unless it has one (none before a step completed)."""
        if last_done >= 0 and self._last_checkpoint_step != last_done:
            self.save_checkpoint(last_done)

    async def run(self) -> Literal["completed", "stopped"]:
        """Steps ``next_step`` .. ``num_rollout - 1``; a final checkpoint; ``completed`` or ``stopped``."""
        last_done = self.next_step - 1
        sched: RolloutScheduler | None = None
        try:
            self._announce_control(self.next_step)
            if self._resumed:
                # The engines started from the base checkpoint; the resumed policy is the trainer's.
                await self.sync(self.backend, self.backend.weight_version)
            sched = self.scheduler(first_step=self.next_step, end_step=self.s.num_rollout)
            sched.start()
            for step in range(self.next_step, self.s.num_rollout):
                if self.stop_requested:
                    break
                started = self._step_started(step, sched)
                stopped, rolled = await self._until_stopped(sched.take(step))
                if stopped:
                    break
                final = step == self.s.num_rollout - 1
                due = bool(self.s.eval_every) and (final or (step + 1) % self.s.eval_every == 0)

                def synced(sched: RolloutScheduler = sched, step: int = step) -> None:
                    # Rollouts of the next steps start on the new policy while this one is evaluated.
                    sched.set_policy(step + 1)
                    self._commit(sched)

                await self.finish_step(step, started, rolled, evaluate=due, synced=synced)
                last_done = step
                self.next_step = step + 1
                if due and self.stop_requested:
                    break
                if self.s.checkpoint_every and (step + 1) % self.s.checkpoint_every == 0:
                    self.save_checkpoint(step)
            if self.stop_requested:
                # Before the rollouts in flight are cancelled and cleaned up (their sandboxes destroyed, which
                # takes a while): a second Ctrl-C during that cleanup still leaves this checkpoint to resume
                # from. Its data state was fixed when the step completed (``_commit``), not by the cleanup.
                self._checkpoint_last(last_done)
        except BaseException as exc:
            self.progress.phase = "failed"
            self.run_dir.events.emit(TrainingFinished(status="failed", steps_done=last_done + 1,
                                                      detail=f"{type(exc).__name__}: {exc}"[:500]))
            raise
        finally:
            if sched is not None:
                # Both sides stop: every rollout in flight is cancelled and has cleaned up before we return.
                await sched.close()
        self._checkpoint_last(last_done)
        status: Literal["completed", "stopped"] = "stopped" if self.stop_requested else "completed"
        self.progress.phase = status
        self.run_dir.events.emit(TrainingFinished(status=status, steps_done=last_done + 1))
        return status
