"""TrajectoryManager: a session's turn records become training segments, token for token.

Rules (the "token-in, token-out" contract):

* Each turn's prompt is matched against the segments of its chain (the main chain, or one per side
  request label: side requests never extend the main chain). When a segment's whole token stream
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

Everything is assembled from saved ids only; the decoded text is carried as a sidecar, never
re-tokenised. Work per turn is one C-level prefix comparison plus appends of the new tokens: linear in
the ids the records hold, or in the built tokens when bridges are trusted (``verify_bridged_prefix``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, Field

from lego_rl.errors import TrajectoryError
from lego_rl.termination import TerminationReason
from lego_rl.runstore.turns import NO_PREVIOUS_TURN, PROMPT_CHANGED
from lego_rl.trajectory.checks import check_record
from lego_rl.trajectory.records import TurnRecord
from lego_rl.trajectory.sample import PromptRoutingSnapshot, Sample, TurnSpan
from lego_rl.trajectory.segment import Segment, common_prefix_len


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
    # Tokenisation health (the run's ``tokenisation`` metrics): what the adapter's prompts cost in segments.
    false_forks: int = 0
    """Segments started on a chain that already had one although nothing but the tokens diverged: the turn's
    record names no change of the prompt (compaction or an edited history, new tools or template kwargs), no
    bridge from an earlier turn (a retry) and no repeated request. A side request or sub-agent starts its
    own chain and is never one. Each is a re-render that did not reproduce the ids sampled before."""
    repeated_prompt_tokens: int = 0
    """Context tokens new segments start with that an earlier segment already holds (their longest common
    prefix with one): prompt tokens the trainer processes more than once."""
    render_fallbacks: int = 0
    """Turns fully re-rendered although their chain had an earlier turn to bridge from (any fallback reason)."""
    parse_failures: int = 0
    """Tool calls the adapter could not parse (``TurnRecord.parse_failures``), side turns included."""


class TrajectoryManager:
    """Feed one session's turn records in order with ``add_turn``; then ``samples(...)``."""

    def __init__(self, options: TrajectoryOptions | None = None) -> None:
        self.options = options or TrajectoryOptions()
        self.stats = TrajectoryStats()
        self._segments: list[Segment] = []
        self._last_of: dict[tuple[str, str | None], Segment] = {}
        """The segment each chain (main, or one per side label) extended last."""
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
        check_record(rec, require_nucleus=self.options.require_nucleus,
                     require_routing=self.options.require_routing)

    # ------------------------------------------------------------------------------------ matching
    def _extends(self, seg: Segment, rec: TurnRecord) -> bool:
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

    def _find_extension(self, rec: TurnRecord) -> Segment | None:
        chain = (rec.kind, rec.side_label)
        last = self._last_of.get(chain)
        best: Segment | None = None
        # The chain's last segment is tried first (the usual answer; on a tie it keeps the chain).
        order = [last] if last is not None else []
        order += [s for s in reversed(self._segments) if s is not last and s.chain == chain]
        for seg in order:
            if (best is None or len(seg.tokens) > len(best.tokens)) and self._extends(seg, rec):
                best = seg
        return best

    def _try_merge(self, rec: TurnRecord) -> Segment | None:
        """Short-turn rewrite merging: cut the latest segment back to the divergence point, if allowed."""
        seg, limit = self._last_of.get((rec.kind, rec.side_label)), self.options.fork_merge_max_response_tokens
        if limit <= 0 or seg is None or not seg.spans:
            return None
        k = common_prefix_len(rec.prompt_ids, seg.tokens)
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
        self.stats.parse_failures += rec.parse_failures
        if rec.render_mode == "full" and rec.fallback_reason not in (None, NO_PREVIOUS_TURN):
            self.stats.render_fallbacks += 1
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
            self._count_fork(rec)
            seg = Segment(len(self._segments), (rec.kind, rec.side_label),
                          rec.nucleus_ids is not None or self.options.require_nucleus,
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
        self._last_of[seg.chain] = seg

    def _count_fork(self, rec: TurnRecord) -> None:
        """Before ``rec`` starts a new segment: its repeated context, and whether it is a false fork."""
        if not self._segments:
            return
        self.stats.repeated_prompt_tokens += max(common_prefix_len(rec.prompt_ids, s.tokens) for s in self._segments)
        chain = (rec.kind, rec.side_label)
        if chain not in self._last_of:
            return  # the chain's first segment (a side request's, a sub-agent's): no fork
        real = (rec.repeat_of is not None or rec.render_mode == "bridged"  # a retry, or bridged from an earlier turn
                or rec.fallback_reason in PROMPT_CHANGED)
        if not real:
            self.stats.false_forks += 1

    def _fill_missing_columns(self, seg: Segment, rec: TurnRecord) -> None:
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
                    "turn_spans": [TurnSpan(turn=s.turn, start=s.out_start, end=s.out_end, render_mode=s.render_mode)
                                   for s in seg.spans if s.out_end > s.out_start],
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
