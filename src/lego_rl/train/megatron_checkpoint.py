"""Megatron checkpoints: an HF model directory (rank 0 writes the gathered weights) plus one trainer-state shard
per (EP, TP, PP) rank, published whole by ``train.checkpoint.publish_checkpoint``.

A checkpoint resumes only on the parallel layout that wrote it (the optimizer shards hold one rank's slice);
``load_checkpoint`` refuses another with the key to change. Every rank calls both functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lego_rl.errors import ConfigError
from lego_rl.runstore.files import write_new
from lego_rl.runstore.publish import already_exists
from lego_rl.train import checkpoint
from lego_rl.train.megatron_parallel import barrier, broadcast_path
from lego_rl.train.megatron_setup import MegatronRank
from lego_rl.train.megatron_weights import checkpoint_tensors

MODEL_SIDE_FILES = (
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja",
)
"""Copied from the loaded model directory into every checkpoint, so a checkpoint is a servable model."""


def shard_file(r: MegatronRank) -> str:
    """This rank's trainer-state file name in a checkpoint."""
    ep = f"ep{r.layout.ep_rank}." if r.layout.ep > 1 else ""  # experts' optimizer state differs
    if r.layout.pp == 1:
        return f"trainer_state.{ep}tp{r.layout.tp_rank}.pt"
    return f"trainer_state.pp{r.layout.pp_rank}.{ep}tp{r.layout.tp_rank}.pt"


def save_checkpoint(r: MegatronRank, path: Path, *, optimizer: torch.optim.Optimizer, scheduler: Any,
                    weight_version: int, extra_state: dict[str, Any]) -> None:
    """HF weights (rank 0, gathered from every TP rank and stage), one optimizer/RNG shard per TP rank and stage
    (DP rank 0 of each), published by rank 0 once every shard is on disk. Every rank must call it."""
    extra_json = checkpoint.extra_state_json(extra_state)
    path = Path(path)
    if path.exists():  # checked on every rank before any collective, so all ranks raise alike
        raise already_exists(path, "checkpoint")
    hf: dict[str, torch.Tensor] = {}
    for name, t in checkpoint_tensors(r):  # a collective: every rank gathers, rank 0 keeps
        if r.layout.rank == 0:
            hf[name] = t.detach().to("cpu", copy=True).contiguous()
    state = checkpoint.trainer_state(optimizer.state_dict(), scheduler, weight_version)
    # One shard per (EP, TP, PP) rank: DP ranks below EP are the expert-parallel ranks 0..EP-1 (their
    # expert-data-parallel rank is 0); the dense part of their state is the same on every DP rank.
    writes_shard = r.layout.dp_rank < r.layout.ep

    def write_shard(tmp: Path) -> None:
        if writes_shard:
            write_new(tmp / shard_file(r), lambda fh: torch.save(state, fh), what="trainer state shard")

    def fill(tmp: Path) -> None:
        from safetensors.torch import save_file

        broadcast_path(r, tmp)
        save_file(hf, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        checkpoint.copy_side_files(r.model_dir, tmp, MODEL_SIDE_FILES)
        write_new(tmp / checkpoint.EXTRA_STATE, extra_json, what="extra state")
        write_shard(tmp)
        barrier(r)

    if r.layout.rank == 0:
        checkpoint.publish_checkpoint(path, fill, info={"weight_version": weight_version, "backend": "megatron",
                                             "tensor_parallel": r.layout.tp, "pipeline_parallel": r.layout.pp,
                                             "expert_parallel": r.layout.ep})
    else:
        write_shard(broadcast_path(r, None))
        barrier(r)
    barrier(r)  # nobody returns before the checkpoint is in place


def _check_layout(r: MegatronRank, path: Path, info: dict[str, Any]) -> None:
    """Refuse a checkpoint written by another backend or parallel layout: its optimizer shards would not fit."""
    if info.get("backend") != "megatron" or info.get("tensor_parallel") != r.layout.tp:
        raise ConfigError(f"checkpoint {path} was written by backend {info.get('backend')!r} with tensor "
                          f"parallel {info.get('tensor_parallel')}; this trainer is 'megatron' with "
                          f"{r.layout.tp} (its optimizer shards would not fit)",
                          parameter="train.tensor_parallel", value=r.layout.tp)
    written_pp = info.get("pipeline_parallel", 1)  # checkpoints from before pipeline parallelism: 1
    if written_pp != r.layout.pp:
        raise ConfigError(f"checkpoint {path} was written with pipeline parallel {written_pp}; this trainer "
                          f"runs {r.layout.pp} stages (its optimizer shards hold other stages' layers)",
                          parameter="train.pipeline_parallel", value=r.layout.pp)
    written_ep = info.get("expert_parallel", 1)  # checkpoints from before expert parallelism: 1
    if written_ep != r.layout.ep:
        raise ConfigError(f"checkpoint {path} was written with expert parallel {written_ep}; this trainer "
                          f"runs {r.layout.ep} (its optimizer shards hold other ranks' experts)",
                          parameter="train.expert_parallel", value=r.layout.ep)


def load_checkpoint(r: MegatronRank, path: Path, *, optimizer: torch.optim.Optimizer,
                    scheduler: Any) -> tuple[int, dict[str, Any]]:
    """Load weights, this rank's optimizer shard, scheduler and RNG; the weight version and the loop's extra
    state."""
    path = Path(path)
    _check_layout(r, path, checkpoint.read_marker(path))
    r.load_hf(r.model, path)
    state = torch.load(path / shard_file(r), map_location="cpu", weights_only=True)
    optimizer.load_state_dict(state["optimizer"])
    return checkpoint.restore_trainer_state(path, state, scheduler)
