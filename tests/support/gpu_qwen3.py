"""The small random-init Qwen3 the GPU tests share: 4 layers, hidden 512, GQA 8/4, head_dim 128, the real
151,936-token vocabulary (so the head's cost and the sampler's sort are production-shaped), tied embeddings."""

from __future__ import annotations

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
