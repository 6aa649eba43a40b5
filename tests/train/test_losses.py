"""The policy losses: hand-computed cases, gradients against a direct formula, micro-batch split invariance,
and the errors a misaligned batch gets."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from lego_rl.train.backend import LossInputs
from lego_rl.train.losses import LossConfig, make_loss

# Tolerances in this file: hand-computed (fp64) expectations against a handful of fp32 ops on a few tokens
# with values of order 1, or two fp32 formulas of the same few values; no matmul kernel or thread split is
# involved. abs=1e-6 is ~8 fp32 ulps at 1 (the inputs' own rounding, e.g. log r, is one or two); abs=1e-7 is
# used where the value is near 0 and built from the same rounded inputs on both sides.


def inputs(
    ratios: list[float],
    adv: list[float],
    slots: list[int],
    mask: list[float] | None = None,
    *,
    rho: list[float] | None = None,
    **extra: torch.Tensor,
) -> LossInputs:
    """A micro-batch whose trained tokens have the given PPO ratios (``old = -1``, ``lp = old + log r``) and
    sampler/trainer IS ratios ``rho``; token weights are ``mask / (N_r * R)`` as ``plan_steps`` makes them."""
    n = len(ratios)
    m = torch.tensor(mask if mask is not None else [1.0] * n, dtype=torch.float32)  # [T]
    old = torch.full((n,), -1.0)  # [T]
    lp = (old + torch.tensor(ratios).log()).requires_grad_()  # [T]
    rollout = (
        old - torch.tensor(rho if rho is not None else [1.0] * n).log()
    )  # [T] so old - rollout = log rho
    s = torch.tensor(slots)  # [T]
    r = int(s.max()) + 1
    counts = torch.zeros(r).index_add(0, s, m)  # [R]
    return LossInputs(
        logprobs=lp,
        old_logprobs=old,
        rollout_logprobs=rollout,
        advantages=torch.tensor(adv, dtype=torch.float32),
        loss_mask=m,
        token_weights=m / (counts[s] * r),
        rollout_slots=s,
        rollout_token_counts=counts,
        rollout_log_ratio_elsewhere=torch.zeros(r),
        **extra,
    )


def test_grpo_hand_computed_clipping_loss_metrics_and_gradient():
    # Context token first (mask 0, absurd ratio: must not count). Rollout 0 (A=+1): ratios 1.5, 1.0;
    # rollout 1 (A=-1): ratios 0.5, 1.1. R=2, N_r=2 → each trained token weighs 1/4.
    inp = inputs([9.0, 1.5, 1.0, 0.5, 1.1], [1, 1, 1, -1, -1], [0, 0, 0, 1, 1], [0, 1, 1, 1, 1])
    out = make_loss(LossConfig(clip_low=0.2, clip_high=0.28))(inp)
    # per token: 1.5 → -min(1.5, 1.28) = -1.28 (clipped high); 1.0 → -1.0;
    # 0.5, A=-1 → -min(-0.5, -0.8) = 0.8 (clipped low); 1.1, A=-1 → -min(-1.1, -1.1) = 1.1
    # loss = (-1.28 - 1.0 + 0.8 + 1.1) / 4 = -0.095
    assert out.loss.item() == pytest.approx(-0.095, abs=1e-6)
    assert out.metrics["clip_frac_high"] == pytest.approx(0.25) and out.metrics[
        "clip_frac_low"
    ] == pytest.approx(0.25)
    assert out.metrics["ratio_mean"] == pytest.approx((1.5 + 1.0 + 0.5 + 1.1) / 4, abs=1e-6)
    assert out.metrics["token_weight"] == pytest.approx(1.0)
    out.loss.backward()
    # d/dlp of -w*r*A = -w*r*A where unclipped, 0 where clipped: [0, 0, -1/4, 0, 1.1/4]
    assert inp.logprobs.grad.tolist() == pytest.approx([0.0, 0.0, -0.25, 0.0, 0.275], abs=1e-6)


def test_dual_clip_caps_a_negative_advantage_tokens_loss():
    # One token, ratio 5, A=-1: PPO loss -min(-5, -1.28) = 5, gradient -r*A = 5; dual clip c=3 caps it at 3.
    plain = inputs([5.0], [-1.0], [0])
    out = make_loss(LossConfig())(plain)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(5.0) and plain.logprobs.grad.item() == pytest.approx(5.0)
    capped = inputs([5.0], [-1.0], [0])
    out = make_loss(LossConfig(dual_clip_c=3.0))(capped)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(3.0) and capped.logprobs.grad.item() == 0.0
    assert out.metrics["dual_clip_frac"] == 1.0


def test_token_tis_clamps_and_mis_masks():
    # rho = [3.0, 0.5], A=+1, ratio 1, one rollout of two tokens (weights 1/2). pg = -1 per token.
    # TIS (high 2): weights [2, 0.5] → loss -(2 + 0.5)/2 = -1.25; MIS: [0, 0.5] → -0.25.
    tis = make_loss(LossConfig(is_correction="tis", is_high=2.0))(
        inputs([1, 1], [1, 1], [0, 0], rho=[3.0, 0.5])
    )
    assert tis.loss.item() == pytest.approx(-1.25)
    assert tis.metrics["tis_clamped_frac"] == pytest.approx(0.5) and tis.metrics[
        "is_weight_mean"
    ] == pytest.approx(1.25)
    mis = make_loss(LossConfig(is_correction="mis", is_high=2.0))(
        inputs([1, 1], [1, 1], [0, 0], rho=[3.0, 0.5])
    )
    assert mis.loss.item() == pytest.approx(-0.25) and mis.metrics["mis_masked_frac"] == pytest.approx(0.5)
    # MIS with a lower bound too: rho 0.5 < 0.6 is masked as well → nothing trains.
    both = make_loss(LossConfig(is_correction="mis", is_low=0.6, is_high=2.0))(
        inputs([1, 1], [1, 1], [0, 0], rho=[3.0, 0.5])
    )
    assert both.loss.item() == 0.0 and both.metrics["mis_masked_frac"] == pytest.approx(1.0)


def test_sequence_level_is_uses_the_product_over_the_rollout():
    # Rollout 0: rho 1.5 and 1.5 → 2.25 → TIS clamps to 2 on both tokens; rollout 1: rho 1.2, 0.5 → 0.6.
    # A=+1, ratio 1 → pg -1 per token; weights 1/4 → loss = -(2 + 2 + 0.6 + 0.6)/4 = -1.3
    cfg = LossConfig(is_correction="tis", is_level="sequence", is_high=2.0)
    inp = inputs(
        [1] * 4,
        [1] * 4,
        [0, 0, 1, 1],
        rho=[1.5, 1.5, 1.2, 0.5],
        rollout_is_log_ratio_elsewhere=torch.zeros(2),
    )
    out = make_loss(cfg)(inp)
    assert out.loss.item() == pytest.approx(-1.3, abs=1e-6)
    assert out.metrics["tis_clamped_frac"] == pytest.approx(0.5)
    mis = make_loss(cfg.model_copy(update={"is_correction": "mis"}))(inp)
    assert mis.loss.item() == pytest.approx(-0.3, abs=1e-6)  # rollout 0 masked whole: -(0.6 + 0.6)/4


def test_gspo_hand_computed_sequence_ratio_and_gradient():
    # Rollout 0 (A=+1): token ratios 1.2, 1.0 → s = exp(mean log) = sqrt(1.2) ≈ 1.095445 (unclipped).
    # Rollout 1 (A=+1): ratios 2, 2 → s = 2 > 1.28: clipped, no gradient.
    # loss = (1/2) * (-sqrt(1.2)) + (1/2) * (-1.28); grad of rollout 0's tokens = -s / (N_r * R) = -s/4 each.
    inp = inputs([1.2, 1.0, 2.0, 2.0], [1, 1, 1, 1], [0, 0, 1, 1])
    out = make_loss(LossConfig(algorithm="gspo"))(inp)
    s = math.sqrt(1.2)
    assert out.loss.item() == pytest.approx(-(s + 1.28) / 2, abs=1e-6)
    assert out.metrics["clip_frac_high"] == pytest.approx(0.5)
    assert out.metrics["ratio_mean"] == pytest.approx((s + 2) / 2, abs=1e-6)
    out.loss.backward()
    assert inp.logprobs.grad.tolist() == pytest.approx([-s / 4, -s / 4, 0.0, 0.0], abs=1e-6)


def test_k3_kl_and_entropy_metric():
    # ratio 1, A = 0 → no policy term; ref - lp = log 2 → k3 = 2 - log 2 - 1 ≈ 0.306853; coef 0.1.
    inp = inputs(
        [1.0], [0.0], [0], ref_logprobs=torch.tensor([-1.0 + math.log(2)]), entropy=torch.tensor([1.7])
    )
    out = make_loss(LossConfig(kl_coef=0.1))(inp)
    k3 = 2 - math.log(2) - 1
    assert out.loss.item() == pytest.approx(0.1 * k3, abs=1e-7)
    assert out.metrics["kl"] == pytest.approx(k3, abs=1e-7) and out.metrics["entropy"] == pytest.approx(1.7)
    out.loss.backward()
    # d/dlp of 0.1*(e^(ref-lp) - (ref-lp) - 1) = 0.1*(1 - e^(ref-lp)) = 0.1*(1 - 2) = -0.1
    assert inp.logprobs.grad.item() == pytest.approx(-0.1, abs=1e-6)


def sc_inputs(logits: torch.Tensor, q: list[float], adv: float) -> LossInputs:
    """One trained token: the sampled id is nucleus candidate 0; the trainer's nucleus is ``logits``."""
    cand = torch.log_softmax(logits, -1).unsqueeze(0)  # [1, K]
    base = inputs([1.0], [adv], [0])
    base.logprobs = cand[:, 0]  # [1] the sampled token's logprob, same normalisation as the candidates
    base.old_logprobs = cand[:, 0].detach()  # [1]
    base.nucleus_candidate_logprobs = cand  # [1, K]
    base.nucleus_sampler_probs = torch.tensor([q])  # [1, K]
    base.nucleus_valid = torch.ones_like(cand, dtype=torch.bool)  # [1, K]
    return base


