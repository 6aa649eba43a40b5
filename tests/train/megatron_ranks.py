"""One Megatron-backend rank, run under ``torchrun`` by ``test_megatron_backend.py`` (CPU, gloo).

Every rank scores the same optimizer step, trains on it once and saves a checkpoint; rank 0 writes what the
test compares with a one-process backend: ``python -m torch.distributed.run --nproc-per-node N
megatron_ranks.py MODEL_DIR OUT_DIR TP DP [PP [sp]]`` (``sp``: sequence parallelism). With PP > 1 the ranks also export before training, and
resume a second backend from the checkpoint and train both one more step (the round trip through the
per-stage shards).
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

from megatron_steps import fixed_step  # noqa: E402

from lego_rl.train.losses import LossConfig, make_loss  # noqa: E402
from lego_rl.train.megatron_backend import MegatronBackend, MegatronTrainSettings  # noqa: E402


def main(model_dir: Path, out: Path, tp: int, dp: int, pp: int, sp: bool = False) -> None:
    warnings.filterwarnings("ignore")
    settings = MegatronTrainSettings(lr=1e-3, device="cpu", tensor_parallel=tp, data_parallel=dp,
                                     pipeline_parallel=pp, sequence_parallel=sp)
    backend = MegatronBackend(model_dir, settings)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    step = fixed_step(vocab)
    initial = {n: t.clone() for n, t in backend.export_weights()} if pp > 1 else {}
    plain = backend.compute_logprobs(step.micro_batches, temperature=0.7)
    nucleus = backend.compute_logprobs(step.micro_batches, temperature=0.7, top_p=0.9, top_k=50)
    result = backend.train_step(step, make_loss(LossConfig(algorithm="gspo")), old_logprobs=plain,
                                temperature=0.7)
    weights = {n: t.clone() for n, t in backend.export_weights()}
    backend.save_checkpoint(out / "ckpt", extra_state={"step": 1})
    resumed: dict[str, object] = {}
    if pp > 1:
        again = MegatronBackend(model_dir, settings)
        extra = again.load_checkpoint(out / "ckpt")
        nxt = fixed_step(vocab, seed=3)
        a = backend.train_step(nxt, make_loss(LossConfig()), old_logprobs=backend.compute_logprobs(
            nxt.micro_batches, temperature=1.0), temperature=1.0)
        b = again.train_step(nxt, make_loss(LossConfig()), old_logprobs=again.compute_logprobs(
            nxt.micro_batches, temperature=1.0), temperature=1.0)
        wa = dict(backend.export_weights())
        wb = dict(again.export_weights())
        resumed = {"extra": extra, "metrics": (a.metrics, b.metrics), "versions": (a.weight_version,
                                                                                   b.weight_version),
                   "equal": sorted(n for n in wa if torch.equal(wa[n], wb[n])), "names": sorted(wa)}
    if dist.get_rank() == 0:
        torch.save({"plain": plain, "nucleus": nucleus, "metrics": result.metrics, "weights": weights,
                    "initial": initial, "resumed": resumed}, out / "rank0.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
         int(sys.argv[5]) if len(sys.argv) > 5 else 1, sys.argv[6:7] == ["sp"])
