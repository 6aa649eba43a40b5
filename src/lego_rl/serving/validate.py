"""Turn a raw ``/inference/v1/generate`` reply into a ``GenerateResult``, or refuse it.

Pure functions, no I/O. Every check raises a typed ``InvalidReply`` subclass; nothing is patched:
a missing logprob is never filled in, a short list is never padded. This module checks the wire's shapes and
types; what makes the output itself trainable (finite logprobs, ids in the vocabulary, a consistent nucleus) is
``serving.output_checks``', which the adapter and the trajectory run too.
"""

from __future__ import annotations

import base64
import io
from typing import Any

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
from lego_rl.serving.output_checks import check_count, check_logprobs, check_nucleus, check_token_ids
from lego_rl.serving.protocol import GenerateResult, NucleusEntry, WeightVersionSpan

INITIAL_VERSION_LABEL = "default"
"""vLLM's label for the weights it started with; lego maps it to version 0."""

_FINISH = {"stop", "length", "abort"}


def parse_version(label: Any) -> int:
    """A wire weight-version label as lego's integer version (``"default"`` is 0)."""
    if isinstance(label, bool):
        raise BadWeightVersion(f"weight version {label!r} is not a version label")
    if isinstance(label, int) and label >= 0:
        return label
    if isinstance(label, str):
        if label == INITIAL_VERSION_LABEL:
            return 0
        if label.isdigit():
            return int(label)
    raise BadWeightVersion(
        f"weight version {label!r} is neither {INITIAL_VERSION_LABEL!r} nor a non-negative integer; "
        "lego sets versions as decimal strings"
    )


def parse_reply(
    data: Any,
    *,
    vocab_size: int | None,
    prompt_len: int,
    want_nucleus: bool = False,
    want_routed_experts: bool = False,
    request_id: str | None = None,
    url: str | None = None,
) -> GenerateResult:
    """Validate one generate reply (first choice) and build the result."""
    ctx = {"request_id": request_id, "url": url}
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
        raise EmptyChoice("reply has no choices", **ctx)
    choice = data["choices"][0]
    if not isinstance(choice, dict) or not isinstance(choice.get("token_ids"), list):
        raise EmptyChoice("choice has no token_ids list", **ctx)
    ids: list[int] = choice["token_ids"]
    finish = choice.get("finish_reason")
    if finish not in _FINISH:
        raise InvalidReply(f"finish_reason {finish!r} is not one of {sorted(_FINISH)}", **ctx)
    if not ids and finish != "abort":
        raise EmptyChoice(f"choice has no output ids but finish_reason {finish!r}", **ctx)
    bad = next((pos for pos, tok in enumerate(ids) if not isinstance(tok, int) or isinstance(tok, bool)), None)
    if bad is not None:
        raise TokenOutOfVocab(f"output id {ids[bad]!r} at position {bad} is not a token id", **ctx)
    check_token_ids(ids, vocab_size, **ctx)
    logprobs = _logprobs(choice, ids, ctx)
    return GenerateResult(
        output_ids=ids,
        logprobs=logprobs,
        finish_reason=finish,
        weight_versions=_versions(choice.get("weight_versions"), len(ids), ctx),
        nucleus=_nucleus(choice, ids, vocab_size, ctx) if want_nucleus else None,
        **(_experts(choice, prompt_len, len(ids), ctx) if want_routed_experts else {}),
        replica=url,
    )


def _logprobs(choice: dict[str, Any], ids: list[int], ctx: dict[str, Any]) -> list[float]:
    block = choice.get("logprobs")
    content = block.get("content") if isinstance(block, dict) else None
    if content is None:
        if not ids:
            return []
        raise MissingLogprobs("reply has no logprobs.content", **ctx)
    if not isinstance(content, list):
        raise LogprobCountMismatch(f"logprobs.content is {type(content).__name__}, not a list", **ctx)
    check_count(len(ids), len(content), "logprob entries", **ctx)
    out: list[float] = []
    for pos, (entry, tok) in enumerate(zip(content, ids, strict=True)):
        if not isinstance(entry, dict) or "logprob" not in entry or entry["logprob"] is None:
            raise MissingLogprobs(f"no logprob at output position {pos}", **ctx)
        if entry.get("token_id", tok) != tok:
            raise LogprobCountMismatch(
                f"logprob entry {pos} is for id {entry.get('token_id')!r}, output id is {tok}", **ctx)
        value = entry["logprob"]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise NonFiniteLogprob(f"logprob at position {pos} is {value!r}, not a number", **ctx)
        out.append(float(value))
    check_logprobs(out, **ctx)
    return [min(value, 0.0) for value in out]  # rounding above 0 is clamped: a probability is at most 1