def test_score_centering_hand_computed_and_zero_when_sampler_matches():
    # Trainer p = [0.75, 0.25], sampler q = [0.5, 0.5], sampled candidate 0, A = +1.
    # sc = (0.5-0.75) log 0.75 + (0.5-0.25) log 0.25 = 0.071921 - 0.346574 = -0.274653
    # loss = -A (log 0.75 - sc) = -(-0.287682 + 0.274653) = 0.013029
    # grad wrt logits: -A (grad lp - sum_k q_k grad log p_k) = -((e0 - p) - (q - p)) = q - e0 = [-0.5, 0.5]
    logits = torch.tensor([math.log(3.0), 0.0], requires_grad=True)  # softmax = [0.75, 0.25]
    out = make_loss(LossConfig(use_score_centering=True))(sc_inputs(logits, [0.5, 0.5], 1.0))
    assert out.metrics["sc_correction"] == pytest.approx(-0.274653, abs=1e-5)
    assert out.loss.item() == pytest.approx(0.013029, abs=1e-5)
    out.loss.backward()
    assert logits.grad.tolist() == pytest.approx([-0.5, 0.5], abs=1e-6)
    # Sampler == trainer: the correction is zero, the gradient is still the centred score q - e0.
    same = make_loss(LossConfig(use_score_centering=True))(
        sc_inputs(logits.detach().requires_grad_(), [0.75, 0.25], 1.0)
    )
    assert same.metrics["sc_correction"] == pytest.approx(0.0, abs=1e-7)


