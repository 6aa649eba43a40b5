"""Tokenisation health of one rollout: segments, false forks, repeated prompt tokens, fallbacks, parse failures."""

from __future__ import annotations

from trajectory_records import bridged, rec

from lego_rl.runstore.turns import HISTORY_CHANGED, NO_PREVIOUS_TURN, TOOLS_CHANGED
from lego_rl.trajectory.manager import build_samples


def _stats(records):  # type: ignore[no-untyped-def]
    _, stats = build_samples(records, rollout_id="r", group_index=0, index=0, reward=1.0)
    return stats


def test_one_bridged_chain_is_healthy() -> None:
    t0 = rec(0, [1, 2, 3], [10, 11], fallback_reason=NO_PREVIOUS_TURN)
    t1 = bridged(1, t0, [4], [12])
    t2 = bridged(2, t1, [5], [13], parse_failures=1)
    s = _stats([t0, t1, t2])
    assert (s.segments_started, s.false_forks, s.repeated_prompt_tokens, s.render_fallbacks, s.parse_failures) == (
        1, 0, 0, 0, 1)


def test_rerender_that_drifts_is_a_false_fork_and_counts_the_repeated_prefix() -> None:
    """The next turn re-rendered (the previous output was cut at a stop sequence) and the tokens of the
    earlier reply came out differently: a new segment although the history only grew."""
    t0 = rec(0, [1, 2, 3], [10, 11], fallback_reason=NO_PREVIOUS_TURN)
    t1 = rec(1, [1, 2, 3, 10, 99, 4], [12],
             fallback_reason="the previous output did not end with the end-of-message token")
    s = _stats([t0, t1])
    assert (s.segments_started, s.false_forks, s.repeated_prompt_tokens, s.render_fallbacks) == (2, 1, 4, 1)


def test_real_divergences_are_not_false_forks() -> None:
    """Compaction, new tools, a bridge from an earlier turn (the client went back), a repeated request and a
    side request each start a segment; none is a false fork."""
    t0 = rec(0, [1, 2, 3], [10, 11], fallback_reason=NO_PREVIOUS_TURN)
    t1 = bridged(1, t0, [4], [12])
    compacted = rec(2, [1, 7, 8], [13], fallback_reason=HISTORY_CHANGED)
    new_tools = rec(3, [6, 7], [14], fallback_reason=TOOLS_CHANGED)
    went_back = bridged(4, t0, [9], [15])  # bridged from turn 0 again, after turn 1 extended it
    repeat = rec(5, [1, 2, 3], [16], repeat_of=0)
    side = rec(6, [1, 2], [17], kind="side", side_label="title", fallback_reason=NO_PREVIOUS_TURN)
    s = _stats([t0, t1, compacted, new_tools, went_back, repeat, side])
    assert (s.segments_started, s.false_forks, s.render_fallbacks) == (6, 0, 2)
    # Repeated context: compacted shares [1], new_tools nothing, went_back [1,2,3,10,11], repeat [1,2,3], side [1,2].
    assert s.repeated_prompt_tokens == 1 + 0 + 5 + 3 + 2
