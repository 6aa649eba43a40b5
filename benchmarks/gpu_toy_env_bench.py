"""Evidence 3: the toy environment (``first_letter``) trained end to end on one GPU, engine and trainer side by side.

The embedded engine (bf16) serves a random-init Qwen3-architecture model; the product's loop (``TrainLoop``) draws
``--prompts`` × ``--samples`` rollouts of up to ``--max-tokens`` answer tokens per step through the environment,
trains them with the torch backend (fp32 master weights, bf16 autocast, chunked head logprobs) and syncs the
weights into the engine in place. Per step it prints the loop's time split (rollout / train / sync), the trainer's
tokens/s over every packed token (old-logprob pass + forward/backward + AdamW), model FLOP/s utilisation against
the H200's 790 TFLOP/s bf16 ceiling (6 · params · tokens / train time: attention and the old-logprob pass are left
out, so it is a lower bound), peak GPU memory, and the loop's engine-vs-trainer consistency figures.

The engine runs the trainer's precision recipe (``--engine-precision trainer``: fp32 weights, bf16 matmuls and
attention, fp32 residual stream — ``serving.precision = "trainer"``, the CUDA default) on its fast decode path
(``--max-model-len`` keeps the per-row KV slots small enough for it); the baseline in the same run is the same
loop with ``--baseline-precision`` (default ``bf16``: a pure-bf16 engine, bf16 residual stream).

Attention kernels are chosen, not left to SDPA's heuristics: ``--sdpa`` names the one backend both sides may use
(SDPA picks cuDNN for bf16 otherwise, whose decode graphs are rebuilt every step: FIELD-NOTES.md).

``--true-on-policy`` runs the loop with ``train.true_on_policy`` (engine and trainer through the batch-invariant
kernels, eager) and, in the same process, the default mode with the same engine precision as the baseline; it
prints both mean step times and their ratio (issue 31's target: at most 1.3×) and the consistency figures (max |Δ|
must read 0 in the true on-policy run).

    python3 benchmarks/gpu_toy_env_bench.py --model qwen3-0.6b --steps 3          # on the GPU machine
    python3 benchmarks/gpu_toy_env_bench.py --model qwen3-0.6b --steps 4 --true-on-policy
    python benchmarks/gpu_toy_env_bench.py --model tiny --steps 1 --max-tokens 8  # CPU smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import contextlib
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_backend_bench import H200_BF16_FLOPS, build_model  # noqa: E402

from lego_rl.chat.render import ChatRenderer  # noqa: E402
from lego_rl.driver.environments import Sampler  # noqa: E402
from lego_rl.compose.projection import loop_settings  # noqa: E402
from lego_rl.config.schema import LegoConfig  # noqa: E402
from lego_rl.driver.loop import Prompt, TrainLoop  # noqa: E402
from lego_rl.driver.toy_env import FirstLetterEnv, make_rows  # noqa: E402
from lego_rl.compose.train_session import env_rollout_fn  # noqa: E402
from lego_rl.driver.weight_sync import EmbeddedWeightSync  # noqa: E402
from lego_rl.runstore import RunDir  # noqa: E402
from lego_rl.runstore import metric_catalog as mc  # noqa: E402
from lego_rl.serving.client import ServingClient  # noqa: E402
from lego_rl.serving.server import EmbeddedServer  # noqa: E402
from lego_rl.serving.tiny_model import ensure_tiny_model  # noqa: E402
from lego_rl.train.backend import LossFn, StepResult  # noqa: E402
from lego_rl.train.batching import MicroBatch, OptimizerStep  # noqa: E402
from lego_rl.train.losses import LossConfig, make_loss  # noqa: E402
from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings  # noqa: E402

SDPA = {
    "flash": torch.nn.attention.SDPBackend.FLASH_ATTENTION,
    "efficient": torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION,
    "math": torch.nn.attention.SDPBackend.MATH,
    "cudnn": torch.nn.attention.SDPBackend.CUDNN_ATTENTION,
}


@contextlib.contextmanager
def only_sdpa(name: str) -> Iterator[None]:
    """Allow one SDPA backend process-wide (the engine steps in a worker thread, so a thread-local
    ``sdpa_kernel`` context would not reach it); ``no-cudnn`` allows all but cuDNN (flash cannot take the packed
    block-diagonal mask and efficient cannot take GQA, so no single one serves both sides); ``auto`` leaves
    SDPA's choice alone."""
    if name == "auto" or not torch.cuda.is_available():
        yield
        return
    flags = {"flash": torch.backends.cuda.enable_flash_sdp, "efficient": torch.backends.cuda.enable_mem_efficient_sdp,
             "math": torch.backends.cuda.enable_math_sdp, "cudnn": torch.backends.cuda.enable_cudnn_sdp}
    before = {"flash": torch.backends.cuda.flash_sdp_enabled(), "efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
              "math": torch.backends.cuda.math_sdp_enabled(), "cudnn": torch.backends.cuda.cudnn_sdp_enabled()}
    for k, f in flags.items():
        f(k != "cudnn" if name == "no-cudnn" else k == name)
    try:
        yield
    finally:
        for k, f in flags.items():
            f(before[k])


