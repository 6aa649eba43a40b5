"""Policy losses: pure functions of one micro-batch's tensors (``LossInputs``), no model, no config file.

``make_loss(LossConfig) -> LossFn``. Every loss is ``sum(token_weights * per_token_loss)`` over the
micro-batch, so a backend that sums the micro-batches' gradients gets one denominator per rollout
(``train.batching``). Conventions and deviations from the textbook, in the order the loss applies them:

* **IS correction (TIS / MIS)** between the sampler and the trainer: ``rho = exp(old_logprobs -
  rollout_logprobs)`` per token, or per rollout (``is_level="sequence"``: the product over the rollout's
  trained tokens, across micro-batches through ``rollout_is_log_ratio_elsewhere``). TIS clamps ``rho`` to
  ``[is_low, is_high]``; MIS keeps ``rho`` inside that interval and zeroes the token (or the whole rollout)
  outside it. The weight is detached: it rescales the policy gradient, it is not optimised.
* **GRPO**: token-level PPO ratio ``exp(logprobs - old_logprobs)`` clipped to ``[1 - clip_low, 1 +
  clip_high]`` (asymmetric, "clip-higher"); with ``dual_clip_c`` a negative-advantage token's loss is
  capped at ``c * |A|`` (dual clip).
* **GSPO**: one ratio per rollout, ``exp(mean over its trained tokens of (logprobs - old_logprobs))``
  (length-normalised), clipped per rollout; per token it is written ``sg(s_r) * exp(lp - sg(lp))`` so the
  gradient is ``s_r / N_r * sum_t grad lp_t`` whichever micro-batch a token sits in.
* **Score centering** (``use_score_centering``, the reference example's SC REINFORCE, token level): the
  policy term is ``-A * (lp - sc_correction)`` with ``sc_correction = sum_k (q_k - sg(p_k)) * log p_k``
  over the sampler's nucleus (``q``: the sampler's probabilities, ``p``: the trainer's, normalised over the
  same nucleus). The subtracted baseline ``sum_k sg(p_k) log p_k`` has zero gradient (``sum_k p_k = 1``),
  so matching trainer and sampler give a zero correction up to rounding while the gradient is the centred
  score ``A * (grad lp - E_q[grad log p])``. No PPO clip: it is REINFORCE (one update per rollout batch).
* **KL** (``kl_coef > 0``): the k3 estimator ``exp(ref - lp) - (ref - lp) - 1`` to a frozen reference,
  added per token, not IS-weighted.

Metrics are token-weighted partial sums (``sum(token_weights * x)``): summed over a step's micro-batches
they are means over rollouts of per-rollout token means, because the token weights of a step sum to 1
(with ``loss_agg="token"``: token means over the step, the weights being ``loss_mask / sum_r N_r``).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from lego_rl.train.backend import LossInputs, LossOutput


class LossConfig(BaseModel):
    """The policy objective; the training loop projects ``train.*`` keys onto it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    algorithm: Literal["grpo", "gspo"] = "grpo"
    """Token-level PPO-clipped GRPO, or sequence-level (length-normalised) GSPO."""
    clip_low: float = Field(default=0.2, ge=0, lt=1)
    """Lower ratio clip ε: the ratio is clipped below at ``1 - clip_low``."""
    clip_high: float = Field(default=0.28, ge=0)
    """Upper ratio clip ε: the ratio is clipped above at ``1 + clip_high``."""
    dual_clip_c: float | None = Field(default=None, gt=1)
    """Dual clip: a negative-advantage token's loss is at most ``c * |A|``; None disables it."""
    is_correction: Literal["none", "tis", "mis"] = "none"
    """Sampler-vs-trainer correction: truncated (TIS) or masked (MIS) importance sampling, or none."""
    is_level: Literal["token", "sequence"] = "token"
    """``rho`` per token, or one per rollout (the product over its trained tokens)."""
    is_low: float = Field(default=0.0, ge=0)
    """Lower threshold of ``rho``: TIS clamps to it, MIS masks below it (0 = no lower bound)."""
    is_high: float = Field(default=2.0, gt=0)
    """Upper threshold of ``rho``: TIS clamps to it, MIS masks above it."""
    kl_coef: float = Field(default=0.0, ge=0)
    """Coefficient of the k3 KL to the frozen reference (0 = no reference model needed)."""
    use_score_centering: bool = False
    """SC REINFORCE with the captured nucleus (needs the nucleus inputs); token level, GRPO only."""
    loss_agg: Literal["rollout", "token"] = "rollout"
    """How token losses add up to the step's loss. ``rollout``: the mean over rollouts of each rollout's token
    mean (the packing's ``token_weights``, ``1 / (N_r * R)``). ``token``: every trained token of the step weighs
    ``1 / sum(N_r)`` (DAPO's token mean): tokens that several rollouts of a group share in the same context
    then cancel exactly, because a group's advantages sum to zero; under ``rollout`` a short failure's shared
    prefix weighs more than a long success's and is pushed down. GRPO only (GSPO's ratio is per sequence)."""

    @model_validator(mode="after")
    def _consistent(self) -> LossConfig:
        if self.is_low >= self.is_high:
            raise ValueError(f"is_low ({self.is_low}) must be below is_high ({self.is_high})")
        if self.loss_agg == "token" and self.algorithm != "grpo":
            raise ValueError(f"loss_agg='token' weighs tokens, but {self.algorithm!r} is a per-sequence objective: "
                             "use loss_agg='rollout' with gspo")
        if self.use_score_centering and self.algorithm != "grpo":
            raise ValueError(
                "use_score_centering is a token-level objective: it needs algorithm='grpo', "
                f"got {self.algorithm!r}"
            )
        if self.use_score_centering and self.dual_clip_c is not None:
            raise ValueError(
                "dual_clip_c has no effect with use_score_centering (SC REINFORCE has no PPO "
                "ratio to clip); leave it unset"
            )
        return self


