"""Rollout-vs-trainer consistency with real parts: the embedded engine samples, the torch backend recomputes.

Per configuration, the engine generates ``--rollouts`` continuations of random prompts (T=1, the given top-p,
ignore EOS) and reports each token's logprob; the trainer scores the same tokens packed into micro-batches under
the same convention (``TrainerBackend.compute_logprobs(top_p=...)``). Prints Pearson, mean/p99/max |Δ| and k3
over the sampled tokens (``train.consistency``). The baseline measured in the same run is the trainer scoring
with the untruncated softmax, which is what a trainer ignoring the sampler's top-p would see.

    python benchmarks/engine_trainer_consistency.py                          # tiny model, CPU, fp32
    python benchmarks/engine_trainer_consistency.py --model qwen3-0.6b       # random-init 0.6B, CUDA, bf16
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_backend_bench import build_model  # noqa: E402

from lego_rl.serving.engine import EmbeddedEngine  # noqa: E402
from lego_rl.serving.protocol import SamplingParams  # noqa: E402
from lego_rl.train.batching import plan_steps  # noqa: E402
from lego_rl.train.consistency import consistency_report  # noqa: E402
from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings  # noqa: E402
from lego_rl.trajectory.sample import Sample  # noqa: E402


async def sample(model_dir: Path, device: str, dtype: str, n: int, prompt_len: int, new: int, top_p: float,
                 vocab: int) -> list[Sample]:
    engine = EmbeddedEngine(model_dir, device=device, dtype=dtype, max_batch=n)
    await engine.start()
    try:
        rng = random.Random(0)
        prompts = [[rng.randrange(vocab) for _ in range(prompt_len)] for _ in range(n)]
        outs = await asyncio.gather(*(
            engine.generate(p, SamplingParams(max_tokens=new, temperature=1.0, top_p=top_p, seed=i),
                            request_id=f"r{i}", ignore_eos=True) for i, p in enumerate(prompts)))
    finally:
        await engine.stop()
    return [Sample(rollout_id=f"r{i}", group_index=i, index=0, segment=0, num_segments=1,
                   tokens=p + o.token_ids, loss_mask=[0] * len(p) + [1] * len(o.token_ids),
                   rollout_logprobs=[0.0] * len(p) + list(o.logprobs))
            for i, (p, o) in enumerate(zip(prompts, outs, strict=True))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["tiny", "qwen3-0.6b"], default="tiny")
    ap.add_argument("--rollouts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new", type=int, default=256)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = "bfloat16" if device == "cuda" else "float32"
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(args.model, Path(tmp) / "model")
        vocab = int(__import__("json").loads((model_dir / "config.json").read_text())["vocab_size"])
        backend = TorchBackend(model_dir, TorchTrainSettings(lr=1e-6, device=device))
        print(f"model {args.model} on {device} ({dtype}); {args.rollouts} rollouts × {args.new} sampled tokens")
        for top_p in (1.0, 0.95):
            samples = asyncio.run(sample(model_dir, device, dtype, args.rollouts, args.prompt_len, args.new, top_p,
                                         vocab))
            [step] = plan_steps(samples, [1.0] * len(samples), max_tokens_per_micro_batch=8192)
            for label, p in (("same convention", top_p), ("untruncated trainer (baseline)", 1.0)):
                trainer = backend.compute_logprobs(step.micro_batches, temperature=1.0, top_p=p)
                report = consistency_report(torch.cat([mb.rollout_logprobs for mb in step.micro_batches]),
                                            torch.cat(trainer),
                                            torch.cat([mb.loss_mask for mb in step.micro_batches]))
                o = report.overall
                print(f"top_p={top_p:<5} {label:<32} " + "  ".join(
                    f"{k} {v:.6g}" for k, v in o.model_dump().items() if v is not None))
                if top_p == 1.0:
                    break


if __name__ == "__main__":
    main()
