"""What makes a sampled output trainable: one set of checks for every holder of one.

Three places hold a model's output before it becomes training data: the serving client parses the engine's
reply (``serving.validate``), the adapter takes the reply as its last gate before recording a turn
(``adapter.core``), and the trajectory checks each turn record it reads back (``trajectory.checks``). They
agree on what they refuse because they call these functions: logprobs aligned with the output ids, finite and
at most ``LOGPROB_TOLERANCE``; ids inside the vocabulary; a captured nucleus aligned, holding the sampled id,
its probabilities in [0, 1]; routes, when kept, one per output position.

Each check raises a typed ``InvalidReply`` (a ``ProviderError``); a caller with its own error model (the
trajectory's ``TrajectoryError``) re-raises the message as its own. Nothing is patched. ``request_id`` and
``url`` only name the call in the message.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from lego_rl.serving.errors import InvalidReply, LogprobCountMismatch, NonFiniteLogprob, TokenOutOfVocab
from lego_rl.serving.protocol import LOGPROB_TOLERANCE


def check_count(n_ids: int, n_values: int, what: str, *, request_id: str | None = None,
                url: str | None = None) -> None:
    """``n_values`` of ``what`` (logprobs, versions...) for ``n_ids`` output ids, or ``LogprobCountMismatch``."""
    if n_values != n_ids:
        raise LogprobCountMismatch(f"{n_values} {what} for {n_ids} output tokens", request_id=request_id, url=url)


def check_logprobs(values: Sequence[float], *, request_id: str | None = None, url: str | None = None) -> None:
    """Every value a finite log-probability (at most ``LOGPROB_TOLERANCE`` above 0), or ``NonFiniteLogprob``
    naming the first bad one."""
    # sum() propagates nan/inf, so one C-level pass finds broken values; only then look for them.
    if not values or (math.isfinite(sum(values)) and max(values) <= LOGPROB_TOLERANCE):
        return
    bad = next((i for i, x in enumerate(values) if not (math.isfinite(x) and x <= LOGPROB_TOLERANCE)), None)
    if bad is None:
        raise NonFiniteLogprob("logprobs are so negative that their sum overflows", request_id=request_id, url=url)
    raise NonFiniteLogprob(f"invalid logprob {values[bad]!r} at position {bad}: not a finite value <= 0 (rounding "
                           f"up to {LOGPROB_TOLERANCE} allowed)", request_id=request_id, url=url)


def check_token_ids(ids: Sequence[int], vocab_size: int | None, *, request_id: str | None = None,
                    url: str | None = None) -> None:
    """Every id in ``[0, vocab_size)`` (only ``>= 0`` when the vocabulary size is unknown), or
    ``TokenOutOfVocab`` naming the first one outside."""
    if not ids or (min(ids) >= 0 and not (vocab_size and max(ids) >= vocab_size)):
        return
    pos, tok = next((i, t) for i, t in enumerate(ids) if t < 0 or (vocab_size and t >= vocab_size))
    raise TokenOutOfVocab(f"token id {tok} outside the vocabulary [0, {vocab_size or '?'}) at position {pos}",
                          request_id=request_id, url=url)


def check_nucleus(output_ids: Sequence[int], nucleus_ids: Sequence[Sequence[int]],
                  nucleus_probs: Sequence[Sequence[float]], vocab_size: int | None = None, *,
                  request_id: str | None = None, url: str | None = None) -> None:
    """The captured nucleus: one span of ids and sampler probabilities per output position, each holding the
    sampled id, its probabilities in [0, 1], its ids in the vocabulary."""
    ctx: dict[str, Any] = {"request_id": request_id, "url": url}
    n = len(output_ids)
    if len(nucleus_ids) != n or len(nucleus_probs) != n:
        raise LogprobCountMismatch(f"nucleus covers {len(nucleus_ids)}/{len(nucleus_probs)} positions for {n} "
                                   "output tokens", **ctx)
    for pos, (tok, span, probs) in enumerate(zip(output_ids, nucleus_ids, nucleus_probs, strict=True)):
        if len(span) != len(probs):
            raise InvalidReply(f"nucleus at position {pos}: {len(span)} ids but {len(probs)} probabilities", **ctx)
        if tok not in span:
            raise InvalidReply(f"nucleus at position {pos} does not contain the sampled token {tok}", **ctx)
        if not all(math.isfinite(x) and 0.0 <= x <= 1.0 for x in probs):
            raise NonFiniteLogprob(f"nucleus at position {pos} has a probability outside [0, 1]", **ctx)
        if vocab_size and any(not 0 <= x < vocab_size for x in span):
            raise TokenOutOfVocab(f"nucleus at position {pos} holds an id outside [0, {vocab_size})", **ctx)


def check_output(output_ids: Sequence[int], logprobs: Sequence[float], *, vocab_size: int | None = None,
                 nucleus: tuple[Sequence[Sequence[int]], Sequence[Sequence[float]]] | None = None,
                 routed_experts: Sequence[Any] | None = None, request_id: str | None = None,
                 url: str | None = None) -> None:
    """All of a sampled output's checks (module docstring): logprobs, ids, and the nucleus and routes when
    given."""
    ctx: dict[str, Any] = {"request_id": request_id, "url": url}
    check_count(len(output_ids), len(logprobs), "logprobs", **ctx)
    check_logprobs(logprobs, **ctx)
    check_token_ids(output_ids, vocab_size, **ctx)
    if nucleus is not None:
        check_nucleus(output_ids, nucleus[0], nucleus[1], vocab_size, **ctx)
    if routed_experts is not None and len(routed_experts) != len(output_ids):
        raise LogprobCountMismatch(f"routed_experts covers {len(routed_experts)} positions, output has "
                                   f"{len(output_ids)}", **ctx)
