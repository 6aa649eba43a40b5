"""Per-turn checks of a turn record before it may become training data.

A record that fails any of these is not silently patched: the rollout fails with a ``TrajectoryError``
naming the session, the turn and the field (the rollout maps it to ``adapter_error``).
"""

from __future__ import annotations

import math

from lego_rl.errors import TrajectoryError
from lego_rl.serving.protocol import LOGPROB_TOLERANCE
from lego_rl.trajectory.records import TurnRecord


def _fail(rec: TurnRecord, message: str) -> TrajectoryError:
    return TrajectoryError(message, session_id=rec.session_id, turn=rec.turn)


def check_record(rec: TurnRecord, *, require_nucleus: bool = False, require_routing: bool = False) -> None:
    """Logprobs finite and aligned with the output; spans, routes and versions aligned when present,
    present when required. Prompt ids are not scanned (see the manager)."""
    n = len(rec.output_ids)
    if len(rec.logprobs) != n:
        raise _fail(rec, f"{len(rec.logprobs)} logprobs for {n} output ids")
    # sum() propagates nan/inf, so one C-level pass finds broken values; only then look for them.
    if n and not (math.isfinite(sum(rec.logprobs)) and max(rec.logprobs) <= LOGPROB_TOLERANCE):
        bad = next((x for x in rec.logprobs if not (math.isfinite(x) and x <= LOGPROB_TOLERANCE)), None)
        if bad is None:
            raise _fail(rec, "logprobs are so negative that their sum overflows")
        raise _fail(
            rec, f"logprob {bad!r} is not a finite value <= 0 (rounding up to {LOGPROB_TOLERANCE} allowed)"
        )
    if n and min(rec.output_ids) < 0:
        raise _fail(rec, f"negative output token id {min(rec.output_ids)}")
    if rec.weight_versions and len(rec.weight_versions) != n:
        raise _fail(rec, f"{len(rec.weight_versions)} weight versions for {n} output ids")
    _check_nucleus(rec, n, require_nucleus)
    _check_routing(rec, n, require_routing)


def _check_nucleus(rec: TurnRecord, n: int, required: bool) -> None:
    ids, probs = rec.nucleus_ids, rec.nucleus_probs
    if ids is None or probs is None:
        if required and n:
            raise _fail(rec, "nucleus spans were requested (require_nucleus) but are missing")
        if (ids is None) != (probs is None):
            raise _fail(rec, "nucleus_ids and nucleus_probs must be recorded together")
        return
    if len(ids) != n or len(probs) != n:
        raise _fail(rec, f"nucleus spans cover {len(ids)}/{len(probs)} positions, output has {n}")
    for i, (tok, span, p) in enumerate(zip(rec.output_ids, ids, probs, strict=True)):
        if len(span) != len(p):
            raise _fail(rec, f"nucleus span {i}: {len(span)} ids but {len(p)} probabilities")
        if tok not in span:
            raise _fail(rec, f"nucleus span {i} does not contain the sampled token {tok}")
        if not all(math.isfinite(x) and 0.0 <= x <= 1.0 for x in p):
            raise _fail(rec, f"nucleus span {i} has a probability outside [0, 1]")


def _check_routing(rec: TurnRecord, n: int, required: bool) -> None:
    out, prompt = rec.routed_experts, rec.prompt_routed_experts
    if required and (out is None or prompt is None):
        which = "routed_experts" if out is None else "prompt_routed_experts"
        raise _fail(rec, f"routing replay was requested (require_routing) but {which} is missing")
    if out is not None and len(out) != n:
        raise _fail(rec, f"routed_experts covers {len(out)} positions, output has {n}")
    if prompt is not None and len(prompt) != len(rec.prompt_ids):
        raise _fail(
            rec, f"prompt_routed_experts covers {len(prompt)} positions, prompt has {len(rec.prompt_ids)}"
        )