class TimedBackend:
    """The torch backend with its two trainer phases timed and the packed tokens counted (the loop's own
    ``time_train_s`` also holds admission, advantages and packing)."""

    def __init__(self, inner: TorchBackend) -> None:
        self.inner = inner
        self.seconds = {"old_logprobs": 0.0, "train_step": 0.0}
        self.tokens = 0

    @property
    def weight_version(self) -> int:
        return self.inner.weight_version

    def _sync(self) -> None:
        if self.inner.device.type == "cuda":
            torch.cuda.synchronize(self.inner.device)

    def compute_logprobs(self, micro_batches: Sequence[MicroBatch], **kw: Any) -> list[torch.Tensor]:
        t0 = time.perf_counter()
        out = self.inner.compute_logprobs(micro_batches, **kw)
        self._sync()
        self.seconds["old_logprobs"] += time.perf_counter() - t0
        return out

    def train_step(self, step: OptimizerStep, loss_fn: LossFn, **kw: Any) -> StepResult:
        t0 = time.perf_counter()
        out = self.inner.train_step(step, loss_fn, **kw)
        self._sync()
        self.seconds["train_step"] += time.perf_counter() - t0
        self.tokens += sum(mb.num_tokens for mb in step.micro_batches)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def prepare(name: str, tmp: Path) -> Path:
    """The model directory, with the tiny model's tokenizer and chat template beside a larger random model
    (its ids beyond the tokenizer decode to nothing: the reward is sparse, the compute is real)."""
    if name == "tiny":
        return ensure_tiny_model()
    out = build_model(name, tmp / name)
    for f in ensure_tiny_model().iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template", "generation_config")):
            shutil.copy2(f, out / f.name)
    return out


ENGINE_PRECISION = {  # --engine-precision on CUDA → (weights dtype, compute dtype)
    "trainer": ("float32", "bfloat16"),
    "bf16": ("bfloat16", None),
    "fp32": ("float32", None),
}


