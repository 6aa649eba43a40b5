"""Validation of ``/inference/v1/generate`` bodies for the embedded engine, with vLLM's messages.

Every rejection names the field (``param``) and the value. Unknown fields are collected (the server logs
them) and otherwise ignored, as vLLM does. Known vLLM features the embedded engine does not implement
are rejected when set to a non-default value, rather than silently ignored.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from typing import Any

from lego_rl.serving.protocol import SamplingParams

_TOP_LEVEL = {
    "request_id", "token_ids", "sampling_params", "model", "stream", "stream_options", "cache_salt",
    "priority", "kv_transfer_params", "ec_transfer_params", "features", "content_parts", "token_offsets",
    "reasoning_ended", "reasoning_parser_kwargs", "return_token_ids", "output_mode", "return_sampling_mask",
}
_SAMPLING_OK = {
    "max_tokens", "temperature", "top_p", "top_k", "seed", "stop_token_ids", "logprobs", "ignore_eos",
    "detokenize", "skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output",
    "output_kind", "stream_interval", "extra_args",
}
# Known to vLLM, not implemented here: accepted only at their neutral value.
_SAMPLING_NEUTRAL: dict[str, Any] = {
    "n": 1, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "min_p": 0.0,
    "stop": None, "min_tokens": 0, "prompt_logprobs": None, "logit_bias": None, "allowed_token_ids": None,
    "bad_words": None, "structured_outputs": None, "logprob_token_ids": None,
}


def context_message(prompt_len: int, max_model_len: int) -> str:
    """vLLM's wording for a prompt that leaves no room for one output token."""
    return (f"The decoder prompt (length {prompt_len}) plus the number of requested output tokens (at least 1) "
            f"is longer than the maximum model length of {max_model_len}. Make sure that `max_model_len` is "
            "no smaller than the number of text tokens (prompt + requested output tokens).")


class BadRequest(ValueError):
    """A 400: ``param`` names the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        self.param = param
        super().__init__(message)


@dataclass
class Checked:
    token_ids: list[int]
    sampling: SamplingParams
    request_id: str
    want_logprobs: bool
    want_nucleus: bool
    ignore_eos: bool
    unknown: list[str] = field(default_factory=list)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _token_ids(body: dict[str, Any], vocab_size: int) -> list[int]:
    ids = body.get("token_ids")
    if ids is None:
        raise BadRequest("Field required: token_ids", "token_ids")
    if not isinstance(ids, list):
        raise BadRequest(f"token_ids must be a list of integers, got {type(ids).__name__}", "token_ids")
    if not ids:
        raise BadRequest("token_ids must not be empty", "token_ids")
    for pos, t in enumerate(ids):
        if not _is_int(t):
            raise BadRequest(f"token_ids[{pos}] must be an integer, got {t!r}", "token_ids")
        if t < 0:
            raise BadRequest("token_ids must not contain negative values", "token_ids")
        if t >= vocab_size:
            raise BadRequest(f"Token id {t} is out of vocabulary", "token_ids")
    return ids


def _sampling(sp: Any, prompt_len: int, max_model_len: int) -> tuple[SamplingParams, bool, list[str]]:
    if sp is None:
        sp = {}
    if not isinstance(sp, dict):
        raise BadRequest(f"sampling_params must be an object, got {type(sp).__name__}", "sampling_params")
    unknown = [f"sampling_params.{k}" for k in sp if k not in _SAMPLING_OK and k not in _SAMPLING_NEUTRAL]
    for key, neutral in _SAMPLING_NEUTRAL.items():
        if key in sp and sp[key] not in (neutral, [] if neutral is None else neutral):
            raise BadRequest(f"{key}={sp[key]!r} is not supported by lego's embedded engine", key)
    max_tokens = sp.get("max_tokens", max_model_len - prompt_len)
    if max_tokens is None:
        max_tokens = max_model_len - prompt_len
    if not _is_int(max_tokens):
        raise BadRequest(f"max_tokens must be an integer, got {max_tokens!r}", "max_tokens")
    if max_tokens < 1:
        raise BadRequest(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens")
    temperature = sp.get("temperature", 1.0)
    if not _is_num(temperature) or temperature < 0:
        raise BadRequest(f"temperature must be non-negative, got {temperature!r}.", "temperature")
    top_p = sp.get("top_p", 1.0)
    if not _is_num(top_p) or not 0 < top_p <= 1:
        raise BadRequest(f"top_p must be in (0, 1], got {top_p!r}.", "top_p")
    top_k = sp.get("top_k", 0)
    if not _is_int(top_k) or top_k < -1:
        raise BadRequest(f"top_k must be 0 (disable), or at least 1, got {top_k!r}.", "top_k")
    seed = sp.get("seed")
    if seed is not None and not _is_int(seed):
        raise BadRequest(f"seed must be an integer, got {seed!r}", "seed")
    logprobs = sp.get("logprobs")
    if logprobs is not None and (not _is_int(logprobs) or not 0 <= logprobs <= 20):
        raise BadRequest(f"logprobs must be an integer in [0, 20], got {logprobs!r}", "logprobs")
    stop_ids = sp.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(_is_int(t) and t >= 0 for t in stop_ids):
        raise BadRequest(f"stop_token_ids must be a list of non-negative integers, got {stop_ids!r}",
                         "stop_token_ids")
    ignore_eos = sp.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise BadRequest(f"ignore_eos must be a boolean, got {ignore_eos!r}", "ignore_eos")
    params = SamplingParams(max_tokens=max_tokens, temperature=float(temperature), top_p=float(top_p),
                            top_k=top_k, seed=seed, stop_token_ids=stop_ids,
                            logprobs=logprobs)
    return params, ignore_eos, unknown


def check_generate(body: Any, *, vocab_size: int, max_model_len: int) -> Checked:
    """Validate a generate body; raises ``BadRequest`` naming the first offending field."""
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(body).__name__}", "body")
    ids = _token_ids(body, vocab_size)
    if len(ids) >= max_model_len:
        raise BadRequest(context_message(len(ids), max_model_len), "token_ids")
    sampling, ignore_eos, unknown = _sampling(body.get("sampling_params"), len(ids), max_model_len)
    unknown = [k for k in body if k not in _TOP_LEVEL] + unknown
    if body.get("stream"):
        raise BadRequest("stream=true is not supported by lego's embedded engine", "stream")
    if body.get("output_mode", "tokens") != "tokens":
        raise BadRequest("output_mode must be 'tokens' on lego's embedded engine", "output_mode")
    rid = body.get("request_id")
    if rid is None:
        rid = uuid.uuid4().hex
    if not isinstance(rid, str) or not rid:
        raise BadRequest(f"request_id must be a non-empty string, got {rid!r}", "request_id")
    nucleus = body.get("return_sampling_mask", False)
    if not isinstance(nucleus, bool):
        raise BadRequest(f"return_sampling_mask must be a boolean, got {nucleus!r}", "return_sampling_mask")
    return Checked(token_ids=ids, sampling=sampling, request_id=rid,
                   want_logprobs=sampling.logprobs is not None, want_nucleus=nucleus,
                   ignore_eos=ignore_eos, unknown=unknown)