def test_score_centering_padding_is_ignored():
    # Candidate slot 2 is padding (-inf logprob, garbage prob): same result as the 2-candidate nucleus.
    logits = torch.tensor([math.log(3.0), 0.0])
    inp = sc_inputs(logits, [0.5, 0.5], 1.0)
    ref = make_loss(LossConfig(use_score_centering=True))(inp).loss.item()
    inp.nucleus_candidate_logprobs = torch.cat(
        [inp.nucleus_candidate_logprobs, torch.tensor([[-math.inf]])], 1
    )
    inp.nucleus_sampler_probs = torch.cat([inp.nucleus_sampler_probs, torch.tensor([[7.0]])], 1)
    inp.nucleus_valid = torch.tensor([[True, True, False]])
    assert make_loss(LossConfig(use_score_centering=True))(inp).loss.item() == pytest.approx(ref)


# ----------------------------------------------------------------------------- against a direct formula


def random_step(seed: int, n_tokens: int = 40, n_rollouts: int = 5):
    g = torch.Generator().manual_seed(seed)
    slots = torch.randint(0, n_rollouts, (n_tokens,), generator=g)  # [T]
    slots[:n_rollouts] = torch.arange(n_rollouts)  # every rollout has tokens
    mask = (torch.rand(n_tokens, generator=g) > 0.25).float()  # [T]
    mask[:n_rollouts] = 1.0
    old = -torch.rand(n_tokens, generator=g) * 3  # [T]
    lp = old + (torch.rand(n_tokens, generator=g) - 0.5) * 0.8  # [T] ratios in ~[0.67, 1.5]
    rollout = old + (torch.rand(n_tokens, generator=g) - 0.5) * 0.6  # [T]
    adv_r = torch.randn(n_rollouts, generator=g)  # [R]
    return slots, mask, old, lp, rollout, adv_r


