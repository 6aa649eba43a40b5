"""A fixed packed optimizer step for the Megatron backend tests (shared by the in-process test and the
``torchrun`` ranks): rollouts of several segments that span micro-batches, advantages of both signs."""

from __future__ import annotations

import random

import torch

from lego_rl.train.batching import OptimizerStep, plan_steps
from lego_rl.trajectory.sample import Sample


def fixed_step(vocab: int, *, seed: int = 0, rollouts: int = 4, segments: int = 2, budget: int = 48
               ) -> OptimizerStep:
    rng = random.Random(seed)
    samples, advantages = [], []
    for r in range(rollouts):
        for s in range(segments):
            context, trained = rng.randint(3, 12), rng.randint(2, 10)
            samples.append(Sample(
                rollout_id=f"r{r}", group_index=r // 2, index=r % 2, segment=s, num_segments=segments,
                tokens=[rng.randrange(vocab) for _ in range(context + trained)],
                loss_mask=[0] * context + [1] * trained,
                rollout_logprobs=[0.0] * context + [-rng.uniform(0.5, 8.0) for _ in range(trained)],
            ))
            advantages.append([1.0, -1.0, 0.5, -0.5][r % 4])
    (step,) = plan_steps(samples, advantages, max_tokens_per_micro_batch=budget)
    return step


def routed(step: OptimizerStep, seed: int) -> OptimizerStep:
    """``step``'s micro-batches with random replay routes (the tiny MoE's experts and layers) on every position
    but each segment's last."""
    from lego_rl.serving.tiny_model import MOE_SHAPE

    experts, k, layers = int(MOE_SHAPE["num_experts"]), int(MOE_SHAPE["num_experts_per_tok"]), 4
    rng = random.Random(seed)
    for mb in step.micro_batches:
        t = mb.num_tokens
        mb.routed_experts = torch.tensor(
            [[rng.sample(range(experts), k) for _ in range(layers)] for _ in range(t)])  # [T, L, K]
        valid = torch.ones(t, dtype=torch.bool)  # [T]
        valid[mb.cu_seqlens[1:].long() - 1] = False  # a segment's last id was never forwarded
        mb.routes_valid = valid
    return step
