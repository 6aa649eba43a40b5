"""GRPO over distinct rollouts: unequal fork counts, shuffled groups, singleton and uniform groups."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from train_samples import rollout

from lego_rl.errors import TrajectoryError
from lego_rl.train.advantages import grpo_advantages, rollout_mean_log_ratio


def test_unequal_fork_counts_count_each_run_once():
    samples = rollout("a", 0, 1.0, segments=20) + rollout("b", 0, 0.0, segments=1)
    adv = grpo_advantages(samples)
    # Population std of {1, 0} is 0.5: +-1, whatever the number of segments; the std's eps (1e-6) moves
    # that by 0.5e-6 / 0.5 = 2e-6, hence 1e-5 (no rounding beyond fp32 ulps of 1 in play).
    assert adv.per_rollout == pytest.approx({"a": 1.0, "b": -1.0}, abs=1e-5)
    assert adv.per_sample.tolist() == pytest.approx([1.0] * 20 + [-1.0], abs=1e-5)
    assert (adv.stats.rollouts, adv.stats.samples) == (2, 21)


def test_shuffled_prompt_groups_give_the_same_advantages():
    samples = []
    for g in range(4):
        for i in range(3):
            samples += rollout(f"g{g}r{i}", g, float((g + i) % 2), segments=1 + (g * i) % 3, index=i)
    ref = grpo_advantages(samples).per_rollout
    for seed in range(5):
        shuffled = samples[:]
        random.Random(seed).shuffle(shuffled)
        adv = grpo_advantages(shuffled)
        assert adv.per_rollout == pytest.approx(ref)
        assert adv.per_sample.tolist() == pytest.approx([ref[s.rollout_id] for s in shuffled])


def test_singleton_and_uniform_groups_get_zero_and_are_counted():
    samples = (
        rollout("single", 0, 1.0, 3)
        + rollout("s1", 1, 1.0) + rollout("s2", 1, 1.0, 4)
        + rollout("f1", 2, 0.0) + rollout("f2", 2, 0.0)
        + rollout("h1", 3, 0.5) + rollout("h2", 3, 0.5)
        + rollout("m1", 4, 1.0) + rollout("m2", 4, 0.0)
    )
    adv = grpo_advantages(samples)
    assert all(adv.per_rollout[r] == 0.0 for r in ("single", "s1", "s2", "f1", "f2", "h1", "h2"))
    st_ = adv.stats
    assert (st_.groups, st_.uniform_groups, st_.singleton_groups) == (5, 4, 1)
    assert (st_.all_solved_groups, st_.all_failed_groups, st_.uniform_other_groups) == (2, 1, 1)


def test_without_std_scaling_advantages_are_centred_rewards():
    adv = grpo_advantages(rollout("a", 0, 3.0) + rollout("b", 0, 1.0, 2), scale_by_std=False)
    assert adv.per_rollout == {"a": 1.0, "b": -1.0}


def test_missing_reward_is_refused():
    with pytest.raises(TrajectoryError, match="rollout 'a' has reward None"):
        grpo_advantages(rollout("a", 0, None))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.sampled_from([0.0, 0.5, 1.0, 2.0]), st.integers(1, 5)),
                min_size=1, max_size=25))
def test_group_advantages_sum_to_zero_over_distinct_rollouts(spec):
    samples = []
    for k, (group, reward, segments) in enumerate(spec):
        samples += rollout(f"r{k}", group, reward, segments)
    adv = grpo_advantages(samples)
    for group in {g for g, _, _ in spec}:
        values = [adv.per_rollout[f"r{k}"] for k, (g, _, _) in enumerate(spec) if g == group]
        assert abs(sum(values)) < 1e-6  # a mean-centred group of a few values of order 1: ulps of 1
    for s, a in zip(samples, adv.per_sample, strict=True):  # broadcast: every segment has its run's value
        assert a == adv.per_rollout[s.rollout_id]
    assert np.isfinite(adv.per_sample).all()


def test_gspo_sequence_ratio_pools_segments_of_a_rollout():
    torch.manual_seed(0)
    lr = [torch.randn(5), torch.randn(4), torch.randn(3)]
    masks = [torch.tensor([0, 1, 1, 0, 1.0]), torch.tensor([1, 1, 0, 0.0]), torch.tensor([1, 1, 1.0])]
    out = rollout_mean_log_ratio(lr, masks, ["a", "b", "a"])
    joined = torch.cat([lr[0], lr[2]])[torch.cat([masks[0], masks[2]]).bool()]
    assert torch.allclose(out["a"], joined.mean()) and torch.allclose(out["b"], lr[1][:2].mean())
    with pytest.raises(ValueError, match="shape"):
        rollout_mean_log_ratio([torch.zeros(2)], [torch.zeros(3)], ["a"])
    with pytest.raises(TrajectoryError, match="no trained tokens"):
        rollout_mean_log_ratio([torch.zeros(2)], [torch.zeros(2)], ["a"])


def test_a_rollout_without_trainable_segments_still_counts_in_its_group():
    from lego_rl.train.advantages import SamplelessOutcome

    samples = rollout("a", 0, 1.0) + rollout("b", 0, 1.0, 2)
    alone = grpo_advantages(samples)
    assert alone.stats.all_solved_groups == 1 and alone.per_rollout["a"] == 0.0
    adv = grpo_advantages(samples, sampleless=[SamplelessOutcome(rollout_id="c", group_index=0, reward=0.0)])
    # mean 2/3, population std sqrt(2)/3: the two solved runs get +1/sqrt(2), the silent failure -sqrt(2)
    assert adv.per_rollout["a"] == pytest.approx(0.7071, abs=1e-3)
    assert adv.per_rollout["c"] == pytest.approx(-1.4142, abs=1e-3)
    assert adv.per_sample.shape == (3,) and adv.stats.rollouts == 3
    with pytest.raises(TrajectoryError, match="both as samples and as sampleless"):
        grpo_advantages(samples, sampleless=[SamplelessOutcome(rollout_id="a", group_index=0, reward=0.0)])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from([0.0, 1.0]), st.booleans()), min_size=1, max_size=12))
def test_excluded_infrastructure_failures_do_not_move_anyone_elses_advantage(spec):
    from lego_rl.termination import TerminationReason as T
    from lego_rl.train.advantages import admit

    samples, healthy = [], []
    for k, (group, reward, broken) in enumerate(spec):
        reason = T.ENGINE_ERROR if broken else T.COMPLETED
        rows = rollout(f"r{k}", group, reward, 1 + k % 3, termination=reason)
        samples += rows
        healthy += [] if broken else rows
    kept, report = admit(samples)
    assert kept == healthy and report.excluded_rollouts.get("engine_error", 0) == sum(b for *_, b in spec)
    if healthy:
        assert grpo_advantages(kept).per_rollout == grpo_advantages(healthy).per_rollout
