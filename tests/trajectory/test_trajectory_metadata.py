"""Nucleus spans, routing snapshots and weight versions travel with their tokens; bad or missing
requested metadata fails the rollout with an error naming the session, turn and field."""

from __future__ import annotations

import math

import pytest
from trajectory_records import bridged, rec

from lego_rl.errors import TrajectoryError
from lego_rl.serving.protocol import LOGPROB_TOLERANCE
from lego_rl.trajectory.manager import TrajectoryOptions, build_samples

SYS = [100, 101]


def nucleus(out: list[int]) -> dict:
    return {"nucleus_ids": [[t, t + 1] for t in out], "nucleus_probs": [[0.75, 0.25] for _ in out]}


def routes(n: int, tag: int) -> list[list[list[int]]]:
    return [[[tag, i], [i, tag]] for i in range(n)]  # [position][layer][top_k]


def run(records, **opts):
    return build_samples(records, rollout_id="roll-7", group_index=4, index=2, reward=1.0,
                         options=TrajectoryOptions(**opts))


def test_nucleus_spans_follow_sampled_tokens_and_context_gets_empty_spans():
    t0 = rec(0, SYS, [10, 11], **nucleus([10, 11]))
    t1 = bridged(1, t0, [200], [12], **nucleus([12]))
    (s,), _ = run([t0, t1], require_nucleus=True)
    assert s.nucleus_ids == [[], [], [10, 11], [11, 12], [], [12, 13]]
    assert s.nucleus_probs[2] == [0.75, 0.25] and s.nucleus_probs[4] == []


def test_routing_travels_with_outputs_and_prompt_snapshots_stay_per_turn():
    t0 = rec(0, SYS, [10], routed_experts=routes(1, 0), prompt_routed_experts=routes(2, 50))
    t1 = bridged(1, t0, [200], [11], routed_experts=routes(1, 1), prompt_routed_experts=routes(4, 51))
    (s,), _ = run([t0, t1], require_routing=True)
    assert s.routed_experts == [[], [], routes(1, 0)[0], [], routes(1, 1)[0]]
    snaps = [(p.turn, p.prompt_len, p.rollout_id, p.group_index) for p in s.prompt_routing]
    assert snaps == [(0, 2, "roll-7", 4), (1, 4, "roll-7", 4)]
    assert s.prompt_routing[1].routes == routes(4, 51)  # not merged with turn 0's routes


def test_weight_versions_are_per_token_with_minus_one_on_context():
    t0 = rec(0, SYS, [10, 11], weight_versions=[3, 4])
    (s,), _ = run([t0])
    assert s.weight_versions == [-1, -1, 3, 4]
    (unknown,), _ = run([rec(0, SYS, [10])])
    assert unknown.weight_versions == []


@pytest.mark.parametrize(
    ("extra", "opts", "needle"),
    [
        ({}, {"require_nucleus": True}, "nucleus spans were requested"),
        ({"routed_experts": routes(1, 0)}, {"require_routing": True}, "prompt_routed_experts is missing"),
        ({"nucleus_ids": [[10]], "nucleus_probs": None}, {}, "recorded together"),
        ({"nucleus_ids": [[11]], "nucleus_probs": [[1.0]]}, {}, "does not contain the sampled token 10"),
        ({"nucleus_ids": [[10]], "nucleus_probs": [[1.5]]}, {}, "outside [0, 1]"),
        ({"routed_experts": routes(2, 0)}, {}, "routed_experts covers 2 positions, output has 1"),
        ({"prompt_routed_experts": routes(1, 0)}, {}, "prompt has 4"),
        ({"weight_versions": [1, 2]}, {}, "2 weight versions for 1 output ids"),
        ({"logprobs": [-0.1, -0.2]}, {}, "2 logprobs for 1 output tokens"),
        ({"logprobs": [math.nan]}, {}, "not a finite value"),
        ({"logprobs": [0.5]}, {}, "not a finite value <= 0"),
        ({"logprobs": [math.nextafter(LOGPROB_TOLERANCE, 1)]}, {}, f"up to {LOGPROB_TOLERANCE} allowed"),
    ],
)
def test_bad_or_missing_metadata_fails_with_a_precise_error(extra, opts, needle):
    with pytest.raises(TrajectoryError) as err:
        good = rec(0, SYS, [10], routed_experts=routes(1, 0), prompt_routed_experts=routes(2, 0), **nucleus([10]))
        run([good, rec(1, SYS + [10, 5], [10], **extra)], **opts)
    assert needle in str(err.value)
    assert str(err.value).startswith("session sess, turn 1:")


def test_records_from_two_sessions_or_out_of_order_are_refused():
    with pytest.raises(TrajectoryError, match="another session"):
        run([rec(0, SYS, [1]), rec(1, SYS, [2], session_id="other")])
    from lego_rl.trajectory.manager import TrajectoryManager

    m = TrajectoryManager()
    m.add_turn(rec(4, SYS, [1]))
    with pytest.raises(TrajectoryError, match="increasing order"):
        m.add_turn(rec(4, SYS, [2]))


def test_text_sidecar_is_never_used_for_tokens():
    (s,), _ = run([rec(0, SYS, [10, 11], text="completely unrelated text")])
    assert s.tokens == SYS + [10, 11] and s.text == "completely unrelated text"


def test_logprob_rounding_within_the_shared_tolerance_is_accepted():
    (s,), _ = run([rec(0, SYS, [10, 11], logprobs=[-0.5, LOGPROB_TOLERANCE])])
    assert s.rollout_logprobs[2:] == [-0.5, LOGPROB_TOLERANCE]