async def run(model: Path, tmp: Path, label: str, sdpa: str, precision: str, a: argparse.Namespace,
              true_on_policy: bool = False) -> list[float]:
    """The loop's steps; returns each step's wall time (rollout + train + sync)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype, compute = ENGINE_PRECISION[precision] if device == "cuda" else ("float32", None)
    # Built directly, not through its entry point: the GPU machine runs from a source tree without dist-info.
    env = FirstLetterEnv(max_tokens=a.max_tokens)
    # A default config's projection (the one default of every key), with what this benchmark studies.
    settings = dataclasses.replace(loop_settings(LegoConfig()), num_rollout=a.steps, batch_size=a.prompts, samples_per_prompt=a.samples,
                            micro_batch_tokens=a.micro_batch_tokens, concurrency=a.prompts * a.samples,
                            max_staleness=1, seed=0, top_p=1.0)
    with only_sdpa(sdpa):
        async with EmbeddedServer(model, port=0, device=device, dtype=dtype, compute_dtype=compute,
                                  max_model_len=a.max_model_len, max_batch=a.prompts * a.samples,
                                  true_on_policy=true_on_policy) as srv:
            renderer = ChatRenderer.from_pretrained(model)
            async with ServingClient([srv.url]) as client:
                sampler = Sampler(client, renderer, temperature=1.0, top_p=1.0, top_k=-1, max_tokens=a.max_tokens)
                rundir = RunDir.open(tmp / f"run-{label}", config={"benchmark": label})
                rows = [Prompt(r["id"], env.parse_row(r)) for r in make_rows(256, letters="aest", seed=0)]
                inner = TorchBackend(model, TorchTrainSettings(lr=1e-6, device=device,
                                                               logprob_chunk_tokens=a.chunk,
                                                               true_on_policy=true_on_policy))
                backend = TimedBackend(inner)
                n_params = sum(p.numel() for p in inner.model.parameters())
                loop = TrainLoop(settings, backend=backend, loss_fn=make_loss(LossConfig()),  # type: ignore[arg-type]
                                 rollout_fn=env_rollout_fn(env, sampler, rundir), prompts=rows, run=rundir,
                                 sync=EmbeddedWeightSync(srv.engine))
                path = "fast" if srv.engine._static is not None else "generic"
                print(f"[{label}] SDPA={sdpa} device={device} engine weights={dtype} compute={compute or dtype} "
                      f"({path} decode path) trainer fp32+{'invariant kernels' if true_on_policy else 'autocast'} "
                      f"params={n_params / 1e6:.1f}M chunk={a.chunk} chunked={inner._chunked}", flush=True)
                times: list[float] = []
                for step in range(a.steps):
                    backend.seconds = {"old_logprobs": 0.0, "train_step": 0.0}
                    backend.tokens = 0
                    if device == "cuda":
                        torch.cuda.reset_peak_memory_stats()
                    t_step = time.perf_counter()
                    row = await loop.run_step(step)
                    times.append(time.perf_counter() - t_step)
                    t_trainer = sum(backend.seconds.values())
                    reward = mc.read(row.values, mc.REWARD_MEAN)
                    line = (f"[{label}] step {step}: rollout {mc.require(row.values, mc.TIME_ROLLOUT_S):.2f}s train "
                            f"{mc.require(row.values, mc.TIME_TRAIN_S):.2f}s sync "
                            f"{mc.require(row.values, mc.TIME_SYNC_S):.2f}s reward "
                            f"{float('nan') if reward is None else reward:.3f}")
                    if backend.tokens:
                        mfu = 6 * n_params * backend.tokens / backend.seconds["train_step"] / H200_BF16_FLOPS
                        line += (f" | packed tokens {backend.tokens} old-logprobs {backend.seconds['old_logprobs']:.2f}s "
                                 f"train_step {backend.seconds['train_step']:.2f}s trainer {backend.tokens / t_trainer:,.0f} tok/s "
                                 f"MFU {100 * mfu:.2f}% (train_step only)")
                        line += " | consistency " + " ".join(
                            f"{k.split('/', 1)[1]}={v:.6g}" for k, v in sorted(m.items())
                            if k.startswith("consistency/") and k.count("/") == 1)
                    else:
                        line += " | nothing trained (every group uniform)"
                    if device == "cuda":
                        line += f" | peak GPU {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
                    print(line, flush=True)
                rundir.close()
                return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["tiny", "qwen3-0.6b"], default="tiny")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--micro-batch-tokens", type=int, default=16384)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--sdpa", choices=["flash", "efficient", "math", "cudnn", "no-cudnn", "auto"], default="no-cudnn")
    ap.add_argument("--engine-precision", choices=sorted(ENGINE_PRECISION), default="trainer")
    ap.add_argument("--baseline-precision", choices=[*sorted(ENGINE_PRECISION), "none"], default="bf16",
                    help="the same run's baseline: the loop again with the engine at this precision")
    ap.add_argument("--true-on-policy", action="store_true",
                    help="train.true_on_policy against the default mode (same engine precision) in the same run")
    ap.add_argument("--max-model-len", type=int, default=2048,
                    help="the engine's context per row (the fast path preallocates a KV slot this long per row)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        model = prepare(a.model, tmp)
        if a.true_on_policy:
            tops = asyncio.run(run(model, tmp, "true_on_policy", a.sdpa, "trainer", a, true_on_policy=True))
            default = asyncio.run(run(model, tmp, "default", a.sdpa, "trainer", a))
            # The first step compiles kernels and captures graphs: the means leave it out when there are more.
            skip = 1 if len(tops) > 1 else 0
            t_tops, t_default = sum(tops[skip:]) / len(tops[skip:]), sum(default[skip:]) / len(default[skip:])
            print(f"step time (mean of steps {skip}..{len(tops) - 1}): true_on_policy {t_tops:.2f}s, default "
                  f"{t_default:.2f}s, ratio {t_tops / t_default:.2f}x (target <= 1.3x)", flush=True)
            return
        asyncio.run(run(model, tmp, "chosen", a.sdpa, a.engine_precision, a))
        if a.baseline_precision != "none":
            asyncio.run(run(model, tmp, "baseline", a.sdpa, a.baseline_precision, a))


if __name__ == "__main__":
    main()
