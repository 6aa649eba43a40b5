"""Per-turn checks of a turn record before it may become training data.

A record that fails any of these is not silently patched: the rollout fails with a ``TrajectoryError``
naming the session, the turn and the field (the rollout maps it to ``adapter_error``).
"""

from __future__ import annotations

from lego_rl.errors import TrajectoryError
from lego_rl.serving.errors import InvalidReply
from lego_rl.serving.output_checks import check_output
from lego_rl.trajectory.records import TurnRecord


def _fail(rec: TurnRecord, message: str) -> TrajectoryError:
    return TrajectoryError(message, session_id=rec.session_id, turn=rec.turn)


def check_record(rec: TurnRecord, *, require_nucleus: bool = False, require_routing: bool = False) -> None:
    """The output's checks (``serving.output_checks``, as the engine's reply had them: logprobs finite and
    aligned, ids not negative, nucleus and routes aligned when present); versions aligned when present; the
    nucleus and routes present when required. Prompt ids are not scanned (see the manager)."""
    n = len(rec.output_ids)
    _check_presence(rec, n, require_nucleus, require_routing)
    nucleus = None if rec.nucleus_ids is None or rec.nucleus_probs is None else (rec.nucleus_ids, rec.nucleus_probs)
    try:
        check_output(rec.output_ids, rec.logprobs, nucleus=nucleus, routed_experts=rec.routed_experts)
    except InvalidReply as exc:
        raise _fail(rec, str(exc)) from None
    if rec.weight_versions and len(rec.weight_versions) != n:
        raise _fail(rec, f"{len(rec.weight_versions)} weight versions for {n} output ids")
    prompt = rec.prompt_routed_experts
    if prompt is not None and len(prompt) != len(rec.prompt_ids):
        raise _fail(
            rec, f"prompt_routed_experts covers {len(prompt)} positions, prompt has {len(rec.prompt_ids)}"
        )


def _check_presence(rec: TurnRecord, n: int, require_nucleus: bool, require_routing: bool) -> None:
    """The nucleus recorded whole and, like the routes, present when the rollout asked for it."""
    ids, probs = rec.nucleus_ids, rec.nucleus_probs
    if (ids is None or probs is None) and require_nucleus and n:
        raise _fail(rec, "nucleus spans were requested (require_nucleus) but are missing")
    if (ids is None) != (probs is None):
        raise _fail(rec, "nucleus_ids and nucleus_probs must be recorded together")
    out, prompt = rec.routed_experts, rec.prompt_routed_experts
    if require_routing and (out is None or prompt is None):
        which = "routed_experts" if out is None else "prompt_routed_experts"
        raise _fail(rec, f"routing replay was requested (require_routing) but {which} is missing")
