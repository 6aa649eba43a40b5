"""Property tests: random trajectories mixing bridges, drifted re-renders, restarts, retries, side
turns and shared generated prefixes, over a tiny vocabulary so that coincidental matches are common."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trajectory_records import assert_invariants, rec

from lego_rl.trajectory.manager import TrajectoryOptions, build_samples
from lego_rl.trajectory.records import TurnRecord

TOKENS = st.integers(min_value=0, max_value=4)
OPS = ("bridge", "bridge", "drift", "restart", "retry", "fresh", "side")


@st.composite
def trajectories(draw: st.DrawFn) -> list[TurnRecord]:
    records: list[TurnRecord] = []
    stream: list[int] = []  # what the adapter would bridge from: last main prompt + output
    source: int | None = None  # the turn that stream came from
    for turn in range(draw(st.integers(1, 9))):
        op = draw(st.sampled_from(OPS)) if records else "fresh"
        kind, mode, bridge, frm = "main", "full", 0, None
        if op == "bridge":
            prompt, mode, bridge, frm = stream + draw(st.lists(TOKENS, max_size=3)), "bridged", len(stream), source
        elif op == "drift" and stream:
            i = draw(st.integers(0, len(stream) - 1))
            change = draw(st.sampled_from(("replace", "delete", "insert")))
            mid = {"replace": [draw(TOKENS)], "delete": [], "insert": [draw(TOKENS), stream[i]]}[change]
            prompt = stream[:i] + mid + stream[i + 1 :] + draw(st.lists(TOKENS, max_size=2))
        elif op in ("restart", "retry"):
            prompt = list(draw(st.sampled_from(records)).prompt_ids)
            if op == "restart":
                prompt = prompt[: draw(st.integers(1, max(1, len(prompt))))]
        else:
            prompt = draw(st.lists(TOKENS, min_size=1, max_size=4))
            kind = "side" if op == "side" else "main"
        siblings = [r.output_ids for r in records if r.prompt_ids == prompt and r.output_ids]
        output = draw(st.lists(TOKENS, max_size=4))
        if siblings and draw(st.booleans()):  # share a generated prefix with an earlier sample
            sib = draw(st.sampled_from(siblings))
            output = sib[: draw(st.integers(0, len(sib)))] + output
        logprobs = draw(st.lists(st.floats(-8.0, 0.0), min_size=len(output), max_size=len(output)))
        records.append(rec(turn, prompt, output, mode=mode, bridge=bridge, logprobs=logprobs, bridge_from_turn=frm,
                           kind=kind, side_label="side" if kind == "side" else None))
        if kind == "main":
            stream, source = prompt + output, turn
    return records


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trajectories(), st.booleans())
def test_every_sampled_token_is_trained_exactly_once_with_its_recorded_logprob(records, verify):
    samples, stats = build_samples(
        records, rollout_id="r", group_index=0, index=0, reward=1.0,
        options=TrajectoryOptions(verify_bridged_prefix=verify),
    )
    assert_invariants(records, samples)
    assert stats.trained_tokens == sum(s.num_trained_tokens for s in samples)
    assert all(s.reward == 1.0 and s.rollout_id == "r" for s in samples)


@settings(max_examples=150, deadline=None)
@given(trajectories(), st.integers(1, 6))
def test_rewrite_merging_never_trains_a_token_twice_or_invents_one(records, limit):
    samples, stats = build_samples(
        records, rollout_id="r", group_index=0, index=0, reward=0.0,
        options=TrajectoryOptions(fork_merge_max_response_tokens=limit),
    )
    seen: set[tuple[tuple[int, ...], int]] = set()
    recorded = {
        (tuple(r.prompt_ids + r.output_ids[:j]), t) for r in records for j, t in enumerate(r.output_ids)
    }
    for s in samples:
        for i, m in enumerate(s.loss_mask):
            if m:
                key = (tuple(s.tokens[:i]), s.tokens[i])
                assert key in recorded and key not in seen
                seen.add(key)
    # Only merging may drop sampled tokens, and never more than it reports (a dropped token can come
    # back when a later turn samples it again in the same context).
    assert len(recorded) - len(seen) <= stats.discarded_tokens
