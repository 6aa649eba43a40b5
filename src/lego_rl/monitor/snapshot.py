"""One snapshot of a run: what every view shows, as data (``--json`` prints it, the views and the HTML report
render it). Built from a ``RunState`` by ``build``; a live view builds only the section it shows.

Every figure says where it comes from: events (``rollout_finished``, ``stage``...), a metrics row value, or
the run's config. A figure the run did not record is None (JSON null), never a guess.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from pydantic import BaseModel, Field

from lego_rl.monitor.state import Rollout, RunState
from lego_rl.runstore import RolloutFiles
from lego_rl.runstore import metric_catalog as mc
from lego_rl.runstore.turns import TurnRecord, read_turn_records

SECTIONS = ("overview", "curves", "terminations", "timing", "tasks", "consistency", "behaviour", "pipeline",
            "rollouts")
STAGE_ORDER = (
    "harness_lookup",
    "sandbox_setup",
    "harness_install",
    "agent",
    "patch",
    "grading",
    "cleanup",
    "samples",
)
CONSISTENCY_FIELDS = tuple(mc.CONSISTENCY)
POLICY_LAG = (mc.POLICY_LAG_MEAN, mc.POLICY_LAG_MAX)
"""What the views show as staleness: how many policies old the rollouts a step trained were."""
TOOL_RE = re.compile(r"<function=([A-Za-z0-9_.:-]{1,64})>|\"name\"\s*:\s*\"([A-Za-z0-9_.:-]{1,64})\"")
BEHAVIOUR_ROLLOUTS = 50
"""Latest finished rollouts whose turn records the Behaviour view reads (bounded: they are large)."""


class Note(BaseModel):
    level: str
    text: str


class RunInfo(BaseModel):
    root: str
    kind: str
    """A ``metric_catalog.RunKind`` value (``train``, ``sft``, ``rollout-check``, ``tasks-screen``) or ``empty``."""
    status: str
    started_at: float | None
    last_event_at: float | None
    events_read: int
    metrics_rows: int
    resumes: int


class RolloutBrief(BaseModel):
    rollout_id: str
    instance_id: str
    harness: str
    step: int | None
    termination: str | None
    reward: float | None
    infrastructure: bool
    turns: int
    detail: str


class Point(BaseModel):
    step: int
    value: float


class Overview(BaseModel):
    step: int | None
    """Latest finished step (numbered from 0)."""
    steps_done: int | None
    """Steps finished: the latest finished step + 1 (what ``N/total`` counts, as the CLI's progress line)."""
    steps_total: int | None
    """``train.num_rollout`` from the run's config (an SFT run: ``train.sft_steps``)."""
    weight_version: int | None
    reward: list[Point]
    solve_rate: list[Point]
    eval_pass_at_1: list[Point]
    in_flight: dict[str, int]
    """Rollouts started and not finished, per harness."""
    rollouts_finished: int
    rollouts_per_min: float | None
    """Over the last (up to) 5 finished steps, wall-clock."""
    trained_tokens_per_s: float | None
    """``tokens`` / ``time_train_s`` of the last trained step."""
    staleness: dict[str, float]
    """The policy lag of the last metrics row (``POLICY_LAG``: 0 when every rollout sampled the weights of
    the step that trained it); empty when the run records none (SFT, rollout-check)."""
    eta_s: float | None
    last_error: str | None
    baseline: list[str] = Field(default_factory=list)
    """rollout-check ``--baseline`` verdicts."""
    suspect_patches: list[Point] = Field(default_factory=list)
    """Per finished step, rollouts labelled ``suspect_patch`` (a patch built to fool comparisons; empty when
    the run has none)."""
    loss: list[Point] = Field(default_factory=list)
    """The ``loss`` of each step that wrote one (an SFT run's main curve)."""
    graded: int = 0
    """Finished rollouts with a reward (a run without steps: rollout-check, tasks screen)."""
    rewarded: int = 0
    """Of those, rollouts with reward > 0."""
    reward_mean_all: float | None = None
    """Mean reward over every graded rollout (None when none is graded)."""
    max_staleness: int | None = None
    """``rollout.max_staleness`` from the run's config (0: synchronous; None: not recorded)."""
    incidents: list[str] = Field(default_factory=list)
    """stale_lock_taken / resume_override / steps_abandoned events, oldest first."""
    tokenisation: dict[str, float] = Field(default_factory=dict)
    """Health warnings over every finished step: the totals of ``TOKENISATION_WARNINGS`` that are not 0 (a
    false fork trains a prompt twice, a parse failure hands a tool call back as text); empty when all are 0."""


class Series(BaseModel):
    name: str
    """The declared metric's name, or a derived figure's (``reward_spread/mean_std``, ``termination/<reason>``)."""
    panel: str
    """``train``, ``consistency``, ``rollouts``, ``terminations``, ``timing`` or ``staleness``."""
    unit: str
    steps: list[int]
    """The steps that have the value, ascending (integers, from 0)."""
    figures: list[float]
    """Aligned with ``steps`` (two lists, not points: 40 curves × 500 steps stay cheap to build and to print)."""


class StepTerminations(BaseModel):
    step: int
    counts: dict[str, int]
    policy: int
    infrastructure: int


class Terminations(BaseModel):
    totals: dict[str, int]
    infrastructure_reasons: list[str]
    per_step: list[StepTerminations]
    examples: dict[str, list[RolloutBrief]]


class StageTiming(BaseModel):
    scope: str
    """``all steps``, ``step N`` or ``no step`` (evaluation / rollout-check)."""
    harness: str
    stage: str
    n: int
    p50: float
    p90: float
    max: float


class TaskRow(BaseModel):
    instance_id: str
    cells: str
    """One symbol per finished attempt, oldest first: ``✓`` solved, ``·`` failed, ``✗`` infrastructure."""
    attempts: int
    solve_rate: float | None
    zero_variance_groups: int
    """Groups (steps) whose admitted rewards were all equal: no GRPO signal."""
    zero_variance_streak: int = 0
    """Of those, how many in a row end its groups so far: a task at 2 or more stopped carrying signal."""
    retired: bool = False
    """Retired by the trainer (``train.retire_zero_variance_after``): no longer drawn."""


STOPPED_SIGNAL = 2
"""Zero-variance groups in a row from which the views call a task one that stopped carrying signal."""


class Tasks(BaseModel):
    tasks: list[TaskRow]
    zero_variance_groups: int
    groups: int
    stopped_signal: int = 0
    """Tasks whose last ``STOPPED_SIGNAL`` or more groups had zero variance."""
    retired: list[str] = []
    """Tasks the trainer retired, in the order it did (from the metrics rows)."""


class ConsistencyStep(BaseModel):
    step: int
    overall: dict[str, float]
    by_kind: dict[str, dict[str, float]]
    warn: bool


class Consistency(BaseModel):
    kl_warn: float
    steps: list[ConsistencyStep]
    worst: list[ConsistencyStep]
    """The steps with the largest k3 KL, worst first."""
    note: str


class HarnessBehaviour(BaseModel):
    harness: str
    rollouts: int
    turns_mean: float
    turns_p50: float
    turns_p90: float
    turns_max: int
    turns_histogram: dict[str, int]
    tools: dict[str, int]
    """Tool names in the sampled text of the turn records read (see ``records_read``)."""
    tool_calls_per_turn: float | None
    output_tokens_p50: float | None
    output_tokens_p90: float | None
    records_read: int
    """Rollouts whose turn records were read (the latest ``BEHAVIOUR_ROLLOUTS`` finished ones)."""


class PipelineStep(BaseModel):
    step: int
    time_rollout_s: float | None
    time_train_s: float | None
    time_sync_s: float | None
    trainer_idle: float | None
    """Share of the step the trainer waited for rollouts."""
    rollout_idle: float | None
    """Share of the step no rollout ran (training and sync)."""
    excluded: int
    refills: int
    weight_version: int | None


class Pipeline(BaseModel):
    steps: list[PipelineStep]
    bottleneck: str | None
    staleness: dict[str, float]
    mode: str | None = None
    """``synchronous`` / ``asynchronous`` and ``rollout.max_staleness``, from the run's config (None: not
    recorded); the policy lag is what happened."""


class Snapshot(BaseModel):
    run: RunInfo
    notes: list[Note]
    overview: Overview | None = None
    terminations: Terminations | None = None
    timing: list[StageTiming] | None = None
    tasks: Tasks | None = None
    consistency: Consistency | None = None
    behaviour: list[HarnessBehaviour] | None = None
    pipeline: Pipeline | None = None
    rollouts: list[RolloutBrief] | None = None
    """The latest finished rollouts (newest first), or the search's matches."""
    curves: list[Series] | None = None
    """Per-step curves: training, consistency per turn kind, reward spread, termination mix, timing, lag."""


# -- helpers ---------------------------------------------------------------------------------------------


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile of an already sorted, non-empty sequence."""
    i = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return float(sorted_values[i])


def as_int(value: object) -> int:
    """A count from a JSON record written by another component: 0 when absent or not a number."""
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def brief(r: Rollout) -> RolloutBrief:
    return RolloutBrief(
        rollout_id=r.rollout_id,
        instance_id=r.instance_id,
        harness=r.harness,
        step=r.step,
        termination=r.termination,
        reward=r.reward,
        infrastructure=r.infrastructure,
        turns=r.turns,
        detail=r.detail[:300],
    )


def _value(state: RunState, step: int, metric: mc.Metric) -> float | None:
    agg = state.steps.get(step)
    if agg is None or agg.metrics is None:
        return None
    return mc.read(agg.metrics.values, metric)


def _policy_lag(values: dict[str, float] | None) -> dict[str, float]:
    """The row's ``POLICY_LAG`` figures by name (none recorded: empty)."""
    figures = {m: mc.read(values or {}, m) for m in POLICY_LAG}
    return {str(m): v for m, v in figures.items() if v is not None}


def _done_steps(state: RunState) -> list[int]:
    return sorted(s for s, a in state.steps.items() if a.finished is not None or a.metrics is not None)


# -- sections --------------------------------------------------------------------------------------------


def overview(state: RunState, now: float) -> Overview:
    done = _done_steps(state)
    reward, solve = [], []
    for s in done:
        agg = state.steps[s]
        r = _value(state, s, mc.REWARD_MEAN)
        if r is None and agg.rewards:
            r = sum(agg.rewards) / len(agg.rewards)
        if r is not None:
            reward.append(Point(step=s, value=r))
        sr = _value(state, s, mc.SOLVE_RATE)
        if sr is None and agg.rewards:
            sr = sum(x >= 1.0 for x in agg.rewards) / len(agg.rewards)
        if sr is not None:
            solve.append(Point(step=s, value=sr))
    in_flight = Counter(r.harness for r in state.in_flight.values())
    last = state.steps[done[-1]] if done else None
    recent = [state.steps[s] for s in done[-5:]]
    per_min = None
    timed = [(a, a.metrics) for a in recent if a.metrics is not None]
    if timed:
        span = timed[-1][1].finished_at - timed[0][1].started_at
        n = sum(a.rollouts or int(mc.read(m.values, mc.ROLLOUTS) or 0) for a, m in timed)
        per_min = n / span * 60 if span > 0 else None
    tokens_s = None
    for _, m in reversed(timed):
        tok, t = mc.read(m.values, mc.TOKENS), mc.read(m.values, mc.TIME_TRAIN_S)
        if tok and t:
            tokens_s = tok / t
            break
    total = {mc.RunKind.TRAIN.value: state.config_int("train", "num_rollout"),
             mc.RunKind.SFT.value: state.config_int("train", "sft_steps")}.get(state.kind)
    eta = None
    if total is not None and timed and state.finished is None:
        step_s = sum(m.finished_at - m.started_at for _, m in timed) / len(timed)
        eta = max(0.0, (total - (done[-1] + 1)) * step_s)
    graded = [r.reward for r in state.rollouts.values()
              if r.termination is not None and not r.infrastructure and r.reward is not None]
    loss = [Point(step=s, value=v) for s in done if (v := _value(state, s, mc.LOSS)) is not None]
    staleness = _policy_lag(last.metrics.values if last and last.metrics else None)
    version = None
    if last is not None and last.finished:
        version = last.finished.weight_version
    elif last is not None:
        recorded = mc.read(last.metrics.values, mc.WEIGHT_VERSION)  # type: ignore[union-attr]
        version = int(recorded) if recorded is not None else last.weight_version
    elif state.open_step is not None:
        version = state.steps[state.open_step].weight_version
    return Overview(
        step=done[-1] if done else None,
        steps_done=done[-1] + 1 if done else None,
        steps_total=total,
        weight_version=version,
        reward=reward,
        solve_rate=solve,
        eval_pass_at_1=[Point(step=e.step, value=e.pass_at_1) for e in state.evals],
        in_flight=dict(sorted(in_flight.items())),
        rollouts_finished=len(state.rollouts) - len(state.in_flight),
        rollouts_per_min=per_min,
        trained_tokens_per_s=tokens_s,
        staleness=staleness,
        eta_s=eta,
        last_error=state.last_error[1] if state.last_error else None,
        baseline=[
            f"{b.instance_id}: {'solved (bad: the task is already solved)' if b.solved else 'unsolved'}"
            f"{' — ' + b.error if b.error else ''}"
            for b in state.baselines
        ],
        suspect_patches=_suspect_patches(state, done),
        loss=loss,
        graded=len(graded),
        rewarded=sum(1 for x in graded if x > 0),
        reward_mean_all=sum(graded) / len(graded) if graded else None,
        max_staleness=state.config_int("rollout", "max_staleness"),
        incidents=[text for _, _, text in state.incidents],
        tokenisation=_tokenisation_warnings(state, done),
    )


TOKENISATION_WARNINGS = (mc.FALSE_FORKS, mc.PARSE_FAILURES, mc.RENDER_FALLBACKS)
"""Tokenisation counters that should stay 0 on a healthy run (the Overview says when one is not)."""


def _tokenisation_warnings(state: RunState, done: list[int]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for s in done:
        if (row := state.steps[s].metrics) is None:
            continue
        for m in TOKENISATION_WARNINGS:
            if (v := mc.read(row.values, m)):
                totals[str(m)] = totals.get(str(m), 0.0) + v
    return totals


CURVES: tuple[tuple[str, tuple[mc.Metric, ...]], ...] = (
    ("train", (mc.LOSS, mc.PG_LOSS, mc.NLL, mc.GRAD_NORM, mc.ENTROPY, mc.LR, mc.KL, mc.CLIP_FRAC_LOW,
               mc.CLIP_FRAC_HIGH, mc.DUAL_CLIP_FRAC, mc.RATIO_MEAN, mc.IS_WEIGHT_MEAN, mc.TIS_CLAMPED_FRAC,
               mc.MIS_MASKED_FRAC, mc.SC_CORRECTION, mc.TOKENS, mc.TOKEN_WEIGHT, mc.OPTIMIZER_STEPS, mc.TRAINED,
               mc.CONTROL_ZERO_ADVANTAGE, mc.WEIGHT_VERSION, mc.DEMONSTRATIONS, mc.EPOCH)),
    ("rollouts", (mc.REWARD_MEAN, mc.SOLVE_RATE, mc.ROLLOUTS, mc.ADMITTED_ROLLOUTS, mc.EXCLUDED_ROLLOUTS,
                  mc.CANCELLED_ROLLOUTS, mc.REFILLS, mc.SAMPLED_TOKENS, mc.ZERO_VARIANCE_GROUPS,
                  mc.ZERO_ADVANTAGE_GROUPS, mc.ALL_SOLVED_GROUPS, mc.ALL_FAILED_GROUPS, mc.REPLACED_GROUPS,
                  mc.STALE_GROUPS, mc.TASKS_RETIRED)),
    ("timing", (mc.TIME_ROLLOUT_S, mc.TIME_TRAIN_S, mc.TIME_SYNC_S, mc.TIME_STEP_S, mc.TIME_SYNC_DRAIN_S,
                mc.TIME_SYNC_STAGE_S, mc.SLOTS_IDLE_FRACTION, mc.SLOTS_WASTED_FRACTION)),
    ("staleness", (mc.POLICY_LAG_MEAN, mc.POLICY_LAG_MAX, mc.ROLLOUTS_CROSSED_VERSION, mc.TURNS_CROSSED_VERSION,
                   mc.TOKENS_DROPPED_STALE)),
    ("tokenisation", (mc.SEGMENTS_PER_ROLLOUT, mc.SEGMENTS_PER_ROLLOUT_MAX, mc.FALSE_FORKS,
                      mc.REPEATED_PROMPT_TOKENS, mc.RENDER_FALLBACKS, mc.PARSE_FAILURES)),
    ("eval", (mc.EVAL_PASS_AT_1, mc.EVAL_REWARD_MEAN, mc.EVAL_ROWS, mc.EVAL_INFRASTRUCTURE_FAILURES)),
)
"""The declared metrics the Curves view draws, by panel (each only when the run wrote it). With the consistency
figures (every field, overall and per turn kind) and ``tokens_age`` (drawn as its mean age per step), every
declaration is shown: tests/monitor/test_metric_contract.py fails on one that is not."""


def curves(state: RunState) -> list[Series]:
    """Every per-step curve the run has: declared metrics read through ``CURVES``, consistency per turn kind,
    the reward spread within groups and the termination mix (from the events), stage timing and policy lag.
    One pass over each row (``read_all``)."""
    done = _done_steps(state)
    points: dict[str, tuple[list[int], list[float]]] = {}
    ages: tuple[list[int], list[float]] = ([], [])
    for s in done:
        row = state.steps[s].metrics
        if row is None:
            continue
        hist: dict[str, float] = {}
        for metric, member, v in mc.read_all(row.values):
            if metric is mc.TOKENS_AGE:
                hist[member or "0"] = v
                continue
            steps, values = points.setdefault(metric if member is None else metric.key(member), ([], []))
            steps.append(s)
            values.append(v)
        if (total := sum(hist.values())) > 0:
            ages[0].append(s)
            ages[1].append(sum(int(a) * n for a, n in hist.items()) / total)

    def series(name: str, panel: str, unit: str, key: str | None = None) -> Series:
        steps, values = points[key or name]
        return Series(name=name, panel=panel, unit=unit, steps=steps, figures=values)

    out: list[Series] = []
    for panel, metrics in CURVES:
        out.extend(series(str(m), panel, m.unit) for m in metrics if m in points)
        if panel == "rollouts":
            out.extend(_reward_spread(state, done))
    if ages[0]:
        out.append(Series(name="tokens_age/mean", panel="staleness", unit="policies", steps=ages[0], figures=ages[1]))
    for f, overall in mc.CONSISTENCY.items():
        if overall in points:
            out.append(series(str(overall), "consistency", overall.unit))
        family = mc.CONSISTENCY_BY_SPLIT[f]
        out.extend(series(family.key(split), "consistency", family.unit)
                   for split in mc.CONSISTENCY_SPLITS if family.key(split) in points)
    out.extend(_termination_mix(state, done))
    return out


def _reward_spread(state: RunState, done: list[int]) -> list[Series]:
    """Per step: the mean and the largest standard deviation of the admitted rewards within a group (0: no
    GRPO signal in that group), and the share of groups with zero spread; from the events."""
    steps: list[int] = []
    mean_std: list[float] = []
    max_std: list[float] = []
    flat: list[float] = []
    for s in done:
        groups = [g for g in state.steps[s].group_rewards.values() if len(g) > 1]
        if not groups:
            continue
        stds = [_std(g) for g in groups]
        steps.append(s)
        mean_std.append(sum(stds) / len(stds))
        max_std.append(max(stds))
        flat.append(sum(1 for x in stds if x == 0.0) / len(stds))
    if not steps:
        return []
    return [Series(name="reward_spread/mean_std", panel="rollouts", unit="reward", steps=steps, figures=mean_std),
            Series(name="reward_spread/max_std", panel="rollouts", unit="reward", steps=steps, figures=max_std),
            Series(name="reward_spread/zero_share", panel="rollouts", unit="fraction", steps=steps, figures=flat)]


def _std(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum([(v - mean) ** 2 for v in values]) / len(values))


def _termination_mix(state: RunState, done: list[int]) -> list[Series]:
    """Per termination reason, its share of each step's finished rollouts (events; the metrics row's counts
    where a step has no events)."""
    per_step = []
    for s in done:
        agg = state.steps[s]
        counts = dict(agg.terminations) or (
            {str(k): v for k, v in agg.metrics.terminations.items()} if agg.metrics is not None else {})
        if sum(counts.values()):
            per_step.append((s, counts, sum(counts.values())))
    reasons = sorted({r for _, c, _ in per_step for r in c})
    steps = [s for s, _, _ in per_step]
    return [Series(name=f"termination/{r}", panel="terminations", unit="fraction", steps=steps,
                   figures=[c.get(r, 0) / n for _, c, n in per_step]) for r in reasons]


def _suspect_patches(state: RunState, done: list[int]) -> list[Point]:
    """``suspect_patch`` rollouts per step, counted like the Terminations view counts every reason."""
    points = []
    for s in done:
        agg = state.steps[s]
        counts = dict(agg.terminations)
        if not counts and agg.metrics is not None:
            counts = {str(k): v for k, v in agg.metrics.terminations.items()}
        points.append(Point(step=s, value=float(counts.get("suspect_patch", 0))))
    return points if any(p.value for p in points) else []


def terminations(state: RunState) -> Terminations:
    per_step = []
    for s in _done_steps(state) + ([state.open_step] if state.open_step is not None else []):
        agg = state.steps[s]
        counts = dict(agg.terminations)
        if not counts and agg.metrics is not None:  # no events for this step's rollouts: the metrics row's
            counts = {str(k): v for k, v in agg.metrics.terminations.items()}
        infra = sum(v for k, v in counts.items() if k in state.infra_reasons)
        per_step.append(
            StepTerminations(
                step=s,
                counts=dict(sorted(counts.items())),
                policy=sum(counts.values()) - infra,
                infrastructure=infra,
            )
        )
    return Terminations(
        totals=dict(state.terminations.most_common()),
        infrastructure_reasons=sorted(state.infra_reasons),
        per_step=per_step,
        examples={k: [brief(r) for r in reversed(v)] for k, v in sorted(state.examples.items())},
    )


def timing(state: RunState) -> list[StageTiming]:
    """Per harness and stage: over all steps, over the latest step, and over rollouts outside steps."""
    latest = _done_steps(state)[-1:] or ([state.open_step] if state.open_step is not None else [])
    merged: dict[tuple[str, str, str], list[float]] = {}
    for (step, harness, stage), times in state.stage_times.items():
        scopes = ["no step"] if step is None else ["all steps"] + ([f"step {step}"] if step in latest else [])
        for scope in scopes:
            merged.setdefault((scope, harness, stage), []).extend(times)
    order = {s: i for i, s in enumerate(STAGE_ORDER)}
    rows = []
    for (scope, harness, stage), times in sorted(
        merged.items(), key=lambda kv: (kv[0][0] != "all steps", kv[0][0], kv[0][1], order.get(kv[0][2], 99))
    ):
        times.sort()
        rows.append(
            StageTiming(
                scope=scope,
                harness=harness,
                stage=stage,
                n=len(times),
                p50=quantile(times, 0.5),
                p90=quantile(times, 0.9),
                max=times[-1],
            )
        )
    return rows


SYMBOL = {"solved": "✓", "failed": "·", "infra": "✗"}


def tasks(state: RunState) -> Tasks:
    rows = []
    zero = groups = 0
    retired = [iid for step in sorted(state.steps) if (m := state.steps[step].metrics) for iid in m.retired_tasks]
    for task in sorted(state.tasks.values(), key=lambda t: t.instance_id):
        # a group is one step's rollouts of the task; evaluation rollouts (step None) form no group
        trained = [rewards for step, rewards in sorted(task.groups.items(), key=lambda kv: kv[0] or 0)
                   if step is not None and len(rewards) > 1]
        zv = sum(1 for rewards in trained if len(set(rewards)) == 1)
        streak = 0
        for rewards in reversed(trained):
            if len(set(rewards)) != 1:
                break
            streak += 1
        zero += zv
        groups += len(trained)
        rows.append(
            TaskRow(
                instance_id=task.instance_id,
                cells="".join(SYMBOL[c] for c in task.cells),
                attempts=len(task.cells),
                solve_rate=task.solve_rate,
                zero_variance_groups=zv,
                zero_variance_streak=streak,
                retired=task.instance_id in retired,
            )
        )
    return Tasks(tasks=rows, zero_variance_groups=zero, groups=groups, retired=retired,
                 stopped_signal=sum(1 for r in rows if r.zero_variance_streak >= STOPPED_SIGNAL))


_OVERALL_FIELD = {m: f for f, m in mc.CONSISTENCY.items()}
_SPLIT_FIELD = {m: f for f, m in mc.CONSISTENCY_BY_SPLIT.items()}


def consistency(state: RunState, kl_warn: float) -> Consistency:
    steps = []
    for s in _done_steps(state):
        m = state.steps[s].metrics
        if m is None:
            continue
        overall: dict[str, float] = {}
        by_kind: dict[str, dict[str, float]] = {}
        for metric, split, value in mc.read_all(m.values):  # one pass over the row, not one per field
            if (f := _OVERALL_FIELD.get(metric)) is not None:
                overall[f] = value
            elif split is not None and (f := _SPLIT_FIELD.get(metric)) is not None:
                by_kind.setdefault(split, {})[f] = value
        if overall or by_kind:
            kls = [overall.get("k3_kl", 0.0), *(k.get("k3_kl", 0.0) for k in by_kind.values())]
            steps.append(ConsistencyStep(step=s, overall=overall, by_kind=by_kind, warn=max(kls) > kl_warn))
    worst = sorted(steps, key=lambda c: -c.overall.get("k3_kl", 0.0))[:5]
    note = (
        "per-step figures over every trained token (metrics rows, consistency/*); per-turn figures are not "
        "recorded: open a worst step's rollouts in the drill-down"
    )
    if not steps:
        note = (
            "no consistency figures in this run: they are written by steps that trained (metrics rows, "
            "consistency/*)"
        )
    return Consistency(kl_warn=kl_warn, steps=steps, worst=worst, note=note)


def _turn_records(state: RunState, r: Rollout) -> list[TurnRecord]:
    """The rollout's turn records, every session's, as the adapter wrote them (a torn line skipped)."""
    folder = state.artifact_dir(r.rollout_id)
    out: list[TurnRecord] = []
    try:
        files = sorted(folder.glob(RolloutFiles.TURNS_GLOB))
    except OSError:
        return out
    for path in files:
        try:
            out.extend(read_turn_records(path))
        except OSError:
            continue
    return out


class TurnCache:
    """Turn-record figures per rollout, read once each (finished rollouts' records never change)."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[Counter[str], int, int, list[int]]] = {}

    def get(self, state: RunState, r: Rollout) -> tuple[Counter[str], int, int, list[int]]:
        """(tool names, tool calls, turns read, output lengths) of one finished rollout."""
        hit = self._seen.get(r.rollout_id)
        if hit is None:
            tools: Counter[str] = Counter()
            calls, lengths = 0, []
            records = _turn_records(state, r)
            for rec in records:
                tools.update(a or b for a, b in TOOL_RE.findall(rec.text))
                calls += rec.tool_calls
                lengths.append(len(rec.output_ids))
            hit = self._seen[r.rollout_id] = (tools, calls, len(records), lengths)
        return hit


def behaviour(state: RunState, cache: TurnCache) -> list[HarnessBehaviour]:
    read = [r for r in list(state.recent)[-BEHAVIOUR_ROLLOUTS:] if r.termination is not None]
    out = []
    for harness, turns in sorted(state.turns_by_harness.items()):
        values = sorted(turns.elements())
        if not values:
            continue
        tools: Counter[str] = Counter()
        calls = n_turns = 0
        lengths: list[int] = []
        records = 0
        for r in read:
            if r.harness != harness:
                continue
            t, c, n, lens = cache.get(state, r)
            tools.update(t)
            calls, n_turns = calls + c, n_turns + n
            lengths.extend(lens)
            records += n > 0
        lengths.sort()
        buckets: Counter[str] = Counter()
        for v in values:
            buckets[_bucket(v)] += 1
        out.append(
            HarnessBehaviour(
                harness=harness,
                rollouts=len(values),
                turns_mean=sum(values) / len(values),
                turns_p50=quantile(values, 0.5),
                turns_p90=quantile(values, 0.9),
                turns_max=values[-1],
                turns_histogram={b: buckets[b] for b in _BUCKETS if buckets[b]},
                tools=dict(tools.most_common(12)),
                tool_calls_per_turn=calls / n_turns if n_turns else None,
                output_tokens_p50=quantile(lengths, 0.5) if lengths else None,
                output_tokens_p90=quantile(lengths, 0.9) if lengths else None,
                records_read=records,
            )
        )
    return out


_BUCKETS = ("0", "1", "2-3", "4-7", "8-15", "16-31", "32-63", "64+")


def _bucket(turns: int) -> str:
    if turns < 2:
        return str(turns)
    for lo, name in ((2, "2-3"), (4, "4-7"), (8, "8-15"), (16, "16-31"), (32, "32-63")):
        if turns < lo * 2:
            return name
    return "64+"


def pipeline(state: RunState) -> Pipeline:
    steps = []
    for s in _done_steps(state):
        agg = state.steps[s]
        v = agg.metrics.values if agg.metrics else {}
        tr, tt, ts = (mc.read(v, m) for m in (mc.TIME_ROLLOUT_S, mc.TIME_TRAIN_S, mc.TIME_SYNC_S))
        total = (tr or 0.0) + (tt or 0.0) + (ts or 0.0)
        excluded = (
            sum(agg.finished.excluded_rollouts.values())
            if agg.finished
            else int(mc.read(v, mc.EXCLUDED_ROLLOUTS) or 0)
        )
        steps.append(
            PipelineStep(
                step=s,
                time_rollout_s=tr,
                time_train_s=tt,
                time_sync_s=ts,
                trainer_idle=tr / total if tr is not None and total > 0 else None,
                rollout_idle=((tt or 0.0) + (ts or 0.0)) / total if tr is not None and total > 0 else None,
                excluded=excluded,
                refills=agg.refills or int(mc.read(v, mc.REFILLS) or 0),
                weight_version=agg.finished.weight_version if agg.finished else None,
            )
        )
    recent = [p for p in steps[-5:] if p.trainer_idle is not None]
    bottleneck = None
    if recent:
        idle = sum(p.trainer_idle or 0.0 for p in recent) / len(recent)
        bottleneck = (
            "rollouts (the trainer waits for them)"
            if idle > 0.5
            else "training and sync (the rollouts wait for them)"
        )
    last = state.steps[steps[-1].step].metrics if steps else None
    staleness = _policy_lag(last.values if last else None)
    bound = state.config_int("rollout", "max_staleness")
    mode = None if bound is None else (
        f"{'synchronous' if bound == 0 else 'asynchronous'} (rollout.max_staleness {bound})")
    return Pipeline(steps=steps, bottleneck=bottleneck, staleness=staleness, mode=mode)


def search(state: RunState, query: str, cache: TurnCache, limit: int = 200) -> list[RolloutBrief]:
    """Finished rollouts matching every term of ``query``: ``task:`` / ``harness:`` / ``reason:`` / ``tool:``
    / ``step:`` prefixes, or a bare word found in any of id, task, harness or reason. Newest first."""
    terms = [t for t in query.split() if t]
    out = []
    for r in reversed(list(state.rollouts.values())):
        if r.termination is None:
            continue
        if all(_matches(state, r, t, cache) for t in terms):
            out.append(brief(r))
            if len(out) >= limit:
                break
    return out


def _matches(state: RunState, r: Rollout, term: str, cache: TurnCache) -> bool:
    key, sep, value = term.partition(":")
    if not sep:
        value = term.lower()
        return any(
            value in (x or "").lower() for x in (r.rollout_id, r.instance_id, r.harness, r.termination)
        )
    value = value.lower()
    if key == "task":
        return value in r.instance_id.lower()
    if key == "harness":
        return value in r.harness.lower()
    if key == "reason":
        return value in (r.termination or "")
    if key == "step":
        return str(r.step) == value
    if key == "tool":
        return any(value == t.lower() for t in cache.get(state, r)[0])
    return False


def build(
    state: RunState,
    *,
    now: float,
    kl_warn: float,
    sections: Iterable[str] = SECTIONS,
    cache: TurnCache | None = None,
    query: str | None = None,
) -> Snapshot:
    """The snapshot of ``state`` with the named sections filled (the rest None)."""
    cache = cache or TurnCache()
    want = set(sections)
    snap = Snapshot(
        run=RunInfo(
            root=str(state.root),
            kind=state.kind,
            status=state.status(now),
            started_at=state.started_at,
            last_event_at=state.last_event_ts,
            events_read=state.events_read,
            metrics_rows=state.metrics_read,
            resumes=state.resumes,
        ),
        notes=[Note(level=n.level, text=n.text) for n in state.notes(now)],
    )
    if "overview" in want:
        snap.overview = overview(state, now)
    if "curves" in want:
        snap.curves = curves(state)
    if "terminations" in want:
        snap.terminations = terminations(state)
    if "timing" in want:
        snap.timing = timing(state)
    if "tasks" in want:
        snap.tasks = tasks(state)
    if "consistency" in want:
        snap.consistency = consistency(state, kl_warn)
    if "behaviour" in want:
        snap.behaviour = behaviour(state, cache)
    if "pipeline" in want:
        snap.pipeline = pipeline(state)
    if "rollouts" in want:
        snap.rollouts = (
            search(state, query, cache) if query else [brief(r) for r in reversed(state.recent)][:50]
        )
    return snap


def artifact_files(state: RunState, rollout_id: str) -> list[Path]:
    folder = state.artifact_dir(rollout_id)
    try:
        return sorted(p for p in folder.iterdir() if p.is_file())
    except OSError:
        return []