_LOG_RHO_CAP = 30.0
"""Sequence-level log IS ratios are capped before ``exp`` (e^30 ≈ 1e13): a long rollout's product would
overflow to inf and turn a masked (zero-weight) token's loss into NaN."""


def _check_shapes(inp: LossInputs, cfg: LossConfig) -> tuple[int, int]:
    """Raise ``ValueError`` naming the first misaligned tensor; return ``(T, R)``."""
    if inp.logprobs.dim() != 1:
        raise ValueError(f"logprobs must be [T], got shape {tuple(inp.logprobs.shape)}")
    t = inp.logprobs.shape[0]
    per_token = {
        "old_logprobs": inp.old_logprobs,
        "rollout_logprobs": inp.rollout_logprobs,
        "advantages": inp.advantages,
        "loss_mask": inp.loss_mask,
        "token_weights": inp.token_weights,
        "rollout_slots": inp.rollout_slots,
        "ref_logprobs": inp.ref_logprobs,
        "entropy": inp.entropy,
    }
    for name, x in per_token.items():
        if x is not None and tuple(x.shape) != (t,):
            raise ValueError(
                f"{name} has shape {tuple(x.shape)} but logprobs has ({t},): every per-token "
                "tensor must be aligned with input_ids"
            )
    r = inp.rollout_token_counts.shape[0]
    per_rollout = {
        "rollout_token_counts": inp.rollout_token_counts,
        "rollout_log_ratio_elsewhere": inp.rollout_log_ratio_elsewhere,
        "rollout_is_log_ratio_elsewhere": inp.rollout_is_log_ratio_elsewhere,
    }
    for name, x in per_rollout.items():
        if x is not None and tuple(x.shape) != (r,):
            raise ValueError(f"{name} has shape {tuple(x.shape)}, expected ({r},) (one entry per rollout)")
    if inp.rollout_slots.dtype != torch.int64:
        raise ValueError(f"rollout_slots must be int64 indices, got {inp.rollout_slots.dtype}")
    if t and (int(inp.rollout_slots.min()) < 0 or int(inp.rollout_slots.max()) >= r):
        raise ValueError(
            f"rollout_slots hold {int(inp.rollout_slots.min())}..{int(inp.rollout_slots.max())} "
            f"but only {r} rollouts have token counts"
        )
    if cfg.kl_coef > 0 and inp.ref_logprobs is None:
        raise ValueError(f"kl_coef={cfg.kl_coef} needs ref_logprobs (a frozen reference model's logprobs)")
    if (
        cfg.is_correction != "none"
        and cfg.is_level == "sequence"
        and inp.rollout_is_log_ratio_elsewhere is None
    ):
        raise ValueError(
            "sequence-level IS needs rollout_is_log_ratio_elsewhere (zeros when every rollout "
            "sits in one micro-batch)"
        )
    if cfg.use_score_centering:
        cand = {
            "nucleus_candidate_logprobs": inp.nucleus_candidate_logprobs,
            "nucleus_sampler_probs": inp.nucleus_sampler_probs,
            "nucleus_valid": inp.nucleus_valid,
        }
        missing = [name for name, x in cand.items() if x is None]
        if missing:
            raise ValueError(
                f"use_score_centering needs {', '.join(missing)} (capture the nucleus: "
                "rollout.capture_nucleus)"
            )
        shapes = {name: tuple(x.shape) for name, x in cand.items() if x is not None}
        shape = shapes["nucleus_candidate_logprobs"]
        if len(shape) != 2 or shape[0] != t:
            raise ValueError(f"nucleus_candidate_logprobs has shape {shape}, expected ({t}, K)")
        for name, other in shapes.items():
            if other != shape:
                raise ValueError(f"{name} has shape {other} but nucleus_candidate_logprobs has {shape}")
        assert inp.nucleus_valid is not None
        bare = int(((inp.loss_mask > 0) & ~inp.nucleus_valid.any(-1)).sum())  # trained tokens, no nucleus
        if bare:
            raise ValueError(
                f"use_score_centering: {bare} trained token(s) have no captured nucleus (every sampled token "
                "needs one: rollout.capture_nucleus on the engine that sampled them)"
            )
    return t, r