def as_inputs(slots, mask, old, lp, rollout, adv_r) -> LossInputs:
    r = adv_r.numel()
    counts = torch.zeros(r).index_add(0, slots, mask)  # [R]
    return LossInputs(
        logprobs=lp,
        old_logprobs=old,
        rollout_logprobs=rollout,
        advantages=adv_r[slots],
        loss_mask=mask,
        token_weights=mask / (counts[slots] * r),
        rollout_slots=slots,
        rollout_token_counts=counts,
        rollout_log_ratio_elsewhere=torch.zeros(r),
        rollout_is_log_ratio_elsewhere=torch.zeros(r),
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("is_correction", ["none", "tis", "mis"])
def test_grpo_gradient_matches_the_textbook_formula(seed, is_correction):
    slots, mask, old, lp0, rollout, adv_r = random_step(seed)
    cfg = LossConfig(is_correction=is_correction, is_low=0.8, is_high=1.2, dual_clip_c=1.3)
    lp = lp0.clone().requires_grad_()
    make_loss(cfg)(as_inputs(slots, mask, old, lp, rollout, adv_r)).loss.backward()
    # Direct: (1/R) sum_r (1/N_r) sum_{t in r} w_t * dualclip(-min(r_t A, clip(r_t) A)), loops, no tensors tricks.
    lp_d = lp0.clone().requires_grad_()
    total = torch.zeros(())
    for k in range(adv_r.numel()):
        toks = [t for t in range(len(slots)) if slots[t] == k and mask[t] == 1]
        acc = torch.zeros(())
        for t in toks:
            ratio = torch.exp(lp_d[t] - old[t])
            a = adv_r[k]
            term = -torch.minimum(ratio * a, torch.clamp(ratio, 0.8, 1.28) * a)
            if a < 0:
                term = torch.minimum(term, -1.3 * a)
            rho = math.exp(float(old[t] - rollout[t]))
            if is_correction == "tis":
                term = term * min(max(rho, 0.8), 1.2)
            elif is_correction == "mis":
                term = term * (rho if 0.8 <= rho <= 1.2 else 0.0)
            acc = acc + term
        total = total + acc / len(toks)
    (total / adv_r.numel()).backward()
    assert torch.allclose(lp.grad, lp_d.grad, atol=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_gspo_gradient_matches_the_sequence_formula(seed):
    slots, mask, old, lp0, rollout, adv_r = random_step(seed)
    cfg = LossConfig(algorithm="gspo", clip_low=0.05, clip_high=0.08)
    lp = lp0.clone().requires_grad_()
    out = make_loss(cfg)(as_inputs(slots, mask, old, lp, rollout, adv_r))
    out.loss.backward()
    # Direct: s_r = exp(mean_{t in r}(lp - old)) as a function of lp (no stop-gradient tricks),
    # loss = (1/R) sum_r -min(s_r A_r, clip(s_r) A_r).
    lp_d = lp0.clone().requires_grad_()
    total = torch.zeros(())
    for k in range(adv_r.numel()):
        sel = (slots == k) & (mask == 1)
        s = torch.exp((lp_d[sel] - old[sel]).mean())
        total = total - torch.minimum(s * adv_r[k], torch.clamp(s, 0.95, 1.08) * adv_r[k])
    total = total / adv_r.numel()
    assert out.loss.item() == pytest.approx(total.item(), abs=1e-6)
    total.backward()
    assert torch.allclose(lp.grad, lp_d.grad, atol=1e-6)


def test_score_centering_gradient_matches_autograd_on_a_vocabulary():
    # Three positions over a 6-token vocabulary, nuclei of sizes 3, 2, 4 (padded to 4). The loss's gradient
    # wrt the logits must equal -A * (grad log p(y) - sum_k q_k grad log p_k), written here directly.
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(3, 6, generator=g, requires_grad=True)
    nuclei = [[2, 0, 5], [1, 3], [4, 2, 0, 1]]
    q = [[0.5, 0.3, 0.2], [0.6, 0.4], [0.4, 0.3, 0.2, 0.1]]
    adv = torch.tensor([1.0, -0.5, 2.0])
    cand = torch.zeros(3, 4)
    valid = torch.zeros(3, 4, dtype=torch.bool)
    qt = torch.zeros(3, 4)
    rows = []
    for i, ids in enumerate(nuclei):
        logp = torch.log_softmax(logits[i, ids], -1)  # [K_i] normalised over the nucleus
        rows.append(torch.cat([logp, torch.zeros(4 - len(ids))]))
        valid[i, : len(ids)] = True
        qt[i, : len(ids)] = torch.tensor(q[i])
    cand = torch.stack(rows)  # [3, 4]
    lp = cand[:, 0]  # [3] the sampled token is each nucleus's first id
    inp = LossInputs(
        logprobs=lp,
        old_logprobs=lp.detach(),
        rollout_logprobs=lp.detach(),
        advantages=adv,
        loss_mask=torch.ones(3),
        token_weights=torch.full((3,), 1 / 3),
        rollout_slots=torch.zeros(3, dtype=torch.long),
        rollout_token_counts=torch.tensor([3.0]),
        rollout_log_ratio_elsewhere=torch.zeros(1),
        nucleus_candidate_logprobs=cand,
        nucleus_sampler_probs=qt,
        nucleus_valid=valid,
    )
    make_loss(LossConfig(use_score_centering=True))(inp).loss.backward()
    expected = torch.zeros(3, 6)
    for i, ids in enumerate(nuclei):
        p = torch.softmax(logits.detach()[i, ids], -1)  # [K_i]
        # grad_z log p_j (nucleus softmax) = e_j - p on the nucleus ids
        score_y = -p.clone()
        score_y[0] += 1
        centred = score_y - (torch.tensor(q[i]) - p)  # grad log p(y) - sum_k q_k (e_k - p) = e_0 - q
        expected[i, ids] = -adv[i] * centred / 3
    assert torch.allclose(logits.grad, expected, atol=1e-6)


# ----------------------------------------------------------------------------- micro-batch split invariance


@pytest.mark.parametrize(
    "cfg",
    [
        LossConfig(),
        LossConfig(algorithm="gspo", clip_low=0.05, clip_high=0.08),
        LossConfig(is_correction="mis", is_level="sequence", is_low=0.5, is_high=1.8),
        LossConfig(algorithm="gspo", is_correction="tis", is_level="sequence", is_high=1.5, kl_coef=0.05),
    ],
    ids=["grpo", "gspo", "grpo-seq-mis", "gspo-seq-tis-kl"],
)
def test_one_micro_batch_equals_the_same_tokens_split_in_two(cfg):
    slots, mask, old, lp0, rollout, adv_r = random_step(11, n_tokens=30, n_rollouts=3)
    ref = old + 0.1
    lp_one = lp0.clone().requires_grad_()
    one = as_inputs(slots, mask, old, lp_one, rollout, adv_r)
    one.ref_logprobs = ref
    out_one = make_loss(cfg)(one)
    out_one.loss.backward()

    lp_two = lp0.clone().requires_grad_()
    full = as_inputs(slots, mask, old, lp_two, rollout, adv_r)
    cut = 13  # every rollout has tokens on both sides of the cut
    parts = [slice(0, cut), slice(cut, 30)]
    r = adv_r.numel()

    def rollout_sum(x: torch.Tensor, sl: slice) -> torch.Tensor:
        return torch.zeros(r).index_add(0, slots[sl], (x * mask)[sl])  # [R]

    loss_sum, metrics = torch.zeros(()), {}
    for k, sl in enumerate(parts):
        other = parts[1 - k]
        mb = LossInputs(
            logprobs=lp_two[sl],
            old_logprobs=old[sl],
            rollout_logprobs=rollout[sl],
            advantages=full.advantages[sl],
            loss_mask=mask[sl],
            token_weights=full.token_weights[sl],
            rollout_slots=slots[sl],
            rollout_token_counts=full.rollout_token_counts,
            rollout_log_ratio_elsewhere=rollout_sum(lp_two.detach() - old, other),
            rollout_is_log_ratio_elsewhere=rollout_sum(old - rollout, other),
            ref_logprobs=ref[sl],
        )
        out = make_loss(cfg)(mb)
        out.loss.backward()  # gradient accumulation by summation, as the backend does
        loss_sum = loss_sum + out.loss.detach()
        for key, v in out.metrics.items():
            metrics[key] = metrics.get(key, 0.0) + v
    assert loss_sum.item() == pytest.approx(out_one.loss.item(), abs=1e-6)
    assert torch.allclose(lp_one.grad, lp_two.grad, atol=1e-7)
    assert metrics == pytest.approx(out_one.metrics, abs=1e-6)


# ----------------------------------------------------------------------------- failure paths


def test_misaligned_tensors_are_refused_by_name():
    loss = make_loss(LossConfig())
    inp = inputs([1.0, 1.0, 1.0], [1, 1, 1], [0, 0, 0])
    inp.advantages = torch.ones(2)
    with pytest.raises(ValueError, match=r"advantages has shape \(2,\) but logprobs has \(3,\)"):
        loss(inp)
    inp = inputs([1.0, 1.0], [1, 1], [0, 1])
    inp.rollout_log_ratio_elsewhere = torch.zeros(3)
    with pytest.raises(ValueError, match=r"rollout_log_ratio_elsewhere has shape \(3,\), expected \(2,\)"):
        loss(inp)
    inp = inputs([1.0, 1.0], [1, 1], [0, 1])
    inp.rollout_slots = torch.tensor([0, 2])
    with pytest.raises(ValueError, match="rollout_slots hold 0..2 but only 2 rollouts"):
        loss(inp)
    inp = inputs([1.0, 1.0], [1, 1], [0, 1])
    inp.rollout_slots = inp.rollout_slots.int()
    with pytest.raises(ValueError, match="rollout_slots must be int64"):
        loss(inp)
    inp = inputs([1.0, 1.0], [1, 1], [0, 0])
    inp.logprobs = inp.logprobs.detach().view(1, 2)
    with pytest.raises(ValueError, match=r"logprobs must be \[T\], got shape \(1, 2\)"):
        loss(inp)


def test_missing_optional_inputs_are_named():
    with pytest.raises(ValueError, match="kl_coef=0.1 needs ref_logprobs"):
        make_loss(LossConfig(kl_coef=0.1))(inputs([1.0], [1.0], [0]))
    with pytest.raises(
        ValueError, match="use_score_centering needs nucleus_candidate_logprobs, nucleus_sampler"
    ):
        make_loss(LossConfig(use_score_centering=True))(inputs([1.0], [1.0], [0]))
    inp = sc_inputs(torch.zeros(2), [0.5, 0.5], 1.0)
    inp.nucleus_valid = torch.ones(1, 3, dtype=torch.bool)
    with pytest.raises(
        ValueError, match=r"nucleus_valid has shape \(1, 3\) but nucleus_candidate_logprobs has"
    ):
        make_loss(LossConfig(use_score_centering=True))(inp)
    inp = inputs([1.0], [1.0], [0])
    with pytest.raises(ValueError, match="sequence-level IS needs rollout_is_log_ratio_elsewhere"):
        make_loss(LossConfig(is_correction="tis", is_level="sequence"))(inp)


def test_inconsistent_configs_are_refused():
    with pytest.raises(ValidationError, match=r"is_low \(2.0\) must be below is_high \(1.5\)"):
        LossConfig(is_low=2.0, is_high=1.5)
    with pytest.raises(ValidationError, match="needs algorithm='grpo', got 'gspo'"):
        LossConfig(use_score_centering=True, algorithm="gspo")
    with pytest.raises(ValidationError, match="dual_clip_c has no effect with use_score_centering"):
        LossConfig(use_score_centering=True, dual_clip_c=3.0)
    with pytest.raises(ValidationError, match="dual_clip_c"):
        LossConfig(dual_clip_c=0.5)
    with pytest.raises(ValidationError, match="clip_low"):
        LossConfig(clip_low=1.0)


def test_token_aggregation_cancels_what_a_group_shares_and_rollout_aggregation_does_not() -> None:
    # A group of two rollouts with advantages +1 and -1 whose first 3 trained tokens are the same tokens in the
    # same context (same logprobs): under loss_agg="token" their gradients cancel exactly; under "rollout" the
    # shorter rollout (the failure, 4 tokens vs 10) weighs 2.5x per token and pushes the shared tokens down.
    shared = torch.tensor([-0.5, -0.2, -0.1])  # [3]
    lp_a = torch.cat([shared, torch.full((7,), -0.3)])  # [10] success
    lp_b = torch.cat([shared, torch.tensor([-2.0])])  # [4] failure
    base = torch.cat([lp_a, lp_b])  # [14]
    slots = torch.tensor([0] * 10 + [1] * 4)  # [14]
    counts = torch.tensor([10.0, 4.0])  # [2]
    adv = torch.tensor([1.0] * 10 + [-1.0] * 4)  # [14]
    mask = torch.ones(14)  # [14]
    grads = {}
    for agg in ("rollout", "token"):
        lp = base.clone().requires_grad_(True)  # [14]
        inp = LossInputs(logprobs=lp, old_logprobs=base.clone(), rollout_logprobs=base.clone(), advantages=adv,
                         loss_mask=mask, token_weights=mask / (counts[slots] * 2), rollout_slots=slots,
                         rollout_token_counts=counts, rollout_log_ratio_elsewhere=torch.zeros(2))
        out = make_loss(LossConfig(loss_agg=agg))(inp)
        out.loss.backward()
        grads[agg] = lp.grad
        assert out.metrics["token_weight"] == pytest.approx(1.0)
    shared_net = {agg: (g[:3] + g[10:13]).tolist() for agg, g in grads.items()}  # [3] the shared tokens' net push
    assert shared_net["token"] == pytest.approx([0.0, 0.0, 0.0], abs=1e-7)
    # d loss / d lp > 0 means the update lowers lp: the failure's weight wins under "rollout".
    assert all(x > 0.05 for x in shared_net["rollout"]), shared_net
    assert grads["token"][0].item() == pytest.approx(-1 / 14)  # every token weighs 1 / sum(N_r)


def test_token_aggregation_is_refused_with_gspo() -> None:
    with pytest.raises(ValueError, match="per-sequence objective"):
        LossConfig(algorithm="gspo", loss_agg="token")
