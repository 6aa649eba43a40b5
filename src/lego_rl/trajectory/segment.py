"""Segments under construction: a token stream with aligned per-token columns and turn spans.

Internal to the trajectory manager; Python lists throughout, so every append is amortised O(1) and
C-level (``extend``), and a finished segment's lists are handed to its Sample without a copy.
"""

from __future__ import annotations

from lego_rl.trajectory.records import RenderMode, TurnRecord


class Span:
    """Where one turn sits in its segment: prompt is ``[0, prompt_len)``, output ``[out_start, out_end)``."""

    __slots__ = ("out_end", "out_start", "prompt_len", "render_mode", "text", "turn")

    def __init__(self, turn: int, prompt_len: int, out_start: int, out_end: int, text: str,
                 render_mode: RenderMode = "full") -> None:
        self.turn, self.prompt_len, self.out_start, self.out_end, self.text = (
            turn, prompt_len, out_start, out_end, text
        )
        self.render_mode: RenderMode = render_mode


class Segment:
    """A growing token stream with aligned per-token columns (Python lists: appends are amortised O(1))."""

    def __init__(self, seq: int, chain: tuple[str, str | None], nucleus: bool, routes: bool) -> None:
        self.seq = seq
        self.chain = chain
        """(kind, side label) of the turns it holds: side requests never extend the main chain."""
        self.tokens: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.nucleus_ids: list[list[int]] | None = [] if nucleus else None
        self.nucleus_probs: list[list[float]] | None = [] if nucleus else None
        self.routes: list[list[list[int]]] | None = [] if routes else None
        self.prompt_routing: list[tuple[int, list[list[list[int]]]]] = []
        self.spans: list[Span] = []
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
        self.spans.append(Span(rec.turn, start, start, start + n, rec.text, rec.render_mode))
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


def common_prefix_len(a: list[int], b: list[int]) -> int:
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
