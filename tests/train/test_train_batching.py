"""Packing: a rollout's segments stay in one optimizer step and share one loss denominator."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from train_samples import rollout

from lego_rl.errors import ConfigError
from lego_rl.train.batching import plan_steps


def test_segments_split_over_micro_batches_share_their_rollouts_denominator():
    samples = rollout("a", 0, 1.0, segments=3, trained=2, context=3) + rollout("b", 0, 0.0, trained=4, context=1)
    (step,) = plan_steps(samples, [1.0] * 3 + [-1.0], max_tokens_per_micro_batch=5)
    assert len(step.micro_batches) == 4  # every segment is 5 tokens: one per micro-batch
    assert dict(zip(step.rollout_ids, step.rollout_token_counts, strict=True)) == {"a": 6, "b": 4}
    # Per-token weight = 1 / (rollout's trained tokens * rollouts in step), wherever the segment landed.
    for mb in step.micro_batches:
        (i,) = mb.sample_indices
        expected = (1 / (6 * 2)) if samples[i].rollout_id == "a" else (1 / (4 * 2))
        assert mb.token_weights.tolist() == pytest.approx([expected * m for m in samples[i].loss_mask])
        assert mb.advantages.tolist() == [[1.0, -1.0][samples[i].rollout_id == "b"]] * 5
        assert mb.position_ids.tolist() == list(range(5)) and mb.cu_seqlens.tolist() == [0, 5]


def test_packed_layout_of_one_micro_batch():
    samples = rollout("a", 0, 1.0, segments=2, trained=1, context=2)
    (step,) = plan_steps(samples, [0.5, 0.5], max_tokens_per_micro_batch=100)
    (mb,) = step.micro_batches
    assert mb.input_ids.tolist() == samples[0].tokens + samples[1].tokens
    assert mb.position_ids.tolist() == [0, 1, 2, 0, 1, 2] and mb.cu_seqlens.tolist() == [0, 3, 6]
    assert mb.loss_mask.tolist() == [0, 0, 1, 0, 0, 1] and mb.rollout_slots.tolist() == [0] * 6
    assert mb.rollout_logprobs.tolist() == [0.0, 0.0, -0.5, 0.0, 0.0, -0.5]


def test_bad_plans_are_refused_with_the_parameter_to_change():
    samples = rollout("a", 0, 1.0, trained=5, context=5)
    with pytest.raises(ConfigError, match=r"has 10 tokens, more than max_tokens_per_micro_batch=8; raise it"):
        plan_steps(samples, [0.0], max_tokens_per_micro_batch=8)
    with pytest.raises(ConfigError, match="num_steps=2 but only 1 rollouts") as err:
        plan_steps(samples, [0.0], num_steps=2, max_tokens_per_micro_batch=64)
    assert err.value.parameter == "num_steps"
    with pytest.raises(ValueError, match="1 advantages for 2 samples"):
        plan_steps(samples * 2, [0.0], max_tokens_per_micro_batch=64)


ROLLOUTS = st.lists(st.tuples(st.integers(1, 4), st.integers(1, 6), st.integers(0, 6)), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(ROLLOUTS, st.integers(1, 4), st.integers(12, 40))
def test_rollouts_never_straddle_steps_and_step_loss_is_the_mean_of_rollout_means(spec, num_steps, budget):
    samples = []
    for k, (segments, trained, context) in enumerate(spec):
        samples += rollout(f"r{k}", k % 3, float(k % 2), segments, trained=trained, context=context)
    num_steps = min(num_steps, len(spec))
    steps = plan_steps(samples, [0.0] * len(samples), num_steps=num_steps, max_tokens_per_micro_batch=budget)
    step_of: dict[str, int] = {}
    seen: list[int] = []
    for n, step in enumerate(steps):
        per_token_loss = {}
        for mb in step.micro_batches:
            assert mb.num_tokens <= budget
            seen += mb.sample_indices
            for i in mb.sample_indices:
                assert step_of.setdefault(samples[i].rollout_id, n) == n  # never in two steps
            loss = torch.arange(mb.num_tokens, dtype=torch.float32)  # any per-token loss
            for slot in mb.rollout_slots.unique().tolist():
                sel = mb.rollout_slots == slot
                acc = per_token_loss.setdefault(slot, [0.0, 0.0])
                acc[0] += float((mb.token_weights[sel] * loss[sel]).sum())
                acc[1] += float((mb.loss_mask[sel] * loss[sel]).sum())
        r = len(step.rollout_ids)
        for slot, (weighted, raw) in per_token_loss.items():
            # weighted sum == rollout's mean over its trained tokens / rollouts in the step
            # fp32 sums of the same weighted terms in another grouping (per micro-batch): ulps of the total.
            assert weighted == pytest.approx(raw / step.rollout_token_counts[slot] / r, rel=1e-5, abs=1e-6)
    assert sorted(seen) == list(range(len(samples)))  # every segment trained, once
