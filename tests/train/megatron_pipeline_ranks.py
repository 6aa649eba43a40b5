"""One pipeline-parallel Megatron-backend rank with the optional features switched on, run under ``torchrun``
by ``test_megatron_backend.py`` (CPU, gloo): ``python -m torch.distributed.run --nproc-per-node PP*TP
megatron_pipeline_ranks.py MODEL_DIR OUT_DIR PP TP FLAGS`` where FLAGS is a comma list of ``replay`` (R3
routes, MoE models), ``recompute`` (gradient checkpointing) and ``kl`` (a reference model and a KL term).

Every rank scores one optimizer step, trains on it and scores it again; rank 0 writes what the test compares
with the same settings in one process (``run_variant``).
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

from megatron_steps import fixed_step, routed  # noqa: E402

from lego_rl.train.losses import LossConfig, make_loss  # noqa: E402
from lego_rl.train.megatron_backend import MegatronBackend, MegatronTrainSettings  # noqa: E402


def run_variant(model_dir: Path, *, pp: int = 1, tp: int = 1, flags: set[str]) -> dict[str, Any]:
    """The old logprobs, step metrics, exported weights and new logprobs of one step (every rank calls it;
    the exported weights are complete on rank 0)."""
    settings = MegatronTrainSettings(lr=1e-3, device="cpu", tensor_parallel=tp, pipeline_parallel=pp,
                                     routing_replay="replay" in flags, gradient_checkpointing="recompute" in flags,
                                     reference_model="kl" in flags)
    backend = MegatronBackend(model_dir, settings)
    step = fixed_step(json.loads((model_dir / "config.json").read_text())["vocab_size"], seed=1)
    if "replay" in flags:
        step = routed(step, seed=1)
    old = backend.compute_logprobs(step.micro_batches, temperature=0.8)
    # A KL term against the reference needs the policy to have moved: train twice, compare the second step.
    loss = make_loss(LossConfig(kl_coef=0.1 if "kl" in flags else 0.0))
    first = backend.train_step(step, loss, old_logprobs=old, temperature=0.8)
    second = backend.train_step(step, loss, old_logprobs=old, temperature=0.8)
    return {"old": old, "metrics": [first.metrics, second.metrics],
            "weights": {n: t.clone() for n, t in backend.export_weights()},
            "new": backend.compute_logprobs(step.micro_batches, temperature=0.8)}


def main(model_dir: Path, out: Path, pp: int, tp: int, flags: set[str]) -> None:
    warnings.filterwarnings("ignore")
    got = run_variant(model_dir, pp=pp, tp=tp, flags=flags)
    if dist.get_rank() == 0:
        torch.save(got, out / "rank0.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
         {f for f in sys.argv[5].split(",") if f} if len(sys.argv) > 5 else set())
