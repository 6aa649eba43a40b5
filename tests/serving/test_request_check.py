"""Generate-body validation: vLLM-style messages naming the field; unknown fields accepted."""

from __future__ import annotations

from typing import Any

import pytest

from lego_rl.serving.request_check import BadRequest, check_generate


def check(body: Any):
    return check_generate(body, vocab_size=100, max_model_len=64)


@pytest.mark.parametrize(
    ("body", "param", "text"),
    [
        ({"token_ids": []}, "token_ids", "must not be empty"),
        ({"sampling_params": {}}, "token_ids", "required"),
        ({"token_ids": "abc"}, "token_ids", "list of integers"),
        ({"token_ids": [1, "2"]}, "token_ids", "token_ids[1]"),
        ({"token_ids": [1, True]}, "token_ids", "token_ids[1]"),
        ({"token_ids": [1, 100]}, "token_ids", "Token id 100 is out of vocabulary"),
        ({"token_ids": [-1]}, "token_ids", "negative"),
        ({"token_ids": [1], "sampling_params": {"max_tokens": 0}}, "max_tokens", "at least 1, got 0"),
        ({"token_ids": [1], "sampling_params": {"max_tokens": "5"}}, "max_tokens", "integer"),
        ({"token_ids": [1], "sampling_params": {"temperature": -1}}, "temperature", "non-negative"),
        ({"token_ids": [1], "sampling_params": {"top_p": 0}}, "top_p", "(0, 1]"),
        ({"token_ids": [1], "sampling_params": {"top_k": -2}}, "top_k", "top_k"),
        ({"token_ids": [1], "sampling_params": {"seed": 1.5}}, "seed", "integer"),
        ({"token_ids": [1], "sampling_params": {"stop_token_ids": [1, "x"]}}, "stop_token_ids", "list"),
        ({"token_ids": [1], "sampling_params": {"n": 2}}, "n", "not supported"),
        ({"token_ids": [1], "sampling_params": {"stop": ["x"]}}, "stop", "not supported"),
        ({"token_ids": [1], "sampling_params": []}, "sampling_params", "object"),
        ({"token_ids": [1], "stream": True}, "stream", "stream"),
        ([1, 2], "body", "JSON object"),
    ],
)
def test_bad_requests_name_the_field(body: Any, param: str, text: str) -> None:
    with pytest.raises(BadRequest) as info:
        check(body)
    assert info.value.param == param
    assert text in str(info.value)


def test_defaults_and_unknown_fields() -> None:
    c = check({"token_ids": [1, 2, 3], "foo": 1, "sampling_params": {"bar": 2, "temperature": 0, "n": 1}})
    assert c.unknown == ["foo", "sampling_params.bar"]
    assert c.sampling.max_tokens == 61  # the rest of the context, as vLLM defaults
    assert c.sampling.temperature == 0.0 and not c.want_logprobs and c.request_id
