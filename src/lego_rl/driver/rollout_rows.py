"""The metrics row of a session that rolls out without training (``lego rollout-check``, ``lego tasks screen``).

Such a run has no optimizer steps, but it has what an operator compares across runs: how many rollouts ran,
how many failed for an infrastructure reason, their reward and solve rate, the tokens sampled, the time the
session's rollouts took, and the termination mix. Each session writes one row through the metric declarations
(the same names a training step writes, declared for these run kinds too), numbered like training steps: the
first session of a run directory is step 0, a later one (a screen topped up in the same directory) the next.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from lego_rl.rollout.generate import RolloutResult
from lego_rl.runstore import RunDir, StepMetrics, follow_metrics
from lego_rl.runstore import metric_catalog as mc

SOLVED_REWARD = 1.0
"""A rollout solved its task at this reward (the graders give 0 or 1; rollout-check's ``rewarded`` counts the
same)."""


def rollout_values(run_kind: mc.RunKind, results: Sequence[RolloutResult], *, seconds: float) -> dict[str, float]:
    """The declared values of ``results``: a reward mean and solve rate over the rollouts that were graded and
    did not fail for an infrastructure reason (absent when none was)."""
    scored = [r.reward for r in results if r.reward is not None and not r.infrastructure_failure]
    values: dict[str, float] = {
        mc.ROLLOUTS: float(len(results)),
        mc.EXCLUDED_ROLLOUTS: float(sum(1 for r in results if r.infrastructure_failure)),
        mc.SAMPLED_TOKENS: float(sum(s.num_trained_tokens for r in results for s in r.samples)),
        mc.TIME_ROLLOUT_S: max(seconds, 0.0),
    }
    if scored:
        values[mc.REWARD_MEAN] = sum(scored) / len(scored)
        values[mc.SOLVE_RATE] = sum(1 for x in scored if x >= SOLVED_REWARD) / len(scored)
    return mc.declared_values(run_kind, values)


def write_session_row(run: RunDir, run_kind: mc.RunKind, results: Sequence[RolloutResult], *, started_at: float,
                      finished_at: float) -> StepMetrics:
    """Append the session's row to the run's ``metrics.jsonl`` (step: the rows already there)."""
    step = sum(1 for _ in follow_metrics(run.layout.metrics).read()) if run.layout.metrics.exists() else 0
    row = StepMetrics(step=step, started_at=started_at, finished_at=max(finished_at, started_at),
                      values=rollout_values(run_kind, results, seconds=finished_at - started_at),
                      terminations=dict(Counter(r.termination for r in results)))
    run.metrics.append(row)
    return row