def _per_rollout_sum(values: torch.Tensor, slots: torch.Tensor, n_rollouts: int) -> torch.Tensor:
    """[R] sum of ``values`` [T] over the tokens of each rollout slot (keeps the gradient)."""
    return values.new_zeros(n_rollouts).index_add(0, slots, values)  # [R]


def _is_weights(inp: LossInputs, cfg: LossConfig, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Detached IS weight ``[T]`` and a flag ``[T]`` (1.0 where TIS clamped or MIS masked)."""
    mask = inp.loss_mask  # [T]
    if cfg.is_correction == "none":
        return torch.ones_like(inp.logprobs), torch.zeros_like(inp.logprobs)  # [T], [T]
    log_rho = ((inp.old_logprobs - inp.rollout_logprobs) * mask).detach()  # [T] 0 on context
    if cfg.is_level == "sequence":
        assert inp.rollout_is_log_ratio_elsewhere is not None  # _check_shapes
        seq = _per_rollout_sum(log_rho, inp.rollout_slots, r) + inp.rollout_is_log_ratio_elsewhere  # [R]
        log_rho = seq[inp.rollout_slots]  # [T] the rollout's log product on each of its tokens
    rho = torch.exp(log_rho.clamp(-_LOG_RHO_CAP, _LOG_RHO_CAP))  # [T]
    outside = (rho < cfg.is_low) | (rho > cfg.is_high)  # [T] bool
    if cfg.is_correction == "tis":
        weight = rho.clamp(cfg.is_low, cfg.is_high)  # [T]
    else:
        weight = torch.where(outside, torch.zeros_like(rho), rho)  # [T]
    return weight, outside.to(rho.dtype)  # [T], [T]


def _sc_correction(inp: LossInputs) -> torch.Tensor:
    """[T] ``sum_k (q_k - sg(p_k)) log p_k`` over the valid nucleus candidates (carries the gradient)."""
    valid = inp.nucleus_valid  # [T, K] bool
    cand = inp.nucleus_candidate_logprobs  # [T, K] trainer log p_k, normalised over the nucleus
    q = inp.nucleus_sampler_probs  # [T, K] sampler probabilities
    assert valid is not None and cand is not None and q is not None  # _check_shapes
    cand = torch.where(valid, cand, torch.zeros_like(cand))  # [T, K] padding → 0 (no -inf * 0 = NaN)
    p = torch.exp(cand).detach() * valid  # [T, K]
    return ((q * valid - p) * cand).sum(-1)  # [T]


class PolicyLoss:
    """The configured objective, a ``LossFn`` (see the module docstring for the formulas)."""

    def __init__(self, cfg: LossConfig) -> None:
        self.config = cfg

    @property
    def needs_rollout_log_ratio(self) -> bool:
        """Whether ``rollout_log_ratio_elsewhere`` changes the result (GSPO's sequence ratio): a backend
        may skip the extra no-grad forward that computes it exactly when this is False."""
        return self.config.algorithm == "gspo"

    def __call__(self, inp: LossInputs) -> LossOutput:
        cfg = self.config
        _, r = _check_shapes(inp, cfg)
        lp = inp.logprobs  # [T] carries the gradient
        adv = inp.advantages  # [T]
        if cfg.loss_agg == "token":
            w_tok = inp.loss_mask / inp.rollout_token_counts.sum().clamp(min=1)  # [T] 1 / sum_r N_r
        else:
            w_tok = inp.token_weights  # [T] loss_mask / (N_r * R)
        is_weight, is_flag = _is_weights(inp, cfg, r)  # [T], [T]
        metrics: dict[str, float] = {}
        zero = torch.zeros_like(lp)  # [T]
        if cfg.algorithm == "gspo":
            local = _per_rollout_sum((lp - inp.old_logprobs) * inp.loss_mask, inp.rollout_slots, r)  # [R]
            seq_sum = local.detach() + inp.rollout_log_ratio_elsewhere  # [R] over the whole rollout
            seq_log = seq_sum / inp.rollout_token_counts.clamp(min=1)  # [R] length-normalised
            log_ratio = seq_log[inp.rollout_slots] + lp - lp.detach()  # [T] value: the rollout's; grad: lp's
        else:
            log_ratio = lp - inp.old_logprobs  # [T]
        ratio = torch.exp(log_ratio)  # [T]
        clipped_low, clipped_high, dual = zero, zero, zero  # [T] each
        if cfg.use_score_centering:
            sc = _sc_correction(inp)  # [T]
            pg = -adv * (lp - sc)  # [T] centred-score REINFORCE
            metrics["sc_correction"] = float((w_tok * sc).detach().sum())
        else:
            surr = ratio * adv  # [T]
            surr_clipped = ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high) * adv  # [T]
            pg = -torch.minimum(surr, surr_clipped)  # [T]
            clipped_low = ((ratio < 1 - cfg.clip_low) & (adv < 0)).to(lp.dtype)  # [T] clip binds below
            clipped_high = ((ratio > 1 + cfg.clip_high) & (adv > 0)).to(lp.dtype)  # [T] clip binds above
            if cfg.dual_clip_c is not None:
                cap = -cfg.dual_clip_c * adv  # [T] c * |A| where A < 0
                dual = ((adv < 0) & (pg > cap)).to(lp.dtype)  # [T]
                pg = torch.where(adv < 0, torch.minimum(pg, cap), pg)  # [T]
        per_token = is_weight * pg  # [T]
        metrics["pg_loss"] = float((w_tok * per_token).detach().sum())
        if cfg.kl_coef > 0:
            assert inp.ref_logprobs is not None  # _check_shapes
            d = inp.ref_logprobs - lp  # [T]
            kl = torch.exp(d) - d - 1  # [T] k3, >= 0
            per_token = per_token + cfg.kl_coef * kl  # [T]
            metrics["kl"] = float((w_tok * kl).detach().sum())
        loss = (w_tok * per_token).sum()  # []
        metrics["clip_frac_low"] = float((w_tok * clipped_low).sum())
        metrics["clip_frac_high"] = float((w_tok * clipped_high).sum())
        if cfg.dual_clip_c is not None:
            metrics["dual_clip_frac"] = float((w_tok * dual).sum())
        metrics["ratio_mean"] = float((w_tok * ratio.detach()).sum())
        if cfg.is_correction != "none":
            metrics["is_weight_mean"] = float((w_tok * is_weight).sum())
            metrics["tis_clamped_frac" if cfg.is_correction == "tis" else "mis_masked_frac"] = float(
                (w_tok * is_flag).sum()
            )
        if inp.entropy is not None:
            metrics["entropy"] = float((w_tok * inp.entropy.detach()).sum())
        metrics["token_weight"] = float(w_tok.sum())
        return LossOutput(loss=loss, metrics=metrics)


def make_loss(cfg: LossConfig) -> PolicyLoss:
    """The configured objective as a ``LossFn``."""
    return PolicyLoss(cfg)


class SftLoss:
    """Supervised warm start: cross-entropy of the loss-masked (demonstrated) tokens, a ``LossFn``.

    ``per_token = -logprobs`` on the tokens with ``loss_mask`` 1, weighted by ``token_weights``
    (``loss_mask / (N_r * R)``, the packing's one denominator per rollout): the step loss is the mean over
    demonstrations of each demonstration's mean token NLL, so a long demonstration does not outweigh a short
    one. The backend's ``train_step`` runs it like a policy loss; it reads neither ``old_logprobs`` nor
    advantages (pass zeros), and the backend should score at temperature 1 with no truncation.
    """

    needs_rollout_log_ratio = False
    """No sequence ratio: the backend skips GSPO's extra no-grad forward."""

    def __call__(self, inp: LossInputs) -> LossOutput:
        lp = inp.logprobs  # [T] carries the gradient
        if lp.dim() != 1:
            raise ValueError(f"logprobs must be [T], got shape {tuple(lp.shape)}")
        t = lp.shape[0]
        for name, x in {"loss_mask": inp.loss_mask, "token_weights": inp.token_weights,
                        "entropy": inp.entropy}.items():
            if x is not None and tuple(x.shape) != (t,):
                raise ValueError(f"{name} has shape {tuple(x.shape)} but logprobs has ({t},)")
        w_tok = inp.token_weights * inp.loss_mask  # [T] zero on context whatever the weights say
        nll = -lp  # [T]
        loss = (w_tok * nll).sum()  # []
        metrics = {"nll": float(loss.detach()), "token_weight": float(w_tok.sum())}
        if inp.entropy is not None:
            metrics["entropy"] = float((w_tok * inp.entropy.detach()).sum())
        return LossOutput(loss=loss, metrics=metrics)
