"""The small random-init Qwen3 the GPU tests share: 4 layers, hidden 512, GQA 8/4, head_dim 128, the real
151,936-token vocabulary (so the head's cost and the sampler's sort are production-shaped), tied embeddings."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

VOCAB = 151936


def save_random_qwen3(out: Path, **overrides: Any) -> Path:
    """Write the model (seed 0, fp32 safetensors) to ``out``; ``overrides`` are Qwen3Config fields."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    fields: dict[str, Any] = dict(vocab_size=VOCAB, hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                                  num_attention_heads=8, num_key_value_heads=4, head_dim=128,
                                  tie_word_embeddings=True)
    Qwen3ForCausalLM(Qwen3Config(**{**fields, **overrides})).float().save_pretrained(str(out), safe_serialization=True)
    return out


def random_rollouts(seed: int, n: int, *, max_part: int, logprob_range: tuple[float, float]
                    ) -> tuple[list[Any], list[float]]:
    """``n`` one-segment rollouts of random ids (a prompt, then a trained answer, each 20..``max_part`` tokens)
    with sampled logprobs drawn from ``-logprob_range``, and advantages of both signs (1, -1, 0.5, -0.5)."""
    from lego_rl.trajectory.sample import Sample

    rng = random.Random(seed)
    out, adv = [], []
    for r in range(n):
        ctx, ans = rng.randint(20, max_part), rng.randint(20, max_part)
        out.append(Sample(rollout_id=f"r{r}", group_index=r // 4, index=r % 4, segment=0, num_segments=1,
                          tokens=[rng.randrange(VOCAB) for _ in range(ctx + ans)], loss_mask=[0] * ctx + [1] * ans,
                          rollout_logprobs=[0.0] * ctx + [-rng.uniform(*logprob_range) for _ in range(ans)]))
        adv.append([1.0, -1.0, 0.5, -0.5][r % 4])
    return out, adv
