"""Helpers for trajectory tests: build TurnRecords and check the training invariants by brute force."""

from __future__ import annotations

from typing import Any

from lego_rl.trajectory.records import TurnRecord
from lego_rl.trajectory.sample import Sample


def lp(turn: int, n: int) -> list[float]:
    """Distinct, recognisable logprobs per turn and position."""
    return [-(turn + 1) * 0.01 - j * 0.0001 for j in range(n)]


def rec(
    turn: int,
    prompt: list[int],
    output: list[int],
    *,
    mode: str = "full",
    bridge: int = 0,
    logprobs: list[float] | None = None,
    **extra: Any,
) -> TurnRecord:
    """A turn record as the adapter writes it (``mode``/``bridge`` say how the prompt was made)."""
    return TurnRecord(
        session_id=extra.pop("session_id", "sess"),
        turn=turn,
        protocol="anthropic",
        prompt_ids=prompt,
        output_ids=output,
        logprobs=lp(turn, len(output)) if logprobs is None else logprobs,
        render_mode=mode,  # type: ignore[arg-type]
        bridge_prefix_len=bridge,
        finish_reason="stop",
        text=extra.pop("text", f"<out {turn}>"),
        **extra,
    )


def bridged(turn: int, prev: TurnRecord, suffix: list[int], output: list[int], **extra: Any) -> TurnRecord:
    """The next turn of a chain: previous prompt + output verbatim, then a new context suffix."""
    base = prev.prompt_ids + prev.output_ids
    return rec(turn, base + suffix, output, mode="bridged", bridge=len(base), bridge_from_turn=prev.turn, **extra)


def trained_events(samples: list[Sample]) -> dict[tuple[tuple[int, ...], int], list[tuple[int, int, float]]]:
    """(context, token) -> [(segment, position, logprob)] for every position with loss mask 1."""
    events: dict[tuple[tuple[int, ...], int], list[tuple[int, int, float]]] = {}
    for s in samples:
        for i, m in enumerate(s.loss_mask):
            if m:
                key = (tuple(s.tokens[:i]), s.tokens[i])
                events.setdefault(key, []).append((s.segment, i, s.rollout_logprobs[i]))
    return events


def assert_invariants(records: list[TurnRecord], samples: list[Sample]) -> None:
    """Every sampled token trained exactly once, with its recorded id, context and (first) logprob;
    nothing trained that was not sampled; per-token columns aligned."""
    recorded: dict[tuple[tuple[int, ...], int], float] = {}
    for r in sorted(records, key=lambda r: r.turn):
        for j, tok in enumerate(r.output_ids):
            key = (tuple(r.prompt_ids + r.output_ids[:j]), tok)
            recorded.setdefault(key, r.logprobs[j])  # the first sample of an event is the one trained
    trained = trained_events(samples)
    for key, logprob in recorded.items():
        hits = trained.get(key, [])
        assert len(hits) == 1, f"event at context length {len(key[0])} token {key[1]} trained {len(hits)}x"
        assert hits[0][2] == logprob, f"trained logprob {hits[0][2]} != recorded {logprob}"
    phantom = set(trained) - set(recorded)
    assert not phantom, f"{len(phantom)} trained positions were never sampled"
    for s in samples:
        assert len(s.tokens) == len(s.loss_mask) == len(s.rollout_logprobs)
        assert s.num_segments == len(samples)
    assert [s.segment for s in samples] == list(range(len(samples)))
