"""TrajectoryManager: a session's turn records become training segments, token for token.

Rules (the "token-in, token-out" contract):

* Each turn's prompt is matched against the segments built so far. When a segment's whole token stream
  is a prefix of the prompt, the new prompt suffix (tool results, user and environment context) is
  appended with loss mask 0 and the sampled output with loss mask 1 and its rollout logprobs.
* When no segment is a prefix of the prompt (compaction, a re-rendered history whose tokens drifted,
  a restart from an earlier prompt base, a retry), a new segment starts: the whole prompt is context
  (mask 0) and the output is trained. Earlier segments keep their original prompts, ids and logprobs.
* A sampled token whose exact context and id are already trained in another segment (sibling branches
  sharing a generated prefix) is masked in the later one, so it contributes loss once.
* Optional short-turn rewrite merging (``fork_merge_max_response_tokens`` > 0): instead of a new
  segment, the latest segment is cut back to where the prompt diverges, if every sampled turn cut away is
  at most that many tokens long. This discards training signal; the default 0 keeps every sampled turn.

Everything is assembled from saved ids only. Work per turn is one C-level prefix comparison plus
appends of the new tokens, so building is linear in the tokens the records hold.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, Field

from lego_rl.errors import TrajectoryError
from lego_rl.rollout.termination import TerminationReason
from lego_rl.trajectory.records import TurnRecord
from lego_rl.trajectory.sample import PromptRoutingSnapshot, Sample

LOGPROB_TOLERANCE = 1e-4
"""Largest positive logprob accepted (float rounding of log(1)); anything above is a broken record."""


class TrajectoryOptions(BaseModel):
    """How turn records become segments (plain parameters; the config layer embeds this model)."""

    fork_merge_max_response_tokens: int = Field(default=0, ge=0)
    """Cut back diverged turns of at most this many sampled tokens instead of forking; 0 = never."""
    require_nucleus: bool = False
    """Nucleus spans were requested from the engine: a turn without them fails the rollout."""
    require_routing: bool = False
    """R3 routing was requested: a turn without output and prompt routes fails the rollout."""
    train_side_turns: bool = True
    """Train side requests (titles, sub-agents) too; each lands in its own segment(s)."""
    verify_bridged_prefix: bool = True
    """Compare every prompt in full. False trusts the adapter's verbatim copy for ``bridged`` turns that
    name their source (``bridge_from_turn``) when a segment ends with that turn, and compares only that
    turn's sampled tokens: building becomes linear in the final tokens instead of in all prompt ids."""


class TrajectoryStats(BaseModel):
    """What happened while building; reported per rollout."""

    turns: int = 0
    side_turns_skipped: int = 0
    empty_turns: int = 0
    segments_started: int = 0
    bridged_mismatches: int = 0
    """``bridged`` turns that extended no segment: the adapter bridged from an earlier turn than the
    last one (a retry or an abandoned answer), so the turn forked."""
    merged_forks: int = 0
    discarded_tokens: int = 0
    shared_prefix_tokens: int = 0
    duplicate_turns: int = 0
    """Turns whose whole output was already trained with the same context (not added again)."""
    trained_tokens: int = 0


class _Span:
    """Where one turn sits in its segment: prompt is ``[0, prompt_len)``, output ``[out_start, out_end)``."""

    __slots__ = ("turn", "prompt_len", "out_start", "out_end", "text")

    def __init__(self, turn: int, prompt_len: int, out_start: int, out_end: int, text: str) -> None:
        self.turn, self.prompt_len, self.out_start, self.out_end, self.text = (
            turn, prompt_len, out_start, out_end, text
        )


