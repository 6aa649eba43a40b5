"""``train.infra_failure_policy`` maps onto ``AdmissionPolicy`` through one function, for every value."""

from __future__ import annotations

from typing import get_args

import pytest
from train_samples import rollout

from lego_rl.config.schema import InfraFailurePolicy
from lego_rl.termination import INFRASTRUCTURE_FAILURES
from lego_rl.termination import TerminationReason as T
from lego_rl.train.advantages import AdmissionPolicy, admission_policy, admit, grpo_advantages


def samples():  # type: ignore[no-untyped-def]
    return (rollout("ok", 0, 1.0, 2) + rollout("sbx", 0, None, 1, termination=T.SANDBOX_SETUP)
            + rollout("turns", 0, 0.0, 1, termination=T.TURN_LIMIT))


def test_every_config_value_has_a_policy() -> None:
    assert set(get_args(InfraFailurePolicy)) == {"exclude", "zero_reward"}
    for value in get_args(InfraFailurePolicy):
        assert isinstance(admission_policy(value), AdmissionPolicy)
    with pytest.raises(ValueError, match="unknown infra_failure_policy 'ignore'"):
        admission_policy("ignore")  # type: ignore[arg-type]


def test_exclude_is_the_default_policy() -> None:
    policy = admission_policy("exclude")
    assert policy == AdmissionPolicy() and policy.excluded == INFRASTRUCTURE_FAILURES
    kept, report = admit(samples(), policy)
    assert sorted({s.rollout_id for s in kept}) == ["ok", "turns"]
    assert report.excluded_rollouts == {"sandbox_setup": 1} and report.zero_rewarded_rollouts == {}


def test_zero_reward_keeps_infrastructure_failures_as_failed_attempts() -> None:
    policy = admission_policy("zero_reward")
    assert policy.excluded == frozenset() and policy.zero_reward == INFRASTRUCTURE_FAILURES
    kept, report = admit(samples(), policy)
    assert [(s.rollout_id, s.reward) for s in kept] == [("ok", 1.0), ("ok", 1.0), ("sbx", 0.0), ("turns", 0.0)]
    assert report.zero_rewarded_rollouts == {"sandbox_setup": 1} and report.admitted_rollouts == 3
    # The failed attempt now counts in its group: "ok" is above a mean of 1/3.
    adv = grpo_advantages(kept)
    assert adv.per_rollout["ok"] > 0 > adv.per_rollout["sbx"]


def test_a_reason_cannot_be_both_excluded_and_zeroed() -> None:
    with pytest.raises(ValueError, match="both excluded and zero-rewarded"):
        AdmissionPolicy(zero_reward=frozenset({T.GRADER_ERROR}))
