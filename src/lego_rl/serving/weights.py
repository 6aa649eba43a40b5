"""Loading a local HF causal-LM directory, and replacing its weights in place from a checkpoint directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from lego_rl.errors import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _eos_ids(model_dir: Path, config: Any) -> list[int]:
    """Stop ids as vLLM derives them: generation_config.json's ``eos_token_id``, else the config's."""
    ids: Any = None
    gen = model_dir / "generation_config.json"
    if gen.is_file():
        ids = json.loads(gen.read_text()).get("eos_token_id")
    if ids is None:
        ids = getattr(config, "eos_token_id", None)
    if ids is None:
        return []
    return [int(i) for i in (ids if isinstance(ids, list) else [ids])]


def load_model(model_dir: Path, device: torch.device, dtype: str) -> tuple[Any, Any, list[int]]:
    """``(model, config, eos_ids)`` for a local directory; a precise ConfigError when it is not one."""
    if not (model_dir / "config.json").is_file():
        raise ConfigError(f"{model_dir} is not a model directory (no config.json); build one with "
                          "`lego model tiny --out DIR` or point --model at a local HF checkpoint",
                          parameter="model", value=str(model_dir))
    if dtype not in DTYPES:
        raise ConfigError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}", parameter="dtype", value=dtype)
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    # Typed as the Module it is: transformers types its `to` override as a function still wanting `self`.
    model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=DTYPES[dtype], local_files_only=True, attn_implementation="sdpa"
    )
    model.to(device).eval()
    if device.type == "cuda":
        choose_attention_kernels()
    return model, config, _eos_ids(model_dir, config)


def choose_attention_kernels() -> None:
    """Keep SDPA off cuDNN attention, for the engine and the trainer alike (both load through here).

    On the H200 images SDPA picks cuDNN attention for bf16 and rebuilds its graph whenever the shape changes,
    which a decode step's shape does every step (~17 ms of CPU per call, FIELD-NOTES); and the two sides of the
    rollout-vs-trainer consistency check must run the same kernels. Without cuDNN, SDPA takes FlashAttention
    or memory-efficient attention, as the fast decode path does explicitly. Process-wide by torch's design.
    """
    torch.backends.cuda.enable_cudnn_sdp(False)


def _checkpoint_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / s for s in shards]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"{path} holds no *.safetensors checkpoint", parameter="weights_path", value=str(path))
    return files


def load_checkpoint_into(model: Any, path: Path) -> None:
    """Copy a safetensors checkpoint (file or directory) into ``model``'s parameters, in place.

    Every parameter must be covered (a tied ``lm_head.weight`` may be absent); unknown names are an error.
    """
    from safetensors.torch import load_file

    if not path.exists():
        raise ConfigError(f"checkpoint {path} does not exist", parameter="weights_path", value=str(path))
    state: dict[str, torch.Tensor] = {}
    for f in _checkpoint_files(path):
        state.update(load_file(str(f)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise ConfigError(
            f"checkpoint {path} does not fit the model: missing {sorted(set(missing) - tied)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}", parameter="weights_path", value=str(path))
