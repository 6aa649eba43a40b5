"""The seed's branching cases: matched prefixes, skipped turns, split-output drift, changed token counts,
prompt-base restarts and shared prefixes, each checked exactly and against the global invariants."""

from __future__ import annotations

import pytest
from trajectory_records import assert_invariants, bridged, lp, rec

from lego_rl.trajectory.manager import TrajectoryOptions, build_samples

SYS = [100, 101, 102]  # system prompt + first user message


def build(records, **opts):
    samples, stats = build_samples(
        records, rollout_id="r0", group_index=3, index=1, reward=0.5, options=TrajectoryOptions(**opts)
    )
    trained = [r for r in records if r.kind == "main" or opts.get("train_side_turns", True)]
    assert_invariants(trained, samples)
    return samples, stats


def test_matched_prefixes_make_one_segment_with_exact_masks():
    t0 = rec(0, SYS, [10, 11, 12])
    t1 = bridged(1, t0, [200, 201], [13, 14])
    t2 = bridged(2, t1, [202], [15])
    (s,), stats = build([t0, t1, t2])
    assert s.tokens == t2.prompt_ids + t2.output_ids
    assert s.loss_mask == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 1]
    assert s.rollout_logprobs == [0.0] * 3 + lp(0, 3) + [0.0] * 2 + lp(1, 2) + [0.0] + lp(2, 1)
    assert (s.turns, s.reward, s.group_index, s.index, s.rollout_id) == ([0, 1, 2], 0.5, 3, 1, "r0")
    assert s.text == "<out 0><out 1><out 2>"
    assert stats.segments_started == 1 and stats.trained_tokens == 6 and stats.bridged_mismatches == 0


def test_full_render_that_token_matches_still_extends():
    t0 = rec(0, SYS, [10, 11])
    t1 = rec(1, SYS + [10, 11, 7], [12], mode="full")  # re-rendered, but identical tokens
    (s,), _ = build([t0, t1])
    assert s.loss_mask == [0, 0, 0, 1, 1, 0, 1]


def test_skipped_turn_numbers_and_interleaved_side_turns_keep_the_main_chain():
    t0 = rec(0, SYS, [10, 11])
    title = rec(1, [900, 901], [902], kind="side", side_label="title")
    t3 = bridged(3, t0, [200], [12])  # turn 2 never reached the records (count_tokens, say)
    t7 = bridged(7, t3, [201], [13])
    samples, stats = build([t0, title, t3, t7])
    main = [s for s in samples if 0 in s.turns]
    assert len(main) == 1 and main[0].turns == [0, 3, 7]
    assert [s.turns for s in samples if 1 in s.turns] == [[1]]
    assert stats.segments_started == 2
    skipped, st = build([t0, title, t3, t7], train_side_turns=False)
    assert len(skipped) == 1 and st.side_turns_skipped == 1


def test_abandoned_turn_is_its_own_branch_and_the_chain_continues_from_its_base():
    t0 = rec(0, SYS, [10, 11])
    t1 = bridged(1, t0, [200], [12, 13])  # client timed out: it never saw this answer
    t2 = rec(2, t1.prompt_ids, [14, 15], mode="bridged", bridge=len(SYS) + 2)  # retried, new sample
    t3 = bridged(3, t2, [201], [16])
    samples, stats = build([t0, t1, t2, t3])
    assert [s.turns for s in samples] == [[0, 1], [2, 3]]
    second = samples[1]
    assert second.tokens == t3.prompt_ids + t3.output_ids
    assert second.loss_mask[: len(t2.prompt_ids)] == [0] * len(t2.prompt_ids)  # t0's output is context here
    assert stats.bridged_mismatches == 1


def test_split_output_drift_starts_a_new_segment_and_keeps_the_original_output():
    t0 = rec(0, SYS, [10, 11, 12, 13])
    # The client split the answer (text + tool call) into two messages; the re-render adds a separator.
    t1 = rec(1, SYS + [10, 11, 50, 12, 13, 200], [14, 15])
    t2 = bridged(2, t1, [201], [16])
    samples, stats = build([t0, t1, t2])
    assert [s.turns for s in samples] == [[0], [1, 2]]
    first, second = samples
    assert first.tokens == SYS + [10, 11, 12, 13] and first.rollout_logprobs[3:] == lp(0, 4)
    assert sum(second.loss_mask[: len(t1.prompt_ids)]) == 0  # re-rendered history is context
    assert stats.merged_forks == 0 and stats.discarded_tokens == 0


