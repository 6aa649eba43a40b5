"""The metrics row of a session that rolls out without training (rollout-check, tasks screen): its values through
the declarations of its run kind, every declaration such a session always writes present, one row per session
numbered like steps, and the row as the monitor reads it. The results are built here (a rollout's outcome is
plain data); the sessions that write the row with real rollouts are tests/rollout/test_rollout_check_cli.py and
tests/rollout/test_tasks_screen_rollouts.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from lego_rl.driver.rollout_rows import rollout_values, write_session_row
from lego_rl.rollout.generate import RolloutResult
from lego_rl.runstore import RunDir
from lego_rl.runstore import metric_catalog as mc
from lego_rl.runstore.log import follow_metrics
from lego_rl.termination import TerminationReason as TR
from lego_rl.trajectory.sample import Sample


def _result(i: int, termination: TR, reward: float | None, sampled: int) -> RolloutResult:
    samples = [Sample(rollout_id=f"r{i}", group_index=0, index=i, tokens=[1, 2] + [3] * sampled,
                      loss_mask=[0, 0] + [1] * sampled, rollout_logprobs=[0.0, 0.0] + [-1.0] * sampled,
                      reward=reward, termination=termination)] if sampled else []
    return RolloutResult(rollout_id=f"r{i}", instance_id="t", harness="claude_code", termination=termination,
                         reward=reward, samples=samples, timings={}, artifacts=None, index=i)


RESULTS = [_result(0, TR.COMPLETED, 1.0, 5), _result(1, TR.COMPLETED, 0.0, 3),
           _result(2, TR.TIME_BUDGET, 0.0, 2), _result(3, TR.SANDBOX_SETUP, None, 0)]


@pytest.mark.parametrize("kind", mc.SESSIONS)
def test_values_are_declared_for_the_session_kind_and_count_what_happened(kind: mc.RunKind) -> None:
    values = rollout_values(kind, RESULTS, seconds=12.5)
    assert values == {mc.ROLLOUTS: 4.0, mc.EXCLUDED_ROLLOUTS: 1.0, mc.SAMPLED_TOKENS: 10.0, mc.TIME_ROLLOUT_S: 12.5,
                      mc.REWARD_MEAN: pytest.approx(1 / 3), mc.SOLVE_RATE: pytest.approx(1 / 3)}
    always = {str(m) for m in mc.written_by(kind) if m.when is None and not m.is_family}
    assert always <= set(values), always - set(values)
    with pytest.raises(mc.UndeclaredMetric, match="declared for"):
        mc.declared_values(kind, {mc.LOSS: 1.0})  # a session trains nothing


def test_nothing_graded_writes_no_reward() -> None:
    values = rollout_values(mc.ROLLOUT_CHECK, [_result(0, TR.SANDBOX_SETUP, None, 0)], seconds=1.0)
    assert mc.read(values, mc.REWARD_MEAN) is None and mc.read(values, mc.SOLVE_RATE) is None
    assert values[mc.EXCLUDED_ROLLOUTS] == 1.0


def test_one_row_per_session_numbered_like_steps(tmp_path: Path) -> None:
    run = RunDir.open(tmp_path / "screen", config={})
    first = write_session_row(run, mc.TASKS_SCREEN, RESULTS, started_at=100.0, finished_at=110.0)
    run.close()
    run = RunDir.open(tmp_path / "screen", config={}, resume=True)  # topped up in the same directory
    second = write_session_row(run, mc.TASKS_SCREEN, RESULTS[:1], started_at=200.0, finished_at=203.0)
    run.close()
    rows = list(follow_metrics(run.layout.metrics).read())
    assert [(r.step, mc.read(r.values, mc.ROLLOUTS)) for r in rows] == [(0, 4.0), (1, 1.0)] == [
        (first.step, 4.0), (second.step, 1.0)]
    assert rows[0].terminations == {TR.COMPLETED: 2, TR.TIME_BUDGET: 1, TR.SANDBOX_SETUP: 1}
    assert mc.read(rows[1].values, mc.TIME_ROLLOUT_S) == 3.0