class _Segment:
    """A growing token stream with aligned per-token columns (Python lists: appends are amortised O(1))."""

    def __init__(self, seq: int, nucleus: bool, routes: bool) -> None:
        self.seq = seq
        self.tokens: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.nucleus_ids: list[list[int]] | None = [] if nucleus else None
        self.nucleus_probs: list[list[float]] | None = [] if nucleus else None
        self.routes: list[list[list[int]]] | None = [] if routes else None
        self.prompt_routing: list[tuple[int, list[list[list[int]]]]] = []
        self.spans: list[_Span] = []
        self.trained = 0
        self.has_versions = False
        self.pinned = 0
        """Positions below this hold trained tokens another segment masked as shared: never cut."""

    def append_context(self, ids: list[int]) -> None:
        n = len(ids)
        if not n:
            return
        self.tokens.extend(ids)
        self.mask.extend([0] * n)
        self.logprobs.extend([0.0] * n)
        self.versions.extend([-1] * n)
        # Context gets empty spans; sharing one empty list is safe: nothing mutates it.
        if self.nucleus_ids is not None and self.nucleus_probs is not None:
            self.nucleus_ids.extend([[]] * n)
            self.nucleus_probs.extend([[]] * n)
        if self.routes is not None:
            self.routes.extend([[]] * n)

    def append_output(self, rec: TurnRecord, mask: list[int]) -> None:
        n = len(rec.output_ids)
        start = len(self.tokens)
        self.spans.append(_Span(rec.turn, start, start, start + n, rec.text))
        if rec.prompt_routed_experts is not None:
            self.prompt_routing.append((rec.turn, rec.prompt_routed_experts))
        self.tokens.extend(rec.output_ids)
        self.mask.extend(mask)
        self.logprobs.extend(rec.logprobs)
        if rec.weight_versions:
            self.versions.extend(rec.weight_versions)
            self.has_versions = True
        else:
            self.versions.extend([-1] * n)
        if self.nucleus_ids is not None and self.nucleus_probs is not None:
            self.nucleus_ids.extend(rec.nucleus_ids or [[]] * n)
            self.nucleus_probs.extend(rec.nucleus_probs or [[]] * n)
        if self.routes is not None:
            self.routes.extend(rec.routed_experts or [[]] * n)
        self.trained += sum(mask)

    def truncate(self, k: int) -> int:
        """Cut the stream back to ``k`` tokens; returns how many trained tokens were discarded."""
        lost = sum(self.mask[k:])
        for col in (self.tokens, self.mask, self.logprobs, self.versions, self.nucleus_ids,
                    self.nucleus_probs, self.routes):
            if col is not None:
                del col[k:]
        kept = [s for s in self.spans if s.out_start < k]
        for s in kept:
            s.out_end = min(s.out_end, k)
        self.spans = kept
        self.prompt_routing = [(t, r) for t, r in self.prompt_routing if len(r) <= k]
        self.trained -= lost
        return lost