def _versions(spans: Any, n: int, ctx: dict[str, Any]) -> list[WeightVersionSpan]:
    if spans is None:
        return []
    if not isinstance(spans, list):
        raise BadWeightVersion(f"weight_versions is {type(spans).__name__}, not a list", **ctx)
    out: list[WeightVersionSpan] = []
    cursor = 0
    for span in spans:
        if not isinstance(span, dict) or span.get("start") != cursor or not isinstance(span.get("end"), int):
            raise BadWeightVersion(f"weight_versions {spans!r} do not tile [0, {n}) in order", **ctx)
        if span["end"] <= span["start"]:
            raise BadWeightVersion(f"empty weight-version span {span!r}", **ctx)
        try:
            version = parse_version(span.get("version"))
        except BadWeightVersion as exc:
            raise BadWeightVersion(str(exc), **ctx) from None
        out.append(WeightVersionSpan(version=version, start=span["start"], end=span["end"]))
        cursor = span["end"]
    if cursor != n:
        raise BadWeightVersion(f"weight_versions cover [0, {cursor}) but there are {n} output ids", **ctx)
    return out


def _nucleus(choice: dict[str, Any], ids: list[int], vocab: int | None, ctx: dict[str, Any]) -> list[NucleusEntry]:
    mask, probs = choice.get("sampling_mask"), choice.get("sampling_mask_probs")
    if mask is None:
        raise UnsupportedExtra("nucleus requested but the reply has no sampling_mask "
                               "(vLLM needs --return-sampling-mask)", **ctx)
    if probs is None:
        raise UnsupportedExtra("nucleus requested but the reply has no sampling_mask_probs "
                               "(only lego's embedded engine returns sampler probabilities)", **ctx)
    if not (isinstance(mask, list) and isinstance(probs, list)):
        raise InvalidReply("sampling_mask and sampling_mask_probs must be lists", **ctx)
    for pos, (m, p) in enumerate(zip(mask, probs, strict=False)):
        if not (isinstance(m, list) and isinstance(p, list) and all(_is_int(x) for x in m)
                and all(_is_number(x) for x in p)):
            raise InvalidReply(f"nucleus at position {pos} is not a list of ids and a list of numbers", **ctx)
    check_nucleus(ids, mask, probs, vocab, **ctx)
    return [NucleusEntry(ids=m, probs=[float(x) for x in p]) for m, p in zip(mask, probs, strict=True)]


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _experts(choice: dict[str, Any], prompt_len: int, n: int, ctx: dict[str, Any]) -> dict[str, Any]:
    raw = choice.get("routed_experts")
    if raw is None:
        raise UnsupportedExtra("routed experts requested but the reply has none (dense model, vLLM started "
                               "without --enable-return-routed-experts, which needs VLLM_USE_V2_MODEL_RUNNER=1 "
                               "and Triton, i.e. a GPU; or the embedded engine without --return-routed-experts)",
                               **ctx)
    import numpy as np

    try:
        arr = np.load(io.BytesIO(base64.b64decode(raw)), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:  # bad base64 (binascii.Error is a ValueError) or npy
        raise InvalidReply(f"routed_experts is not a base64 .npy array: {exc}", **ctx) from None
    # vLLM: one row per forwarded token (prompt + output - 1; the last sampled id was never forwarded).
    if arr.ndim != 3 or arr.shape[0] != prompt_len + n - 1:
        raise InvalidReply(f"routed_experts shape {arr.shape} does not match {prompt_len} prompt + "
                           f"{n} output ids (expected first dim {prompt_len + n - 1})", **ctx)
    rows = arr.astype("int64").tolist()
    # Per output id, as the adapter and the trajectory align them: the last sampled id was never forwarded,
    # so it has no route (an empty list; the next turn's prompt routing covers it when there is one).
    out = rows[prompt_len:] + [[]] if n else []
    return {"prompt_routed_experts": rows[:prompt_len], "routed_experts": out}
