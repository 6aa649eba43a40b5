"""fp32 training and scoring on CUDA (marked ``gpu``; skipped without CUDA), issue 31.

``train.precision = "fp32"`` turns the torch trainer's bf16 autocast off on CUDA. varlen attention (flash) has no
fp32 kernel, so ``packed_attention = "auto"`` must take the SDPA path there, an explicit ``"varlen"`` must be a
ConfigError, and the packed fp32 scores must be an fp32 forward's: each segment's logprobs equal a plain HF fp32
forward of that segment alone (to fp32 kernel noise, far below what bf16 would give), a step trains, and the
embedded engine in fp32 agrees with the trainer in fp32 (``benchmarks/gpu_engine_bench.py``'s parity row).

Model: ``support.gpu_qwen3`` (4 layers, hidden 512, real 151,936 vocabulary). Run on the lent H200:
``python3 -m pytest -q -m gpu tests/train/test_fp32_gpu.py``.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs CUDA (run on the lent H200)", allow_module_level=True)

from lego_rl.errors import ConfigError  # noqa: E402
from lego_rl.serving.engine import EmbeddedEngine  # noqa: E402
from lego_rl.serving.protocol import SamplingParams  # noqa: E402
from lego_rl.serving.weights import load_model  # noqa: E402
from lego_rl.train.batching import plan_steps  # noqa: E402
from lego_rl.train.consistency import consistency_report  # noqa: E402
from lego_rl.train.losses import LossConfig, make_loss  # noqa: E402
from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings  # noqa: E402
from lego_rl.trajectory.sample import Sample  # noqa: E402
from support.gpu_qwen3 import VOCAB, random_rollouts, save_random_qwen3  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_qwen3(tmp_path_factory.mktemp("qwen3-fp32"), max_position_embeddings=4096)


def samples(seed: int, n: int = 8) -> tuple[list[Sample], list[float]]:
    """``n`` one-segment rollouts of 40–500 tokens, advantages of both signs."""
    return random_rollouts(seed, n, max_part=250, logprob_range=(8.0, 14.0))


def reference_logprobs(model_dir: Path, seqs: list[list[int]]) -> list[torch.Tensor]:
    """Each sequence alone through the plain HF model in fp32 (no packing, no autocast): [len - 1] logprobs."""
    model, _, _ = load_model(model_dir, torch.device("cuda"), "float32")
    out = []
    with torch.no_grad():
        for seq in seqs:
            ids = torch.tensor([seq], device="cuda")
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)  # [n-1, V]
            out.append(logp.gather(1, ids[0, 1:, None])[:, 0].cpu())  # [n-1]
    del model
    torch.cuda.empty_cache()
    return out


def test_varlen_with_fp32_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="packed_attention 'varlen' cannot run with precision 'fp32'"):
        TorchTrainSettings(lr=1e-4, device="cuda", packed_attention="varlen", precision="fp32")


def test_fp32_scores_are_an_fp32_forward_and_a_step_trains(model_dir: Path) -> None:
    s, adv = samples(1)
    (step,) = plan_steps(s, adv, max_tokens_per_micro_batch=1024)
    assert len(step.micro_batches) > 1
    want = reference_logprobs(model_dir, [x.tokens for x in s])
    errs: dict[str, list[float]] = {}
    for precision in ("fp32", "bf16"):
        b = TorchBackend(model_dir, TorchTrainSettings(lr=1e-4, device="cuda", precision=precision))  # type: ignore[arg-type]
        assert b._varlen is (precision == "bf16")  # auto: varlen for bf16, SDPA for fp32
        assert b.compute_dtype == (torch.float32 if precision == "fp32" else torch.bfloat16)
        got = b.compute_logprobs(step.micro_batches, temperature=1.0)
        errs[precision] = []
        for mb, lp in zip(step.micro_batches, got, strict=True):
            starts = mb.cu_seqlens.tolist()
            for a, z in zip(starts[:-1], starts[1:], strict=True):
                seg = lp[a + 1 : z]  # [n-1] position 0 of a segment has no prediction
                ref = next(w for w, x in zip(want, s, strict=True) if x.tokens == mb.input_ids[a:z].tolist())
                errs[precision].append((seg - ref).abs().max().item())
        if precision == "fp32":
            old = got
            res = b.train_step(step, make_loss(LossConfig()), old_logprobs=old, temperature=1.0)
            assert torch.isfinite(torch.tensor(res.metrics["loss"])) and res.metrics["grad_norm"] > 0
            after = b.compute_logprobs(step.micro_batches, temperature=1.0)
            assert any(not torch.equal(x, y) for x, y in zip(old, after, strict=True))  # the step did update
        del b
        torch.cuda.empty_cache()
    # fp32 packed scoring = the fp32 forward of each segment alone, to fp32 kernel noise; bf16 is far off.
    assert max(errs["fp32"]) < 1e-3, max(errs["fp32"])
    assert max(errs["bf16"]) > 10 * max(errs["fp32"]), (max(errs["bf16"]), max(errs["fp32"]))


def test_engine_fp32_agrees_with_the_fp32_trainer(model_dir: Path) -> None:
    async def rollouts() -> list[Sample]:
        engine = EmbeddedEngine(model_dir, device="cuda", dtype="float32", fast=True, max_batch=4,
                                max_model_len=1024)
        await engine.start()
        rng = random.Random(2)
        prompts = [[rng.randrange(VOCAB) for _ in range(64 + 32 * i)] for i in range(4)]
        try:
            outs = await asyncio.gather(*(engine.generate(p, SamplingParams(max_tokens=64, temperature=1.0, seed=i),
                                                          request_id=f"p{i}", ignore_eos=True)
                                          for i, p in enumerate(prompts)))
        finally:
            await engine.stop()
        return [Sample(rollout_id=f"r{i}", group_index=i, index=0, segment=0, num_segments=1,
                       tokens=p + o.token_ids, loss_mask=[0] * len(p) + [1] * len(o.token_ids),
                       rollout_logprobs=[0.0] * len(p) + list(o.logprobs))
                for i, (p, o) in enumerate(zip(prompts, outs, strict=True))]

    s = asyncio.run(rollouts())
    b = TorchBackend(model_dir, TorchTrainSettings(lr=1e-4, device="cuda", precision="fp32"))
    (step,) = plan_steps(s, [1.0] * len(s), max_tokens_per_micro_batch=8192)
    got = b.compute_logprobs(step.micro_batches, temperature=1.0)
    report = consistency_report(torch.cat([mb.rollout_logprobs for mb in step.micro_batches]), torch.cat(got),
                                torch.cat([mb.loss_mask for mb in step.micro_batches]))
    assert report.overall.tokens > 200 and report.overall.max_abs_diff < 1e-3, report.overall
