"""Rollout-vs-trainer consistency: do the sampler and the trainer mean the same distribution?

Before each update the trainer recomputes the log-probability of every trained token; this module compares
those with the logprobs the engine reported when it sampled them (same convention on both sides:
``serving.logprobs``). Figures, over trained tokens only (``Δ = trainer - rollout``):

* ``pearson``: correlation of the two logprob vectors (None when fewer than 2 tokens or a constant side);
* ``mean_abs_diff``, ``p99_abs_diff``, ``max_abs_diff``: of ``|Δ|`` (p99 by linear interpolation, numpy's);
* ``k3_kl``: Schulman's k3 estimator of KL(rollout || trainer) from the rollout's own samples,
  ``mean(exp(Δ) - 1 - Δ)``: non-negative per token, 0 exactly when the two agree.

The same figures are split by turn kind so that a template drift is told apart from numeric noise: noise
touches every token alike, while a drift shows up in one kind only. Kinds: ``bridged`` vs ``full`` (how
the turn's prompt was built, ``Sample.turn_spans``) and ``first_segment`` vs ``later_segments``
(``Sample.segment``: a later segment exists because a prompt stopped extending the earlier stream).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from pydantic import BaseModel, ConfigDict, Field

from lego_rl.train.batching import MicroBatch
from lego_rl.trajectory.sample import Sample

KINDS = ("bridged", "full", "first_segment", "later_segments")
"""The per-kind splits of a ``ConsistencyReport``, in the order they are reported."""


class ConsistencyStats(BaseModel):
    """The figures over one set of trained tokens (see module docstring)."""

    model_config = ConfigDict(frozen=True)

    tokens: int = Field(ge=0)
    pearson: float | None = None
    mean_abs_diff: float = 0.0
    p99_abs_diff: float = 0.0
    max_abs_diff: float = 0.0
    k3_kl: float = 0.0


class ConsistencyReport(BaseModel):
    """Overall figures and the same per kind (a kind with no tokens is absent)."""

    model_config = ConfigDict(frozen=True)

    overall: ConsistencyStats
    by_kind: dict[str, ConsistencyStats] = Field(default_factory=dict)

    def as_values(self, prefix: str = "consistency") -> dict[str, float]:
        """Flat finite scalars for a metrics row: ``consistency/pearson``, ``consistency/full/max_abs_diff``..."""
        out: dict[str, float] = {}
        for name, stats in [("", self.overall), *((f"{k}/", s) for k, s in self.by_kind.items())]:
            for field, value in stats.model_dump().items():
                if value is not None:
                    out[f"{prefix}/{name}{field}"] = float(value)
        return out


def consistency_stats(rollout_logprobs: torch.Tensor, trainer_logprobs: torch.Tensor) -> ConsistencyStats:
    """Figures for two aligned ``[N]`` logprob vectors of the same trained tokens."""
    if rollout_logprobs.shape != trainer_logprobs.shape or rollout_logprobs.dim() != 1:
        raise ValueError(f"need two [N] logprob vectors of one length, got {tuple(rollout_logprobs.shape)} "
                         f"and {tuple(trainer_logprobs.shape)}")
    n = rollout_logprobs.numel()
    if n == 0:
        return ConsistencyStats(tokens=0)
    a = rollout_logprobs.detach().double()  # [N]
    b = trainer_logprobs.detach().double()  # [N]
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        bad = "rollout" if not torch.isfinite(a).all() else "trainer"
        raise ValueError(f"{bad} logprobs hold a non-finite value: a trained token with probability 0 under "
                         "that side's distribution means the two sides used different truncations")
    delta = b - a  # [N] trainer minus rollout
    abs_delta = delta.abs()  # [N]
    pearson: float | None = None
    if n >= 2:
        ca, cb = a - a.mean(), b - b.mean()  # [N], [N]
        denom = torch.sqrt((ca * ca).sum() * (cb * cb).sum())  # []
        if denom > 0:
            pearson = float((ca * cb).sum() / denom)
    k3 = torch.expm1(delta) - delta  # [N] exp(Δ) - 1 - Δ >= 0
    return ConsistencyStats(
        tokens=n, pearson=pearson, mean_abs_diff=float(abs_delta.mean()),
        p99_abs_diff=float(torch.quantile(abs_delta, 0.99)), max_abs_diff=float(abs_delta.max()),
        k3_kl=float(k3.mean()),
    )


@dataclass
class TokenKinds:
    """Per-token kind labels ``[T]`` (bool) aligned with a sequence; a token may be in neither render kind
    (context, or a sample saved without turn spans)."""

    bridged: torch.Tensor
    full: torch.Tensor
    later_segment: torch.Tensor


def sample_kinds(sample: Sample) -> TokenKinds:
    """The kind labels ``[len(tokens)]`` of one sample's tokens."""
    n = len(sample.tokens)
    bridged = torch.zeros(n, dtype=torch.bool)  # [n]
    full = torch.zeros(n, dtype=torch.bool)  # [n]
    for span in sample.turn_spans:
        (bridged if span.render_mode == "bridged" else full)[span.start:span.end] = True
    later = torch.full((n,), sample.segment > 0, dtype=torch.bool)  # [n]
    return TokenKinds(bridged=bridged, full=full, later_segment=later)