def _lcp(a: list[int], b: list[int]) -> int:
    """Length of the common prefix, using C-level slice comparisons on 1024-token chunks."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i : i + 1024] == b[i : i + 1024]:
        i += 1024
    if i >= n:
        return n
    while i < n and a[i] == b[i]:
        i += 1
    return i


class TrajectoryManager:
    """Feed one session's turn records in order with ``add_turn``; then ``samples(...)``."""

    def __init__(self, options: TrajectoryOptions | None = None) -> None:
        self.options = options or TrajectoryOptions()
        self.stats = TrajectoryStats()
        self._segments: list[_Segment] = []
        self._last: _Segment | None = None
        self._session: str | None = None
        self._last_turn = -1
        self._sealed = False

    # ------------------------------------------------------------------------------------ checking
    def _fail(self, rec: TurnRecord, message: str) -> TrajectoryError:
        return TrajectoryError(message, session_id=rec.session_id, turn=rec.turn)

    def _check(self, rec: TurnRecord) -> None:
        if self._session is None:
            self._session = rec.session_id
        elif rec.session_id != self._session:
            raise self._fail(rec, f"belongs to another session than {self._session!r}")
        if rec.turn <= self._last_turn:
            raise self._fail(rec, f"turns must arrive in increasing order; turn {self._last_turn} came first")
        n = len(rec.output_ids)
        if len(rec.logprobs) != n:
            raise self._fail(rec, f"{len(rec.logprobs)} logprobs for {n} output ids")
        # sum() propagates nan/inf, so one C-level pass finds broken values; only then look for them.
        if n and not (math.isfinite(sum(rec.logprobs)) and max(rec.logprobs) <= LOGPROB_TOLERANCE):
            bad = next((x for x in rec.logprobs if not (math.isfinite(x) and x <= LOGPROB_TOLERANCE)), None)
            raise self._fail(rec, f"logprob {bad!r} is not a finite value <= 0" if bad is not None
                             else "logprobs are so negative that their sum overflows")
        if n and min(rec.output_ids) < 0:
            raise self._fail(rec, f"negative output token id {min(rec.output_ids)}")
        if rec.weight_versions and len(rec.weight_versions) != n:
            raise self._fail(rec, f"{len(rec.weight_versions)} weight versions for {n} output ids")
        self._check_nucleus(rec, n)
        self._check_routing(rec, n)

    def _check_nucleus(self, rec: TurnRecord, n: int) -> None:
        ids, probs = rec.nucleus_ids, rec.nucleus_probs
        if ids is None or probs is None:
            if self.options.require_nucleus and n:
                raise self._fail(rec, "nucleus spans were requested (require_nucleus) but are missing")
            if (ids is None) != (probs is None):
                raise self._fail(rec, "nucleus_ids and nucleus_probs must be recorded together")
            return
        if len(ids) != n or len(probs) != n:
            raise self._fail(rec, f"nucleus spans cover {len(ids)}/{len(probs)} positions, output has {n}")
        for i, (tok, span, p) in enumerate(zip(rec.output_ids, ids, probs, strict=True)):
            if len(span) != len(p):
                raise self._fail(rec, f"nucleus span {i}: {len(span)} ids but {len(p)} probabilities")
            if tok not in span:
                raise self._fail(rec, f"nucleus span {i} does not contain the sampled token {tok}")
            if not all(math.isfinite(x) and 0.0 <= x <= 1.0 for x in p):
                raise self._fail(rec, f"nucleus span {i} has a probability outside [0, 1]")

    def _check_routing(self, rec: TurnRecord, n: int) -> None:
        out, prompt = rec.routed_experts, rec.prompt_routed_experts
        if self.options.require_routing and (out is None or prompt is None):
            which = "routed_experts" if out is None else "prompt_routed_experts"
            raise self._fail(rec, f"routing replay was requested (require_routing) but {which} is missing")
        if out is not None and len(out) != n:
            raise self._fail(rec, f"routed_experts covers {len(out)} positions, output has {n}")
        if prompt is not None and len(prompt) != len(rec.prompt_ids):
            raise self._fail(
                rec, f"prompt_routed_experts covers {len(prompt)} positions, prompt has {len(rec.prompt_ids)}"
            )

    # ------------------------------------------------------------------------------------ matching
    def _extends(self, seg: _Segment, rec: TurnRecord) -> bool:
        """True when ``seg``'s whole stream is a prefix of the prompt."""
        p, toks = rec.prompt_ids, seg.tokens
        n = len(toks)
        if n == 0 or n > len(p) or p[n - 1] != toks[-1]:
            return False
        if (
            not self.options.verify_bridged_prefix
            and rec.render_mode == "bridged"
            and rec.bridge_from_turn is not None
            and rec.bridge_prefix_len == n
            and seg.spans
            and seg.spans[-1].turn == rec.bridge_from_turn
            and seg.spans[-1].out_end == n
        ):
            # This segment ends exactly with the turn the adapter copied (its prompt+output verbatim):
            # trust that copy for the earlier context, still compare that turn's sampled tokens.
            start = seg.spans[-1].prompt_len
            return p[start:n] == toks[start:]
        return p[:n] == toks

    def _find_extension(self, rec: TurnRecord) -> _Segment | None:
        best: _Segment | None = None
        # The last segment is tried first: it is the usual answer, and ties keep the chain.
        order = [self._last] if self._last is not None else []
        order += [s for s in reversed(self._segments) if s is not self._last]
        for seg in order:
            if (best is None or len(seg.tokens) > len(best.tokens)) and self._extends(seg, rec):
                best = seg
        return best

    def _try_merge(self, rec: TurnRecord) -> _Segment | None:
        """Short-turn rewrite merging: cut the latest segment back to the divergence point, if allowed."""
        seg, limit = self._last, self.options.fork_merge_max_response_tokens
        if limit <= 0 or seg is None or not seg.spans:
            return None
        k = _lcp(rec.prompt_ids, seg.tokens)
        if k < seg.pinned or k < seg.spans[0].out_start:
            return None
        cut = [s for s in seg.spans if s.out_end > k and s.out_end > s.out_start]
        if not cut or any(s.out_end - s.out_start > limit for s in cut):
            return None
        self.stats.discarded_tokens += seg.truncate(k)
        self.stats.merged_forks += 1
        return seg

    def _shared_mask(self, rec: TurnRecord) -> list[int]:
        """Loss mask for the output: 0 where the same context+token is already trained elsewhere."""
        p, out = rec.prompt_ids, rec.output_ids
        mask = [1] * len(out)
        n = len(p)
        if not out:
            return mask
        for seg in self._segments:
            toks = seg.tokens
            if len(toks) <= n or toks[n] != out[0] or (n and toks[n - 1] != p[-1]) or toks[:n] != p:
                continue
            j, limit = 0, min(len(out), len(toks) - n)
            while j < limit and toks[n + j] == out[j]:
                if seg.mask[n + j] and mask[j]:
                    mask[j] = 0
                    self.stats.shared_prefix_tokens += 1
                    seg.pinned = max(seg.pinned, n + j + 1)
                j += 1
        return mask

    # ------------------------------------------------------------------------------------ building
    def add_turn(self, rec: TurnRecord) -> None:
        """Add the next turn of the session (turn numbers must increase)."""
        if self._sealed:
            raise self._fail(rec, "the manager was sealed by samples(); build a new TrajectoryManager")
        if rec.kind == "side" and not self.options.train_side_turns:
            self.stats.side_turns_skipped += 1
            return
        self._check(rec)
        self.stats.turns += 1
        try:
            self._add(rec)
        finally:
            self._last_turn = rec.turn

    def _add(self, rec: TurnRecord) -> None:
        seg = self._find_extension(rec)
        if seg is None:
            if rec.render_mode == "bridged" and self._segments:
                self.stats.bridged_mismatches += 1
            seg = self._try_merge(rec)
        if seg is None and not rec.output_ids:
            self.stats.empty_turns += 1  # nothing sampled and nothing to extend: no segment needed
            return
        mask = self._shared_mask(rec)
        if seg is None and not any(mask):
            # Same context and same sampled ids as an existing stream (a deterministic retry): every
            # token is already trained there and later prompts extend that stream, so add nothing.
            self.stats.duplicate_turns += 1
            return
        if seg is None:
            seg = _Segment(len(self._segments), rec.nucleus_ids is not None or self.options.require_nucleus,
                           rec.routed_experts is not None or self.options.require_routing)
            self._segments.append(seg)
            self.stats.segments_started += 1
        if not rec.output_ids:
            self.stats.empty_turns += 1
        # Prompt ids are not range-checked here (a full pass over every new segment's context would cost
        # as much as building it); a bad context id fails loudly at the trainer's embedding lookup.
        seg.append_context(rec.prompt_ids[len(seg.tokens):])
        self._fill_missing_columns(seg, rec)
        seg.append_output(rec, mask)
        self.stats.trained_tokens += sum(mask)
        self._last = seg

    def _fill_missing_columns(self, seg: _Segment, rec: TurnRecord) -> None:
        """A segment started without spans/routes that meets a turn with them grows empty entries."""
        if rec.nucleus_ids is not None and seg.nucleus_ids is None:
            seg.nucleus_ids = [[] for _ in seg.tokens]
            seg.nucleus_probs = [[] for _ in seg.tokens]
        if rec.routed_experts is not None and seg.routes is None:
            seg.routes = [[] for _ in seg.tokens]

    def samples(
        self,
        *,
        rollout_id: str,
        group_index: int,
        index: int,
        reward: float | None,
        termination: TerminationReason | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> list[Sample]:
        """One ``Sample`` per segment that trains at least one token, each with the run's full reward.

        The segments' token lists are handed to the Samples without a copy (half the memory of a
        copy, and no second validation pass), so this can be called once; the manager is sealed after.
        """
        if self._sealed:
            raise TrajectoryError("samples() was already called; build a new TrajectoryManager",
                                  session_id=self._session)
        self._sealed = True
        # Validate the per-rollout fields once; per-token columns were checked turn by turn.
        head = Sample(rollout_id=rollout_id, group_index=group_index, index=index, session_id=self._session or "",
                      tokens=[], loss_mask=[], rollout_logprobs=[], reward=reward, termination=termination,
                      metadata=dict(metadata or {}))
        live = [s for s in self._segments if s.trained > 0]
        out: list[Sample] = []
        for number, seg in enumerate(live):
            sample = head.model_copy(
                update={
                    "segment": number,
                    "num_segments": len(live),
                    "tokens": seg.tokens,
                    "loss_mask": seg.mask,
                    "rollout_logprobs": seg.logprobs,
                    "weight_versions": seg.versions if seg.has_versions else [],
                    "nucleus_ids": seg.nucleus_ids,
                    "nucleus_probs": seg.nucleus_probs,
                    "routed_experts": seg.routes,
                    "prompt_routing": [
                        PromptRoutingSnapshot(rollout_id=rollout_id, group_index=group_index, turn=t,
                                              prompt_len=len(r), routes=r)
                        for t, r in seg.prompt_routing
                    ],
                    "turns": [s.turn for s in seg.spans if s.out_end > s.out_start],
                    "text": "".join(s.text for s in seg.spans),
                    "metadata": dict(head.metadata),
                }
            )
            sample.check_alignment(mask_values=False)  # masks are 0/1 by construction here
            out.append(sample)
        return out


def build_samples(
    records: Iterable[TurnRecord],
    *,
    rollout_id: str,
    group_index: int,
    index: int,
    reward: float | None,
    termination: TerminationReason | None = None,
    metadata: dict[str, Any] | None = None,
    options: TrajectoryOptions | None = None,
) -> tuple[list[Sample], TrajectoryStats]:
    """Turn one session's records (any order; sorted by turn) into Samples and the build statistics."""
    manager = TrajectoryManager(options)
    for rec in sorted(records, key=lambda r: r.turn):
        manager.add_turn(rec)
    samples = manager.samples(
        rollout_id=rollout_id, group_index=group_index, index=index, reward=reward,
        termination=termination, metadata=metadata,
    )
    return samples, manager.stats
