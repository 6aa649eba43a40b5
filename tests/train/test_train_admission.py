"""Termination taxonomy and admission: infrastructure failures leave statistics and loss, counted."""

from __future__ import annotations

import pytest
from train_samples import rollout

from lego_rl.errors import GraderError, HarnessError, ProviderError, SandboxTimeout, TrajectoryError
from lego_rl.termination import (
    INFRASTRUCTURE_FAILURES,
    POLICY_OUTCOMES,
    is_infrastructure_failure,
    is_policy_outcome,
    parse_termination,
    reason_for_error,
)
from lego_rl.termination import TerminationReason as T
from lego_rl.train.advantages import AdmissionPolicy, admit


def test_taxonomy_is_closed_and_split_in_two():
    assert {r.value for r in POLICY_OUTCOMES} >= {
        "completed", "agent_error_exit", "turn_limit", "context_limit", "time_budget", "tampered", "grading_blocked", "suspect_patch"
    }
    # Other areas may add infrastructure reasons (e.g. a sandbox lost mid-run); these must stay there.
    assert {r.value for r in INFRASTRUCTURE_FAILURES} >= {
        "sandbox_setup", "harness_install", "adapter_error", "engine_error", "grader_error",
        "guard_timeout", "weight_sync_interrupted",
    }
    assert POLICY_OUTCOMES | INFRASTRUCTURE_FAILURES == set(T) and not POLICY_OUTCOMES & INFRASTRUCTURE_FAILURES
    assert is_infrastructure_failure("guard_timeout") and not is_infrastructure_failure(T.TIME_BUDGET)
    assert is_policy_outcome("context_limit")


def test_unknown_reason_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown termination reason 'oom'; expected one of: completed"):
        parse_termination("oom")


def test_errors_map_to_reasons():
    assert reason_for_error(SandboxTimeout("x")) is T.SANDBOX_SETUP
    assert reason_for_error(HarnessError("x")) is T.HARNESS_INSTALL
    assert reason_for_error(ProviderError("x")) is T.ENGINE_ERROR
    assert reason_for_error(GraderError("x")) is T.GRADER_ERROR
    assert reason_for_error(TrajectoryError("x")) is T.ADAPTER_ERROR
    assert reason_for_error(KeyError("x")) is None


def test_infrastructure_failures_are_excluded_and_counted_limits_keep_their_reward():
    samples = (
        rollout("ok", 0, 1.0, 3)
        + rollout("turns", 0, 0.0, 2, termination=T.TURN_LIMIT)
        + rollout("sbx", 0, 0.0, 2, termination=T.SANDBOX_SETUP)
        + rollout("sbx2", 1, None, 1, termination=T.SANDBOX_SETUP)
        + rollout("grader", 1, None, 4, termination=T.GRADER_ERROR)
    )
    kept, report = admit(samples)
    assert [s.rollout_id for s in kept] == ["ok"] * 3 + ["turns"] * 2
    assert report.admitted_rollouts == 2 and report.admitted_samples == 5
    assert report.excluded_rollouts == {"sandbox_setup": 2, "grader_error": 1}
    assert report.excluded_samples == 7
    assert "weight_sync_interrupted" in report.excluded_reasons


def test_the_operator_can_change_the_policy():
    samples = rollout("a", 0, 0.0, termination=T.GUARD_TIMEOUT) + rollout("b", 0, 0.0, termination=T.TURN_LIMIT)
    kept, report = admit(samples, AdmissionPolicy(excluded=frozenset({T.TURN_LIMIT})))
    assert [s.rollout_id for s in kept] == ["a"] and report.excluded_rollouts == {"turn_limit": 1}
    with pytest.raises(ValueError):
        AdmissionPolicy(excluded=frozenset({"not-a-reason"}))


def test_admission_refuses_incomplete_rollouts():
    with pytest.raises(TrajectoryError, match="rollout 'x' has no termination reason"):
        admit(rollout("x", 0, 1.0, termination=None))
    with pytest.raises(TrajectoryError, match=r"rollout 'y' \(completed\) is admitted but has no reward"):
        admit(rollout("y", 0, None))
    mixed = rollout("z", 0, 1.0, 2)
    mixed[1] = mixed[1].model_copy(update={"reward": 0.0})
    with pytest.raises(TrajectoryError, match="rollout 'z': segments disagree on reward"):
        admit(mixed)
