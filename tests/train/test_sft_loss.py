"""The SFT loss (cross-entropy on the loss-masked tokens): a hand-computed case, the gradient against the
closed form on a vocabulary, split invariance through the real packing, and the errors it gives."""

from __future__ import annotations

import math

import pytest
import torch

from lego_rl.train.backend import LossInputs
from lego_rl.train.batching import plan_steps
from lego_rl.train.losses import SftLoss
from lego_rl.trajectory.sample import Sample
from support.numerics import rounding_tolerance


def sft_inputs(
    lp: torch.Tensor, mask: list[float], slots: list[int], entropy: torch.Tensor | None = None
) -> LossInputs:
    m = torch.tensor(mask, dtype=torch.float32)  # [T]
    s = torch.tensor(slots)  # [T]
    r = int(s.max()) + 1
    counts = torch.zeros(r).index_add(0, s, m)  # [R]
    zeros = torch.zeros_like(m)  # [T]
    return LossInputs(logprobs=lp, old_logprobs=zeros, rollout_logprobs=zeros, advantages=zeros, loss_mask=m,
                      token_weights=m / (counts[s] * r), rollout_slots=s, rollout_token_counts=counts,
                      rollout_log_ratio_elsewhere=torch.zeros(r), entropy=entropy)


def test_hand_computed_mean_over_demonstrations_of_token_means():
    # Rollout 0: a context token (p = 0.01, mask 0: must not count), then p = 1/2 and 1/4.
    # Rollout 1: one token, p = 1/8. R = 2 → weights 1/(2·2) for rollout 0's tokens, 1/(1·2) for rollout 1's.
    probs = torch.tensor([0.01, 0.5, 0.25, 0.125])  # [T]
    lp = probs.log().requires_grad_()  # [T]
    out = SftLoss()(sft_inputs(lp, [0, 1, 1, 1], [0, 0, 0, 1], entropy=torch.tensor([9.0, 1.0, 2.0, 4.0])))
    # loss = 1/4 (ln 2 + ln 4) + 1/2 ln 8 = (3/4 + 3/2) ln 2
    assert out.loss.item() == pytest.approx(2.25 * math.log(2), abs=1e-6)
    assert out.metrics["nll"] == pytest.approx(2.25 * math.log(2), abs=1e-6)
    assert out.metrics["token_weight"] == pytest.approx(1.0)
    assert out.metrics["entropy"] == pytest.approx(0.25 * 1 + 0.25 * 2 + 0.5 * 4)
    out.loss.backward()
    assert lp.grad is not None
    assert lp.grad.tolist() == pytest.approx([0.0, -0.25, -0.25, -0.5])  # d loss / d lp = -weight, 0 on context


def test_gradient_on_logits_is_weight_times_softmax_minus_onehot():
    torch.manual_seed(0)
    t, v = 12, 7
    logits = torch.randn(t, v, requires_grad=True)  # [T, V]
    targets = torch.randint(0, v, (t,))  # [T]
    lp = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [T]
    mask = [0, 1, 1, 1, 0, 1, 1, 1, 1, 0, 1, 1]
    slots = [0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2]
    inp = sft_inputs(lp, [float(x) for x in mask], slots)
    SftLoss()(inp).loss.backward()
    w = inp.token_weights  # [T]
    onehot = torch.nn.functional.one_hot(targets, v)  # [T, V]
    expected = w.unsqueeze(-1) * (torch.softmax(logits.detach(), -1) - onehot)  # [T, V]
    assert logits.grad is not None
    # Autograd's softmax-minus-onehot against the formula: the same V-term softmax, values <= weight <= 1.
    torch.testing.assert_close(logits.grad, expected, rtol=1e-5, atol=1e-7)


def demo(rollout: str, tokens: list[int], mask: list[int]) -> Sample:
    return Sample(rollout_id=rollout, group_index=0, index=0, tokens=tokens, loss_mask=mask,
                  rollout_logprobs=[0.0] * len(tokens))


def test_one_micro_batch_equals_the_same_demonstrations_packed_in_several():
    torch.manual_seed(1)
    v = 11
    table = torch.randn(v, v)  # [V, V] a bigram "model": logits of the next token given this one
    samples = [demo("a", [1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 1, 1]), demo("b", [7, 8, 9], [0, 1, 1]),
               demo("b", [2, 2, 2, 2], [0, 0, 0, 1]), demo("c", [3, 1, 4, 1, 5], [0, 1, 0, 1, 1])]

    def total(max_tokens: int) -> tuple[float, int]:
        [step] = plan_steps(samples, [1.0] * len(samples), max_tokens_per_micro_batch=max_tokens)
        loss = 0.0
        for mb in step.micro_batches:
            prev = torch.cat([mb.input_ids[:1], mb.input_ids[:-1]])  # [T] the token each position conditions on
            lp = torch.log_softmax(table[prev], -1).gather(-1, mb.input_ids.unsqueeze(-1)).squeeze(-1)  # [T]
            starts = torch.zeros(mb.num_tokens, dtype=torch.bool)  # [T]
            starts[mb.cu_seqlens[:-1].long()] = True
            lp = torch.where(starts, torch.zeros_like(lp), lp)  # [T]
            zeros = torch.zeros_like(lp)  # [T]
            inp = LossInputs(logprobs=lp, old_logprobs=zeros, rollout_logprobs=zeros, advantages=zeros,
                             loss_mask=mb.loss_mask, token_weights=mb.token_weights, rollout_slots=mb.rollout_slots,
                             rollout_token_counts=torch.tensor(step.rollout_token_counts, dtype=torch.float32),
                             rollout_log_ratio_elsewhere=torch.zeros(len(step.rollout_ids)))
            loss += SftLoss()(inp).loss.item()
        return loss, len(step.micro_batches)

    whole, n_whole = total(64)
    split, n_split = total(6)
    assert n_whole == 1 and n_split >= 3
    # The same per-token terms summed per micro-batch then across: fp32 order only, over the 18 tokens, each
    # |log p| < 10 (an 11-way softmax of randn logits). Worst case ~5e-5; observed ~1e-7.
    tol = rounding_tolerance(torch.float32, magnitude=10.0, terms=sum(len(s.tokens) for s in samples))
    assert split == pytest.approx(whole, rel=0, abs=tol)


def test_misaligned_tensors_are_refused_by_name():
    lp = torch.zeros(4)  # [T]
    inp = sft_inputs(lp, [0, 1, 1, 1], [0, 0, 0, 0])
    inp.token_weights = torch.zeros(3)  # [3] misaligned
    with pytest.raises(ValueError, match="token_weights has shape \\(3,\\) but logprobs has \\(4,\\)"):
        SftLoss()(inp)
    with pytest.raises(ValueError, match="logprobs must be \\[T\\]"):
        SftLoss()(sft_inputs(torch.zeros(2, 2), [1, 1], [0, 0]))
