"""The logprob convention under top-k/top-p: the sampler reports the truncated, renormalised distribution it
drew from, and the trainer's ``sampler_logprobs`` reproduces it (from its own logits, or by replaying the
captured nucleus). Checked by hand on small logits and against the embedded engine at the reference's
``top_p=0.95``, T=1."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from lego_rl.serving.engine import EmbeddedEngine
from lego_rl.serving.logprobs import sampler_logprobs, teacher_forced_logprobs
from lego_rl.serving.protocol import SamplingParams
from support.numerics import forward_tolerance, rounding_tolerance


HAND_TOL = rounding_tolerance(torch.float32, magnitude=3.0, terms=4)
"""Hand-computed cases: fp32 logprobs of four logits (|log p| <= 3), a 4-term log-sum-exp or two."""


def test_hand_computed_truncation() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))  # T=1: these are the probabilities
    tok = torch.tensor([1])
    assert float(sampler_logprobs(logits, tok, temperature=1.0)) == pytest.approx(math.log(0.3), abs=HAND_TOL)
    # top_p=0.8: 0.5 + 0.3 reach it, so the nucleus is {0, 1} and p(1) = 0.3 / 0.8.
    assert float(sampler_logprobs(logits, tok, temperature=1.0, top_p=0.8)) == pytest.approx(math.log(0.375), abs=HAND_TOL)
    # top_k=3 then top_p=0.9 of the renormalised {0.5, 0.3, 0.15} / 0.95: 0.526 + 0.316 < 0.9, so all three stay.
    assert float(sampler_logprobs(logits, tok, temperature=1.0, top_k=3, top_p=0.9)) == pytest.approx(
        math.log(0.3 / 0.95), abs=HAND_TOL)
    # Greedy ignores truncation (as both engines do) and takes T as 1.
    assert float(sampler_logprobs(logits, tok, temperature=0.0, top_p=0.5)) == pytest.approx(math.log(0.3), abs=HAND_TOL)
    # The sampled id outside the trainer's own nucleus (a boundary moved by rounding) still gets a finite value.
    out = sampler_logprobs(logits, torch.tensor([3]), temperature=1.0, top_p=0.8)
    assert float(out) == pytest.approx(math.log(0.05 / 0.85), abs=HAND_TOL)
    # A captured nucleus is replayed as given.
    replay = sampler_logprobs(logits, tok, temperature=1.0, top_p=0.8, nucleus_ids=[[0, 1, 2]])
    assert float(replay) == pytest.approx(math.log(0.3 / 0.95), abs=HAND_TOL)


def test_gradient_and_bad_input() -> None:
    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(0), requires_grad=True)
    tokens = torch.argmax(logits, dim=-1)
    sampler_logprobs(logits, tokens, temperature=1.0, top_p=0.9).sum().backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="not in its captured nucleus"):
        sampler_logprobs(logits, tokens, temperature=1.0, nucleus_ids=[[int(tokens[0]) + 1]] + [[0]] * 5)
    with pytest.raises(ValueError, match="top_p"):
        sampler_logprobs(logits, tokens, temperature=1.0, top_p=0.0)
    with pytest.raises(ValueError, match=r"logits \[N, V\] and tokens \[N\]"):
        sampler_logprobs(logits, tokens[:3], temperature=1.0)


def test_chunked_rows_equal_one_block() -> None:
    from lego_rl.serving import logprobs as lp

    logits = torch.randn(700, 300, generator=torch.Generator().manual_seed(1)) * 2
    tokens = torch.randint(0, 300, (700,), generator=torch.Generator().manual_seed(2))
    chunked = sampler_logprobs(logits, tokens, temperature=1.0, top_p=0.95)  # 3 blocks of 256 rows
    lp.CHUNK_ROWS, saved = 10_000, lp.CHUNK_ROWS
    try:
        whole = sampler_logprobs(logits, tokens, temperature=1.0, top_p=0.95)
    finally:
        lp.CHUNK_ROWS = saved
    assert torch.equal(chunked, whole)  # strict on purpose: rows are scored independently, same kernels


@pytest.fixture
async def engine(tiny_model: Path):
    e = EmbeddedEngine(tiny_model, max_batch=8)
    await e.start()
    yield e
    await e.stop()


async def test_embedded_engine_and_trainer_agree_at_top_p_095(engine: EmbeddedEngine) -> None:
    """fp32 CPU, T=1, top_p=0.95: the engine's reported logprobs equal the trainer's recomputation with the same
    truncation, and with the captured nucleus replayed; the untruncated softmax does not match them."""
    prompt = [1, 10, 72, 105, 300, 12]
    sp = SamplingParams(max_tokens=256, temperature=1.0, top_p=0.95, seed=11)
    out = await engine.generate(prompt, sp, request_id="p95", want_nucleus=True, ignore_eos=True)
    got = torch.tensor(out.logprobs)
    ids = prompt + out.token_ids
    same = teacher_forced_logprobs(engine.model, ids, len(prompt), 1.0, top_p=0.95)
    replay = teacher_forced_logprobs(engine.model, ids, len(prompt), 1.0, top_p=0.95, nucleus_ids=out.nucleus_ids)
    untruncated = teacher_forced_logprobs(engine.model, ids, len(prompt), 1.0)
    # Incremental decode against one full forward: other kernels through the whole model (forward_tolerance).
    assert float((same - got).abs().max()) < forward_tolerance(1.0)
    assert float((replay - got).abs().max()) < forward_tolerance(1.0)
    # The nucleus dropped mass at most positions; there the untruncated value is lower by log(mass).
    gap = got - untruncated
    # got (decode) and untruncated (full forward) come from different paths: allow their forward noise.
    assert (gap >= -forward_tolerance(1.0)).all()
    assert float(gap.max()) > 1e-3 and int((gap > 1e-4).sum()) > len(gap) // 2
