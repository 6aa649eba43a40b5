"""One expert-parallel Megatron rank, run under ``torchrun`` by ``test_megatron_ep.py`` (CPU, gloo, the tiny
Qwen3-MoE): ``python -m torch.distributed.run --nproc-per-node N megatron_ep_ranks.py MODEL_DIR OUT_DIR EP [PP]``.

Every rank exports the weights before training, scores a step whose micro-batches split unevenly over the two
DP ranks (counts and lengths), trains one GSPO step on it, saves a checkpoint, resumes a second backend from
it and trains both one more step; a third backend replays random routes (R3) and trains a step under them. Rank 0 writes what the test
compares with one process (EP 1) on the same weights; every rank writes the names of the parameters it holds.
With more ranks than EP (DP > EP, or PP > 1) only the first step (with a KL term to a frozen reference model),
the checkpoint and a resume from it run.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

from megatron_steps import fixed_step, routed  # noqa: E402

from lego_rl.train.losses import LossConfig, make_loss  # noqa: E402
from lego_rl.train.megatron_backend import MegatronBackend, MegatronTrainSettings  # noqa: E402

STEP = {"seed": 0, "rollouts": 6, "budget": 48}
"""An odd number of micro-batches of different lengths (the test checks that it is)."""


def main(model_dir: Path, out: Path, ep: int, pp: int) -> None:
    warnings.filterwarnings("ignore")
    light = int(os.environ["WORLD_SIZE"]) > ep  # before the backend joins the process group
    settings = MegatronTrainSettings(lr=1e-3, device="cpu", expert_parallel=ep, pipeline_parallel=pp,
                                     reference_model=light)
    backend = MegatronBackend(model_dir, settings)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    step = fixed_step(vocab, **STEP)  # type: ignore[arg-type]
    initial = {n: t.clone() for n, t in backend.export_weights()}
    plain = backend.compute_logprobs(step.micro_batches, temperature=0.7)
    nucleus = backend.compute_logprobs(step.micro_batches, temperature=0.7, top_p=0.9, top_k=50)
    result = backend.train_step(step, make_loss(LossConfig(algorithm="gspo", kl_coef=0.1 if light else 0.0)),
                                old_logprobs=plain, temperature=0.7)
    weights = {n: t.clone() for n, t in backend.export_weights()}
    backend.save_checkpoint(out / "ckpt", extra_state={"step": 1})
    if light:
        loaded = MegatronBackend(model_dir, settings)
        loaded.load_checkpoint(out / "ckpt")
        reloaded = {n: t.clone() for n, t in loaded.export_weights()}
        if dist.get_rank() == 0:
            torch.save({"plain": plain, "metrics": result.metrics, "weights": weights, "initial": initial,
                        "reloaded": reloaded}, out / "rank0.pt")
        dist.barrier()
        dist.destroy_process_group()
        return
    again = MegatronBackend(model_dir, settings)
    extra = again.load_checkpoint(out / "ckpt")
    nxt = fixed_step(vocab, seed=3)
    a = backend.train_step(nxt, make_loss(LossConfig()), old_logprobs=backend.compute_logprobs(
        nxt.micro_batches, temperature=1.0), temperature=1.0)
    b = again.train_step(nxt, make_loss(LossConfig()), old_logprobs=again.compute_logprobs(
        nxt.micro_batches, temperature=1.0), temperature=1.0)
    wa, wb = dict(backend.export_weights()), dict(again.export_weights())
    replay = MegatronBackend(model_dir, MegatronTrainSettings(lr=1e-3, device="cpu", expert_parallel=ep,
                                                             routing_replay=True))
    routed_step = routed(fixed_step(vocab, **STEP), seed=0)  # type: ignore[arg-type]
    replayed = replay.compute_logprobs(routed_step.micro_batches, temperature=1.0)
    replay_step = replay.train_step(routed_step, make_loss(LossConfig()), old_logprobs=replayed, temperature=1.0)
    replay_weights = {n: t.clone() for n, t in replay.export_weights()}
    (out / f"names{dist.get_rank()}.json").write_text(json.dumps([n for n, _ in backend.local_parameters()]))
    if dist.get_rank() == 0:
        torch.save({"initial": initial, "plain": plain, "nucleus": nucleus, "metrics": result.metrics,
                    "weights": weights, "extra": extra, "next": (a.metrics, b.metrics),
                    "equal": sorted(n for n in wa if torch.equal(wa[n], wb[n])), "names": sorted(wa),
                    "replayed": replayed, "replay_metrics": replay_step.metrics,
                    "replay_weights": replay_weights}, out / "rank0.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 1)