def test_short_turn_rewrite_merging_is_opt_in_and_reports_what_it_discards():
    t0 = rec(0, SYS, [10, 11, 12, 13])
    t1 = rec(1, SYS + [10, 11, 50, 12, 13, 200], [14, 15])
    kept, _ = build([t0, t1], fork_merge_max_response_tokens=3)  # t0 has 4 sampled tokens: no merge
    assert len(kept) == 2
    samples, stats = build_samples(
        [t0, t1], rollout_id="r", group_index=0, index=0, reward=1.0,
        options=TrajectoryOptions(fork_merge_max_response_tokens=4),
    )
    (s,) = samples
    assert s.tokens == t1.prompt_ids + t1.output_ids
    assert s.loss_mask == [0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1]  # [10, 11] still match: still trained
    assert stats.merged_forks == 1 and stats.discarded_tokens == 2
    assert s.turns == [0, 1]


def test_changed_token_count_of_a_reencoded_output_forks():
    t0 = rec(0, SYS, [10, 11, 12])
    t1 = rec(1, SYS + [1011, 12, 200], [13])  # "10 11" re-encoded as one token: one fewer id
    samples, _ = build([t0, t1])
    assert [s.turns for s in samples] == [[0], [1]]
    assert samples[0].tokens == SYS + [10, 11, 12]


def test_prompt_base_restart_masks_the_regenerated_shared_prefix():
    t0 = rec(0, SYS, [10, 11, 12])
    t1 = bridged(1, t0, [200], [13])
    t2 = rec(2, SYS, [10, 11, 99])  # restart from the first prompt; same first two tokens sampled
    t3 = bridged(3, t2, [201], [14])
    samples, stats = build([t0, t1, t2, t3])
    assert [s.turns for s in samples] == [[0, 1], [2, 3]]
    restart = samples[1]
    assert restart.loss_mask[3:6] == [0, 0, 1]  # 10, 11 already trained with the same context
    assert restart.rollout_logprobs[3:6] == lp(2, 3)  # ids and logprobs still travel with the tokens
    assert stats.shared_prefix_tokens == 2


def test_sibling_branches_train_a_shared_generated_prefix_once():
    base = rec(0, SYS, [10])
    forks = [rec(t, SYS + [10, 7], [20, 21, 22 + t]) for t in range(1, 4)]  # 3 samples, one prompt
    samples, stats = build([base, *forks])
    trained_20 = [s for s in samples for i, tok in enumerate(s.tokens) if tok == 20 and s.loss_mask[i]]
    assert len(trained_20) == 1 and stats.shared_prefix_tokens == 4


def test_deterministic_retry_adds_no_segment():
    t0 = rec(0, SYS, [10, 11])
    t1 = rec(1, SYS, [10, 11])  # same prompt, same sampled ids
    t2 = bridged(2, t0, [200], [12])
    samples, stats = build([t0, t1, t2])
    assert len(samples) == 1 and stats.duplicate_turns == 1


def test_empty_outputs_train_nothing_and_extend_context():
    t0 = rec(0, SYS, [10])
    t1 = bridged(1, t0, [200], [])  # context limit answered without an engine call
    t2 = bridged(2, t1, [201], [11])
    (s,), stats = build([t0, t1, t2])
    assert s.loss_mask == [0, 0, 0, 1, 0, 0, 1] and stats.empty_turns == 1


@pytest.mark.parametrize("verify", [True, False])
def test_trusting_bridges_gives_the_same_samples_on_honest_records(verify):
    t0 = rec(0, SYS, [10, 11])
    t1 = bridged(1, t0, [200], [12])
    t2 = rec(2, SYS + [10, 11, 5], [13])  # full render diverging: always compared
    t3 = bridged(3, t2, [201], [14])
    samples, _ = build([t0, t1, t2, t3], verify_bridged_prefix=verify)
    assert [s.turns for s in samples] == [[0, 1], [2, 3]]


def test_a_lying_bridge_is_caught_when_verifying():
    t0 = rec(0, SYS, [10, 11])
    liar = rec(1, [100, 999, 102, 10, 11, 200], [12], mode="bridged", bridge=5)
    samples, stats = build([t0, liar])
    assert len(samples) == 2 and stats.bridged_mismatches == 1


def test_a_side_turn_never_extends_the_main_chain():
    t0 = rec(0, SYS, [10])
    side = rec(1, SYS + [10, 5], [11], kind="side", side_label="subagent")  # happens to extend main's ids
    t2 = bridged(2, t0, [6], [12])
    t3 = rec(3, side.prompt_ids + side.output_ids + [7], [13], kind="side", side_label="subagent")
    samples, _ = build([t0, side, t2, t3])
    assert [s.turns for s in samples] == [[0, 2], [1, 3]]