def micro_batch_kinds(micro_batch: MicroBatch, samples: Sequence[Sample]) -> TokenKinds:
    """The kind labels ``[T]`` of a packed micro-batch (``micro_batch.sample_indices`` index ``samples``)."""
    parts = [sample_kinds(samples[i]) for i in micro_batch.sample_indices]
    kinds = TokenKinds(
        bridged=torch.cat([p.bridged for p in parts]),  # [T]
        full=torch.cat([p.full for p in parts]),  # [T]
        later_segment=torch.cat([p.later_segment for p in parts]),  # [T]
    )
    if kinds.bridged.numel() != micro_batch.num_tokens:
        raise ValueError(f"samples {micro_batch.sample_indices} hold {kinds.bridged.numel()} tokens but the "
                         f"micro-batch has {micro_batch.num_tokens}: they are not the samples it was packed from")
    return kinds


def consistency_report(rollout_logprobs: torch.Tensor, trainer_logprobs: torch.Tensor, loss_mask: torch.Tensor,
                       kinds: TokenKinds | None = None) -> ConsistencyReport:
    """Figures over the trained tokens (``loss_mask > 0``) of aligned ``[T]`` tensors, overall and per kind.

    Concatenate micro-batches (and their ``micro_batch_kinds``) first to report a whole step.
    """
    if not rollout_logprobs.shape == trainer_logprobs.shape == loss_mask.shape:
        raise ValueError(f"rollout {tuple(rollout_logprobs.shape)}, trainer {tuple(trainer_logprobs.shape)} and "
                         f"loss mask {tuple(loss_mask.shape)} must have one shape")
    trained = loss_mask > 0  # [T]
    report = consistency_stats(rollout_logprobs[trained], trainer_logprobs[trained])
    if kinds is None:
        return ConsistencyReport(overall=report)
    selectors = {"bridged": kinds.bridged, "full": kinds.full, "first_segment": ~kinds.later_segment,
                 "later_segments": kinds.later_segment}
    by_kind: dict[str, ConsistencyStats] = {}
    for name in KINDS:
        sel = selectors[name]
        if sel.shape != trained.shape:
            raise ValueError(f"kind label {name} has shape {tuple(sel.shape)}, the tokens {tuple(trained.shape)}")
        pick = trained & sel  # [T]
        if pick.any():
            by_kind[name] = consistency_stats(rollout_logprobs[pick], trainer_logprobs[pick])
    return ConsistencyReport(overall=report, by_kind=by_kind)
