"""Strict validation of generate replies: every defect is a typed error, never a patched result."""

from __future__ import annotations

import base64
import copy
import io
import math
from typing import Any

import numpy as np
import pytest

from lego_rl.errors import ProviderError
from lego_rl.serving.errors import (
    BadWeightVersion,
    EmptyChoice,
    InvalidReply,
    LogprobCountMismatch,
    MissingLogprobs,
    NonFiniteLogprob,
    TokenOutOfVocab,
    UnsupportedExtra,
)
from lego_rl.serving.protocol import LOGPROB_TOLERANCE
from lego_rl.serving.validate import parse_reply, parse_version

GOOD: dict[str, Any] = {
    "request_id": "generate-tokens-x",
    "choices": [{
        "index": 0, "finish_reason": "length", "token_ids": [5, 7, 9],
        "weight_versions": [{"version": "default", "start": 0, "end": 1}, {"version": "4", "start": 1, "end": 3}],
        "logprobs": {"content": [{"token_id": 5, "logprob": -0.5}, {"token_id": 7, "logprob": -1.25},
                                 {"token_id": 9, "logprob": 0.0}]},
    }],
}


def parse(data: Any, **kw: Any):
    return parse_reply(data, vocab_size=kw.pop("vocab_size", 10), prompt_len=kw.pop("prompt_len", 2), **kw)


def mutated(fn) -> dict[str, Any]:
    data = copy.deepcopy(GOOD)
    fn(data["choices"][0])
    return data


def test_good_reply() -> None:
    r = parse(GOOD, url="http://a")
    assert r.output_ids == [5, 7, 9] and r.logprobs == [-0.5, -1.25, 0.0]
    assert r.finish_reason == "length" and r.replica == "http://a"
    assert [r.version_of(i) for i in range(3)] == [0, 4, 4]


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda c: c.pop("logprobs"), MissingLogprobs),
        (lambda c: c["logprobs"]["content"][1].pop("logprob"), MissingLogprobs),
        (lambda c: c["logprobs"]["content"].pop(), LogprobCountMismatch),
        (lambda c: c["logprobs"]["content"][0].update(token_id=6), LogprobCountMismatch),
        (lambda c: c["logprobs"]["content"][0].update(logprob=math.nan), NonFiniteLogprob),
        (lambda c: c["logprobs"]["content"][0].update(logprob=-math.inf), NonFiniteLogprob),
        (lambda c: c["logprobs"]["content"][0].update(logprob=0.3), NonFiniteLogprob),
        (lambda c: c["logprobs"]["content"][0].update(logprob="x"), NonFiniteLogprob),
        (lambda c: c.update(token_ids=[5, 7, 10]), TokenOutOfVocab),
        (lambda c: c.update(token_ids=[5, -1, 9]), TokenOutOfVocab),
        (lambda c: c.pop("token_ids"), EmptyChoice),
        (lambda c: c.update(token_ids=[], logprobs=None), EmptyChoice),
        (lambda c: c.update(finish_reason="error"), InvalidReply),
        (lambda c: c["weight_versions"].pop(), BadWeightVersion),
        (lambda c: c["weight_versions"][1].update(start=2), BadWeightVersion),
        (lambda c: c["weight_versions"][1].update(version="v2"), BadWeightVersion),
    ],
)
def test_defects_raise_typed_errors(change, error) -> None:
    with pytest.raises(error) as info:
        parse(mutated(change), request_id="r1")
    assert isinstance(info.value, ProviderError) and info.value.status_code == 502
    assert "r1" in str(info.value)


def test_no_choices_and_non_object() -> None:
    for data in ({"choices": []}, {}, [], None):
        with pytest.raises(EmptyChoice):
            parse(data)


def test_aborted_before_first_token_is_valid() -> None:
    r = parse(mutated(lambda c: c.update(token_ids=[], logprobs=None, finish_reason="abort", weight_versions=[])))
    assert r.output_ids == [] and r.finish_reason == "abort"


def test_versions_absent_means_unknown() -> None:
    assert parse(mutated(lambda c: c.pop("weight_versions"))).weight_versions == []
    assert parse_version("default") == 0 and parse_version("12") == 12
    with pytest.raises(BadWeightVersion):
        parse_version("-1")


def test_nucleus() -> None:
    with pytest.raises(UnsupportedExtra):
        parse(GOOD, want_nucleus=True)
    ids_only = mutated(lambda c: c.update(sampling_mask=[[5], [7, 1], [9]]))
    with pytest.raises(UnsupportedExtra, match="sampler probabilities"):
        parse(ids_only, want_nucleus=True)
    full = mutated(lambda c: c.update(sampling_mask=[[5], [7, 1], [9]], sampling_mask_probs=[[1.0], [0.6, 0.4], [1.0]]))
    r = parse(full, want_nucleus=True)
    assert r.nucleus is not None and r.nucleus[1].ids == [7, 1] and r.nucleus[1].probs == [0.6, 0.4]
    missing_sampled = mutated(lambda c: c.update(sampling_mask=[[5], [1], [9]], sampling_mask_probs=[[1.0], [1.0], [1.0]]))
    with pytest.raises(InvalidReply, match="does not contain the sampled token"):
        parse(missing_sampled, want_nucleus=True)


def test_routed_experts_decoded_and_split() -> None:
    # prompt 2 + output 3 - 1 = 4 forwarded tokens, 2 layers, top-2 experts
    arr = np.arange(16, dtype=np.int32).reshape(4, 2, 2)
    buf = io.BytesIO()
    np.save(buf, arr)
    data = mutated(lambda c: c.update(routed_experts=base64.b64encode(buf.getvalue()).decode()))
    r = parse(data, want_routed_experts=True)
    # One route per output id; the last one was never forwarded, so it has none.
    assert r.prompt_routed_experts == arr[:2].tolist() and r.routed_experts == arr[2:].tolist() + [[]]
    assert len(r.routed_experts) == len(r.output_ids)
    with pytest.raises(InvalidReply, match="shape"):
        parse(data, want_routed_experts=True, prompt_len=3)
    with pytest.raises(UnsupportedExtra):
        parse(GOOD, want_routed_experts=True)


def test_logprob_tolerance_is_the_one_shared_limit_and_accepted_rounding_is_clamped() -> None:
    at = mutated(lambda c: c["logprobs"]["content"][2].update(logprob=LOGPROB_TOLERANCE))
    assert parse(at).logprobs[2] == 0.0  # rounding above 0 is accepted, then clamped
    just_over = math.nextafter(LOGPROB_TOLERANCE, 1.0)
    with pytest.raises(NonFiniteLogprob, match=f"rounding up to {LOGPROB_TOLERANCE} allowed"):
        parse(mutated(lambda c: c["logprobs"]["content"][2].update(logprob=just_over)))
