"""The declared metrics: every named value a run writes into ``metrics.jsonl``, declared once.

A declaration says what a value is (unit, kind, group, one-line meaning) and which run kinds write it.
Writers (the GRPO loop, SFT) pass their values through ``declared_values`` before a row is written: a name
no declaration covers for that run kind is an ``UndeclaredMetric``, so a new figure cannot reach the file
without an entry here. Readers (the monitor, the report, ``lego audit``) get values with ``read`` and
``read_family``, which take a declaration, never a string (``read_all`` walks a row once, yielding each value
with its declaration): a view cannot read a name nobody writes (the
monitor once read ``staleness*`` while the loop wrote ``policy_lag_*``).

A ``Metric`` is a ``str`` (its name), so a declaration is also a row's key: ``values[POLICY_LAG_MEAN] = x``.
A *family* has one ``{placeholder}`` in its name (``tokens_age/{age}``); ``key()`` names one member, and the
placeholder takes a non-negative integer or, where ``choices`` are given, one of them.

Every declaration is shown by a view of ``lego monitor`` or ``lego report``, or says why not (``hidden``); a test
fails when a written metric is neither, or a view names a metric the catalog does not declare.

Kinds: a ``gauge`` is a level at the end of the step (lr, reward mean), a ``counter`` counts things that
happened during the step (rollouts, refills), a ``distribution`` is a family whose members together form one
histogram (tokens per age). ``when`` says when a declared value is absent from a row; None means every row
of its run kinds that trained (train) or ran (SFT) has it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from enum import StrEnum

from lego_rl.errors import LegoError


class MetricKind(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"
    DISTRIBUTION = "distribution"


class RunKind(StrEnum):
    """What kind of run wrote a directory (the monitor shows each as its own kind)."""

    TRAIN = "train"
    SFT = "sft"
    EVAL = "eval"
    ROLLOUT_CHECK = "rollout-check"
    TASKS_SCREEN = "tasks-screen"


TRAIN, SFT, EVAL = RunKind.TRAIN, RunKind.SFT, RunKind.EVAL
ROLLOUT_CHECK, TASKS_SCREEN = RunKind.ROLLOUT_CHECK, RunKind.TASKS_SCREEN
SESSIONS = (ROLLOUT_CHECK, TASKS_SCREEN)
"""Run kinds that roll out without training: one row per session (``driver.rollout_rows``)."""
GAUGE, COUNTER, DISTRIBUTION = MetricKind.GAUGE, MetricKind.COUNTER, MetricKind.DISTRIBUTION
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")


class UndeclaredMetric(LegoError):
    """A value written under a name no declaration covers for the run kind writing it."""

    def __init__(self, name: str, run_kind: RunKind, declared: Metric | None) -> None:
        self.name = name
        self.run_kind = run_kind
        why = (f"is declared for {', '.join(sorted(declared.written_by))} only" if declared is not None
               else "is not declared")
        super().__init__(f"metric {name!r} written by a {run_kind.value} run {why}: declare it (unit, kind, "
                         "group, meaning, run kinds) in lego_rl.runstore.metric_catalog")


class Metric(str):
    """One declared metric; the string is its name (a family's has one ``{placeholder}``)."""

    __slots__ = ("unit", "kind", "group", "meaning", "written_by", "when", "choices", "hidden", "_pattern")
    unit: str
    kind: MetricKind
    group: str
    meaning: str
    written_by: frozenset[RunKind]
    when: str | None
    choices: tuple[str, ...]
    hidden: str | None
    """Why no view of the monitor or the report shows it (None: a view does; tests/monitor/test_metric_views.py
    checks both ways)."""
    _pattern: re.Pattern[str] | None

    def __new__(cls, name: str, *, unit: str, kind: MetricKind, group: str, meaning: str,
                written_by: Iterable[RunKind], when: str | None = None, choices: Iterable[str] = (),
                hidden: str | None = None) -> Metric:
        obj = super().__new__(cls, name)
        obj.unit, obj.kind, obj.group, obj.meaning = unit, kind, group, meaning
        obj.written_by, obj.when, obj.choices, obj.hidden = frozenset(written_by), when, tuple(choices), hidden
        holes = _PLACEHOLDER.findall(name)
        if len(holes) > 1:
            raise ValueError(f"metric {name!r}: a family has one placeholder")
        if kind is DISTRIBUTION and not holes:
            raise ValueError(f"metric {name!r}: a distribution is a family (its members form the histogram)")
        value = "|".join(map(re.escape, obj.choices)) if obj.choices else "0|[1-9][0-9]*"
        obj._pattern = (re.compile(re.escape(name).replace(re.escape(f"{{{holes[0]}}}"), f"(?:{value})"))
                        if holes else None)
        return obj

    @property
    def is_family(self) -> bool:
        return self._pattern is not None

    def key(self, value: object) -> str:
        """The name of the family member ``value`` (``TOKENS_AGE.key(2)`` is ``tokens_age/2``)."""
        if self._pattern is None:
            raise TypeError(f"{self} is one metric, not a family")
        name = _PLACEHOLDER.sub(str(value), self, count=1)
        if not self._pattern.fullmatch(name):
            raise ValueError(f"{value!r} is not a member of {self} (choices: {self.choices or 'an integer >= 0'})")
        return name

    def member(self, name: str) -> str | None:
        """The placeholder's value when ``name`` is a member of this family, else None."""
        if self._pattern is None or not self._pattern.fullmatch(name):
            return None
        prefix, _, suffix = _PLACEHOLDER.split(self, maxsplit=1)
        return name[len(prefix): len(name) - len(suffix) if suffix else None]

    def covers(self, name: str) -> bool:
        return self.member(name) is not None if self._pattern is not None else name == str(self)


_ALL: list[Metric] = []


def _declare(name: str, unit: str, kind: MetricKind, group: str, meaning: str, *written_by: RunKind,
             when: str | None = None, choices: Iterable[str] = (), hidden: str | None = None) -> Metric:
    """Declare one metric (written by train unless run kinds are named); a name is declared once."""
    if any(m == name for m in _ALL):
        raise ValueError(f"metric {name!r} is declared twice")
    m = Metric(name, unit=unit, kind=kind, group=group, meaning=meaning, written_by=written_by or (TRAIN,),
               when=when, choices=choices, hidden=hidden)
    _ALL.append(m)
    return m


_TRAINED = "steps that trained (a step whose batch had no advantage signal trains nothing)"

# -- optimizer (the trainer backend and the loss: one value per optimizer step, averaged over the RL step) ----
LOSS = _declare("loss", "nats/token", GAUGE, "train", "the objective the optimizer differentiated (summed over "
                "micro-batches; SFT: the demonstrations' mean NLL before the update)", TRAIN, SFT, when=_TRAINED)
GRAD_NORM = _declare("grad_norm", "L2 norm", GAUGE, "train", "global gradient norm before clipping", TRAIN, SFT,
                     when=_TRAINED)
LR = _declare("lr", "rate", GAUGE, "train", "learning rate of the last optimizer step", TRAIN, SFT, when=_TRAINED)
TOKENS = _declare("tokens", "tokens", COUNTER, "train", "trained (loss-masked) tokens, summed over optimizer steps",
                  TRAIN, SFT, when=_TRAINED)
TOKEN_WEIGHT = _declare("token_weight", "rollouts", GAUGE, "train", "sum of the token weights (1 per rollout: a check "
                        "of the one-denominator packing)", TRAIN, SFT, when=_TRAINED)
ENTROPY = _declare("entropy", "nats", GAUGE, "train", "mean entropy of the policy over trained tokens", TRAIN, SFT,
                   when=_TRAINED)
OPTIMIZER_STEPS = _declare("optimizer_steps", "steps", COUNTER, "train", "optimizer steps this RL step took "
                           "(train.global_batch_size splits a batch)", when=_TRAINED)
PG_LOSS = _declare("pg_loss", "loss", GAUGE, "train", "policy-gradient part of the loss", when=_TRAINED)
KL = _declare("kl", "nats", GAUGE, "train", "k3 KL to the reference policy over trained tokens",
              when="loss.kl_coef > 0")
CLIP_FRAC_LOW = _declare("clip_frac_low", "fraction", GAUGE, "train", "tokens whose ratio was clipped below "
                         "(negative advantage)", when=_TRAINED)
CLIP_FRAC_HIGH = _declare("clip_frac_high", "fraction", GAUGE, "train", "tokens whose ratio was clipped above "
                          "(positive advantage)", when=_TRAINED)
DUAL_CLIP_FRAC = _declare("dual_clip_frac", "fraction", GAUGE, "train", "tokens the dual clip capped",
                          when="loss.dual_clip_c is set")
RATIO_MEAN = _declare("ratio_mean", "ratio", GAUGE, "train", "mean importance ratio new/old policy over trained tokens",
                      when=_TRAINED)
IS_WEIGHT_MEAN = _declare("is_weight_mean", "ratio", GAUGE, "train", "mean rollout-correction importance weight",
                          when="loss.is_correction is not none")
TIS_CLAMPED_FRAC = _declare("tis_clamped_frac", "fraction", GAUGE, "train", "tokens whose truncated importance "
                            "weight was clamped", when="loss.is_correction = tis")
MIS_MASKED_FRAC = _declare("mis_masked_frac", "fraction", GAUGE, "train", "tokens masked by the masked importance "
                           "correction", when="loss.is_correction = mis")
SC_CORRECTION = _declare("sc_correction", "loss", GAUGE, "train", "score-centering correction term",
                         when="loss.use_score_centering")
NLL = _declare("nll", "nats/token", GAUGE, "train", "demonstrated tokens' mean negative log-likelihood", SFT)

# -- SFT's own -------------------------------------------------------------------------------------------------
DEMONSTRATIONS = _declare("demonstrations", "rollouts", COUNTER, "train", "demonstrations in the SFT batch", SFT)
EPOCH = _declare("epoch", "epochs", GAUGE, "train", "epoch of the demonstration order after the step", SFT)

# -- rollouts and advantages -------------------------------------------------------------------------------------
TRAINED = _declare("trained", "bool", GAUGE, "rollout", "1 when the step ran an optimizer step, 0 when its batch "
                   "had no signal")
WEIGHT_VERSION = _declare("weight_version", "version", GAUGE, "train", "policy weight version after the step",
                          TRAIN, SFT)
ROLLOUTS = _declare("rollouts", "rollouts", COUNTER, "rollout", "rollouts this step sampled (replaced groups too; "
                    "rollout-check, screen: the session's)", TRAIN, *SESSIONS)
ADMITTED_ROLLOUTS = _declare("admitted_rollouts", "rollouts", COUNTER, "rollout", "rollouts admitted to training "
                             "(not excluded as infrastructure failures)")
EXCLUDED_ROLLOUTS = _declare("excluded_rollouts", "rollouts", COUNTER, "rollout", "rollouts that ended in an "
                             "infrastructure failure (training excludes them from advantages and loss)", TRAIN,
                             *SESSIONS)
CANCELLED_ROLLOUTS = _declare("cancelled_rollouts", "rollouts", COUNTER, "rollout", "rollouts cancelled in flight "
                              "(their group went stale or the run stopped)")
REFILLS = _declare("refills", "rollouts", COUNTER, "rollout", "infrastructure failures re-run in their slot")
REWARD_MEAN = _declare("reward_mean", "reward", GAUGE, "rollout", "mean reward of the step's admitted rollouts "
                       "(rollout-check, screen: of the graded ones that did not fail for an infrastructure reason)",
                       TRAIN, *SESSIONS, when="some admitted rollout has a reward")
SOLVE_RATE = _declare("solve_rate", "fraction", GAUGE, "rollout", "admitted rollouts with reward >= "
                      "the solved reward (1: graders give 0 or 1)", TRAIN, *SESSIONS,
                      when="some admitted rollout has a reward")
SAMPLED_TOKENS = _declare("sampled_tokens", "tokens", COUNTER, "rollout", "loss-masked tokens the step's "
                          "(the session's) rollouts sampled", TRAIN, *SESSIONS)
CONTROL_ZERO_ADVANTAGE = _declare("control_zero_advantage", "bool", GAUGE, "rollout", "1: a control arm "
                                  "(train.control = zero_advantage): the loss saw every advantage as 0",
                                  when="train.control = zero_advantage")
ZERO_ADVANTAGE_GROUPS = _declare("zero_advantage_groups", "groups", COUNTER, "rollout", "trained groups whose "
                                 "advantages were all zero (equal rewards)")
ALL_SOLVED_GROUPS = _declare("all_solved_groups", "groups", COUNTER, "rollout", "groups in which every rollout "
                             "solved the task")
ALL_FAILED_GROUPS = _declare("all_failed_groups", "groups", COUNTER, "rollout", "groups in which no rollout "
                             "solved the task")
ZERO_VARIANCE_GROUPS = _declare("zero_variance_groups", "groups", COUNTER, "rollout", "groups with equal rewards "
                                "seen this step, replaced ones too")
REPLACED_GROUPS = _declare("replaced_groups", "groups", COUNTER, "rollout", "zero-variance groups replaced by "
                           "oversampling")
STALE_GROUPS = _declare("stale_groups", "groups", COUNTER, "rollout", "groups dropped as older than "
                        "rollout.max_staleness")
TASKS_RETIRED = _declare("tasks_retired", "tasks", GAUGE, "rollout", "tasks retired so far "
                         "(train.retire_zero_variance_after)")

# -- staleness: how old what a step trains is, in policies ----------------------------------------------------
POLICY_LAG_MEAN = _declare("policy_lag_mean", "steps", GAUGE, "staleness", "mean over trained rollouts of the "
                           "step minus the policy the rollout started on (0: synchronous)")
POLICY_LAG_MAX = _declare("policy_lag_max", "steps", GAUGE, "staleness", "largest policy lag of a trained rollout")
TOKENS_AGE = _declare("tokens_age/{age}", "tokens", DISTRIBUTION, "staleness", "sampled tokens by age in "
                      "policies (the step minus the policy whose weights produced the token)",
                      when="only ages that occurred")
ROLLOUTS_CROSSED_VERSION = _declare("rollouts_crossed_version", "rollouts", COUNTER, "staleness", "rollouts whose "
                                    "tokens came from more than one weight version")
TURNS_CROSSED_VERSION = _declare("turns_crossed_version", "turns", COUNTER, "staleness", "turns sampled on newer "
                                 "weights than their rollout's first turn")
TOKENS_DROPPED_STALE = _declare("tokens_dropped_stale", "tokens", COUNTER, "staleness", "sampled tokens masked "
                                "out as older than the bound", when="rollout.partial_rollouts = drop")

# -- timing ----------------------------------------------------------------------------------------------------
TIME_ROLLOUT_S = _declare("time_rollout_s", "s", GAUGE, "timing", "time the step waited for its rollouts "
                          "(rollout-check, screen: the session's rollouts from first start to last end)", TRAIN,
                          *SESSIONS)
TIME_TRAIN_S = _declare("time_train_s", "s", GAUGE, "timing", "time of the train phase (logprob recompute and "
                        "optimizer steps)", TRAIN, SFT)
TIME_SYNC_S = _declare("time_sync_s", "s", GAUGE, "timing", "time of the weight sync to the engines")
TIME_STEP_S = _declare("time_step_s", "s", GAUGE, "timing", "rollout wait + train + sync")
TIME_SYNC_DRAIN_S = _declare("time_sync_drain_s", "s", GAUGE, "timing", "part of the sync spent waiting for "
                             "requests in flight", when="the engines are synced over HTTP (WeightSync)")
TIME_SYNC_STAGE_S = _declare("time_sync_stage_s", "s", GAUGE, "timing", "part of the sync spent staging the "
                             "weights", when="the engines are synced over HTTP (WeightSync)")
SLOTS_IDLE_FRACTION = _declare("slots_idle_fraction", "fraction", GAUGE, "timing", "share of rollout-slot time "
                               "no rollout ran", when="the scheduler measured slot time")
SLOTS_WASTED_FRACTION = _declare("slots_wasted_fraction", "fraction", GAUGE, "timing", "share of rollout-slot "
                                 "time spent on rollouts not trained", when="the scheduler measured slot time")

# -- consistency: rollout vs trainer logprobs of the trained tokens, before the update ---------------------------
CONSISTENCY_SPLITS = ("bridged", "full", "first_segment", "later_segments")
"""The per-kind splits of the consistency figures (``train.consistency.KINDS``)."""
_CONSISTENCY_FIELDS = {
    "tokens": ("tokens", COUNTER, "trained tokens compared"),
    "pearson": ("correlation", GAUGE, "Pearson correlation of rollout and trainer logprobs"),
    "mean_abs_diff": ("nats", GAUGE, "mean |trainer - rollout| logprob"),
    "p99_abs_diff": ("nats", GAUGE, "99th percentile of |trainer - rollout| logprob"),
    "max_abs_diff": ("nats", GAUGE, "largest |trainer - rollout| logprob"),
    "k3_kl": ("nats", GAUGE, "k3 estimate of KL(rollout || trainer) per token"),
}
CONSISTENCY = {f: _declare(f"consistency/{f}", unit, kind, "consistency", meaning + ", all trained tokens",
                           when=_TRAINED + "; pearson needs two tokens")
               for f, (unit, kind, meaning) in _CONSISTENCY_FIELDS.items()}
"""Overall figures by field name."""
CONSISTENCY_BY_SPLIT = {f: _declare(f"consistency/{{split}}/{f}", unit, kind, "consistency",
                                    meaning + ", per split", when="the split has trained tokens",
                                    choices=CONSISTENCY_SPLITS)
                        for f, (unit, kind, meaning) in _CONSISTENCY_FIELDS.items()}
"""Per-split families by field name (``consistency/bridged/k3_kl``...)."""


# -- tokenisation health: how the adapter's prompts became training segments (trajectory.TrajectoryStats) ---------
_RECORDED = "some rollout of the step recorded turns"
SEGMENTS_PER_ROLLOUT = _declare("segments_per_rollout", "segments", GAUGE, "tokenisation", "mean segments per "
                                "rollout that recorded turns (1: one chain; side requests add their own)",
                                when=_RECORDED)
SEGMENTS_PER_ROLLOUT_MAX = _declare("segments_per_rollout_max", "segments", GAUGE, "tokenisation", "most segments "
                                    "of one rollout", when=_RECORDED)
FALSE_FORKS = _declare("false_forks", "segments", COUNTER, "tokenisation", "new segments on a chain that already "
                       "had one although the prompt did not change (no compaction, edited history, new tools or "
                       "kwargs, retry): a re-render that did not reproduce the sampled ids", when=_RECORDED)
REPEATED_PROMPT_TOKENS = _declare("repeated_prompt_tokens", "tokens", COUNTER, "tokenisation", "context tokens "
                                  "new segments start with that an earlier segment of the rollout already holds "
                                  "(trained more than once)", when=_RECORDED)
RENDER_FALLBACKS = _declare("render_fallbacks", "turns", COUNTER, "tokenisation", "turns fully re-rendered "
                            "although their chain had an earlier turn to bridge from", when=_RECORDED)
PARSE_FAILURES = _declare("parse_failures", "calls", COUNTER, "tokenisation", "tool calls the adapter could not "
                          "parse (handed back to the CLI as text)", when=_RECORDED)

# -- held-out evaluation (train.eval_every): the policy after the step's sync, on train.eval_data ----------------
_EVALUATED = "the step ran a held-out evaluation (train.eval_every, and the last step)"
EVAL_PASS_AT_1 = _declare("eval/pass_at_1", "fraction", GAUGE, "eval", "mean over held-out rows of the share of "
                          "their graded rollouts that solved the row", when=_EVALUATED + " and a rollout was graded")
EVAL_REWARD_MEAN = _declare("eval/reward_mean", "reward", GAUGE, "eval", "mean reward of the graded held-out "
                            "rollouts", when=_EVALUATED + " and a rollout was graded")
EVAL_ROWS = _declare("eval/rows", "rows", COUNTER, "eval", "held-out rows with at least one graded rollout",
                     when=_EVALUATED)
EVAL_INFRASTRUCTURE_FAILURES = _declare("eval/infrastructure_failures", "rollouts", COUNTER, "eval", "held-out "
                                        "rollouts that ended in an infrastructure failure (not graded)",
                                        when=_EVALUATED)


METRICS: tuple[Metric, ...] = tuple(_ALL)
"""Every declaration, in the order above."""
_EXACT = {str(m): m for m in METRICS if not m.is_family}
_FAMILIES = [m for m in METRICS if m.is_family]


def declaration(name: str) -> Metric | None:
    """The declaration that covers ``name`` (a metric, or a member of a family), or None."""
    hit = _EXACT.get(name)
    if hit is not None:
        return hit
    return next((m for m in _FAMILIES if m.covers(name)), None)


def declared_values(run_kind: RunKind, values: Mapping[str, float]) -> dict[str, float]:
    """``values`` as a row's plain dict, after checking every name is declared for ``run_kind``."""
    for name in values:
        m = declaration(name)
        if m is None or run_kind not in m.written_by:
            raise UndeclaredMetric(name, run_kind, m)
    return {str(k): float(v) for k, v in values.items()}


def _checked(metric: object) -> Metric:
    if not isinstance(metric, Metric):
        raise TypeError(f"read {metric!r} through its declaration in lego_rl.runstore.metric_catalog, not by name")
    return metric


def read(values: Mapping[str, float], metric: Metric) -> float | None:
    """The value of ``metric`` in a row's values; None when the row does not hold it."""
    if _checked(metric).is_family:
        raise TypeError(f"{metric} is a family: read it with read_family")
    return values.get(metric)


def require(values: Mapping[str, float], metric: Metric) -> float:
    """The value of ``metric``, which the row must hold (a ``KeyError`` naming it otherwise)."""
    value = read(values, metric)
    if value is None:
        raise KeyError(f"the metrics row holds no {metric} (declared: {metric.meaning}; written when: "
                       f"{metric.when or 'always'})")
    return value


def read_family(values: Mapping[str, float], family: Metric) -> dict[str, float]:
    """The members of ``family`` in a row's values, by placeholder value, in the row's order."""
    if not _checked(family).is_family:
        raise TypeError(f"{family} is one metric: read it with read")
    out = {}
    for name, v in values.items():
        member = family.member(name)
        if member is not None:
            out[member] = v
    return out


def declarations_in(values: Mapping[str, float]) -> tuple[list[Metric], list[str]]:
    """The declarations covering a row's names (each once, in catalog order) and the names none covers: what
    a view that shows everything a row holds (the HTML report's other metrics) iterates, instead of names."""
    found: set[Metric] = set()
    unknown = []
    for name in values:
        m = declaration(name)
        if m is None:
            unknown.append(name)
        else:
            found.add(m)
    return [m for m in METRICS if m in found], unknown


_RESOLVED: dict[str, tuple[Metric, str | None] | None] = {}
"""name → (declaration, family member or None), or None when undeclared: ``declaration`` is a scan of the
families, a whole run's rows repeat the same few dozen names."""


def read_all(values: Mapping[str, float]) -> Iterator[tuple[Metric, str | None, float]]:
    """Every value of a row with its declaration and, for a family member, the placeholder's value; a name no
    declaration covers is left out (a reader shows only what is declared). One pass over the row, for views
    that draw every metric (the monitor's Curves)."""
    for name, v in values.items():
        if name not in _RESOLVED:
            m = declaration(name)
            _RESOLVED[name] = None if m is None else (m, m.member(name) if m.is_family else None)
        hit = _RESOLVED[name]
        if hit is not None:
            yield hit[0], hit[1], v


def tag(metric: Metric, name: str | None = None) -> str:
    """Where a sink files a value (TensorBoard, W&B): under its group (``train/loss``, ``timing/time_step_s``;
    ``consistency/...`` names already are). ``name`` is a family member's name; a distribution is filed as
    one histogram under the family's stem (``staleness/tokens_age``), never one tag per member."""
    if metric.kind is DISTRIBUTION:
        name = _PLACEHOLDER.split(metric, maxsplit=1)[0].rstrip("/")
    name = name if name is not None else str(metric)
    return name if name.startswith(metric.group + "/") else f"{metric.group}/{name}"


def written_by(run_kind: RunKind) -> list[Metric]:
    """The declarations a run kind writes."""
    return [m for m in METRICS if run_kind in m.written_by]
