"""One definition of a trainable output: the engine reply's validation and the trajectory's record check refuse
the same outputs with the same words (``serving.output_checks``; the adapter's last gate is in
tests/adapter/test_core.py)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from lego_rl.errors import TrajectoryError
from lego_rl.serving.errors import InvalidReply
from lego_rl.serving.output_checks import check_output
from lego_rl.serving.protocol import LOGPROB_TOLERANCE
from lego_rl.serving.validate import parse_reply
from lego_rl.trajectory.checks import check_record
from lego_rl.trajectory.records import TurnRecord

CASES = [
    ([5, 6], [-0.1, math.nan], None, "invalid logprob nan at position 1"),
    ([5, 6], [-0.1, math.nextafter(LOGPROB_TOLERANCE, 1)], None, f"rounding up to {LOGPROB_TOLERANCE} allowed"),
    ([5, -2], [-0.1, -0.2], None, "token id -2 outside the vocabulary"),
    ([5, 6], [-0.1, -0.2], ([[5], [7]], [[1.0], [1.0]]), "nucleus at position 1 does not contain the sampled token 6"),
    ([5, 6], [-0.1, -0.2], ([[5], [6]], [[1.0], [1.5]]), "nucleus at position 1 has a probability outside [0, 1]"),
    ([5, 6], [-1e308, -1e308], None, "logprobs are so negative that their sum overflows"),
]


def reply(ids: list[int], logprobs: list[float], nucleus: Any) -> dict[str, Any]:
    choice: dict[str, Any] = {"finish_reason": "stop", "token_ids": ids,
                              "logprobs": {"content": [{"token_id": t, "logprob": lp} for t, lp in zip(ids, logprobs)]}}
    if nucleus is not None:
        choice["sampling_mask"], choice["sampling_mask_probs"] = nucleus
    return {"choices": [choice]}


def record(ids: list[int], logprobs: list[float], nucleus: Any) -> TurnRecord:
    ids_, probs = nucleus if nucleus is not None else (None, None)
    return TurnRecord(session_id="s", turn=0, protocol="anthropic", prompt_ids=[1, 2], output_ids=ids,
                      logprobs=logprobs, render_mode="full", finish_reason="stop", nucleus_ids=ids_,
                      nucleus_probs=probs)


@pytest.mark.parametrize(("ids", "logprobs", "nucleus", "needle"), CASES)
def test_reply_and_record_refuse_alike(ids: list[int], logprobs: list[float], nucleus: Any, needle: str) -> None:
    with pytest.raises(InvalidReply) as at_reply:
        parse_reply(reply(ids, logprobs, nucleus), vocab_size=None, prompt_len=2, want_nucleus=nucleus is not None)
    with pytest.raises(TrajectoryError) as at_record:
        check_record(record(ids, logprobs, nucleus))
    assert needle in str(at_reply.value)
    assert str(at_record.value) == f"session s, turn 0: {at_reply.value}"


def test_a_good_output_passes_and_the_vocabulary_bounds_ids() -> None:
    check_output([5, 6], [-0.1, 0.0], vocab_size=7, nucleus=([[5, 1], [6]], [[0.9, 0.1], [1.0]]),
                 routed_experts=[[[1]], []])
    with pytest.raises(InvalidReply, match=r"token id 7 outside the vocabulary \[0, 7\) at position 1"):
        check_output([5, 7], [-0.1, -0.1], vocab_size=7)
    with pytest.raises(InvalidReply, match="routed_experts covers 1 positions, output has 2"):
        check_output([5, 6], [-0.1, -0.1], routed_experts=[[[1]]])
    with pytest.raises(InvalidReply, match="1 logprobs for 2 output tokens"):
        check_output([5, 6], [-0.1])
