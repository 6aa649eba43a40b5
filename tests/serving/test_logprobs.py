"""The trainer's teacher-forced recomputation agrees with the logprobs the engine sampled with."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from lego_rl.serving.engine import EmbeddedEngine
from lego_rl.serving.logprobs import teacher_forced_logprobs
from lego_rl.serving.protocol import SamplingParams
from support.numerics import forward_tolerance


@pytest.fixture
async def engine(tiny_model: Path):
    e = EmbeddedEngine(tiny_model, max_batch=8)
    await e.start()
    yield e
    await e.stop()


async def test_recomputation_matches_sampled_logprobs(engine: EmbeddedEngine) -> None:
    prompts = [[1, 50 + i, 60, 70 + i, 80] for i in range(4)]
    temps = [1.0, 0.7, 0.0, 1.3]
    outs = await asyncio.gather(*(
        engine.generate(p, SamplingParams(max_tokens=40, temperature=t, seed=i, top_p=0.95 if i == 3 else 1.0),
                        request_id=f"r{i}", ignore_eos=True)
        for i, (p, t) in enumerate(zip(prompts, temps, strict=True))))
    for i, (p, t, out) in enumerate(zip(prompts, temps, outs, strict=True)):
        recomputed = teacher_forced_logprobs(engine.model, p + out.token_ids, len(p), t,
                                             top_p=0.95 if i == 3 else 1.0)
        delta = (recomputed - torch.tensor(out.logprobs)).abs().max().item()
        # Incremental decode against one full forward: other kernels through the whole model.
        assert delta < forward_tolerance(t), (t, delta)


async def test_prefix_cache_reuse_keeps_the_numbers(engine: EmbeddedEngine) -> None:
    first = await engine.generate([1, 2, 3, 4, 5], SamplingParams(max_tokens=30, temperature=0.0),
                                  request_id="a", ignore_eos=True)
    # The next turn extends prompt + output, as an agent's next prompt does.
    turn2 = [1, 2, 3, 4, 5] + first.token_ids + [7, 8, 9]
    hits = engine.prefix_cache.hits
    second = await engine.generate(turn2, SamplingParams(max_tokens=20, temperature=0.8, seed=3),
                                   request_id="b", ignore_eos=True)
    assert engine.prefix_cache.hits == hits + 1
    recomputed = teacher_forced_logprobs(engine.model, turn2 + second.token_ids, len(turn2), 0.8)
    # Cached vs full-recompute attention differ only in fp32 kernel order: ~1e-5 at T=1 (RESULTS.md), scaled
    # by 1/T because the logits are divided by T (1.05e-5 seen at T=0.8 on a 2-core AMD EPYC). A wrong
    # cache offset or stale entry shows up as errors of 1e-3 and more; forward_tolerance sits between.
    assert (recomputed - torch.tensor(second.logprobs)).abs().max().item() < forward_tolerance(0.8)


def test_recomputation_rejects_bad_arguments(tiny_model: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    with pytest.raises(ValueError, match="prompt_len"):
        teacher_forced_logprobs(model, [1, 2, 3], 3, 1.0)
    with pytest.raises(ValueError, match="temperature"):
        teacher_forced_logprobs(model, [1, 2, 3], 1, -1.0)
