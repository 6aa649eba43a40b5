"""train.true_on_policy on CPU: the embedded engine's sampled-token logprobs and the torch trainer's recomputation
are bit-identical (``torch.equal``), before and after a weight sync. Real engine, real backend, the tiny model; the
ops' batch invariance itself is checked on small tensors first."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from lego_rl.serving import batch_invariant as bi
from lego_rl.serving.engine import EmbeddedEngine
from lego_rl.serving.protocol import SamplingParams
from lego_rl.serving.tiny_model import ensure_tiny_model
from lego_rl.train.batching import plan_steps
from lego_rl.train.losses import LossConfig, make_loss
from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings
from lego_rl.trajectory.sample import Sample
from support.numerics import pinned_cpu_math

TEMPERATURE = 0.8
PROMPTS = [[1, 10, 72, 105, 300, 12], [5, 6, 7], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18]]


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    # The claim is bit-identity: both sides run in this process with the same thread count (tests/README.md).
    with pinned_cpu_math():
        yield


def test_linear_rows_and_columns_do_not_depend_on_the_batch() -> None:
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(37, 96, generator=g), torch.randn(80, 96, generator=g)  # [M, K], [N, K]
    full = bi.linear(x, w)  # [37, 80]
    assert torch.equal(bi.linear(x[5:6], w), full[5:6])  # one row alone
    assert torch.equal(bi.linear(x[:3], w[20:50]), full[:3, 20:50])  # a slice of the columns (a fused matrix's part)


def test_decode_attention_equals_the_packed_rows() -> None:
    g = torch.Generator().manual_seed(1)
    t, hq, hkv, d = 150, 4, 2, 16  # three key blocks
    q, k, v = (torch.randn(t, h, d, generator=g) for h in (hq, hkv, hkv))
    packed = bi.attention_packed(q, k, v, [0, 40, t], 0.25)  # two segments: [0, 40), [40, 150)
    cache_k = torch.zeros(1, hkv, 256, d)
    cache_v = torch.zeros(1, hkv, 256, d)
    cache_k[0, :, :110], cache_v[0, :, :110] = k[40:].transpose(0, 1), v[40:].transpose(0, 1)
    for p in (0, 63, 64, 65, 109):  # the second segment's positions, at and around block edges
        one = bi.attention_cached(q[40 + p:41 + p], cache_k, cache_v, [(0, 0, 1, p)], 0.25)  # [1, Hq, D]
        assert torch.equal(one, packed[40 + p:41 + p]), p
    # A prefill after a cached prefix (positions 50..109) gives the same rows too.
    tail = bi.attention_cached(q[90:], cache_k, cache_v, [(0, 0, 60, 50)], 0.25)
    assert torch.equal(tail, packed[90:])
    # Attention really is per segment: the second segment's first query sees only itself.
    assert torch.equal(packed[40], v[40].repeat_interleave(2, dim=0))


@pytest.fixture(scope="module")
def tiny() -> Path:
    return ensure_tiny_model()


async def _generate(engine: EmbeddedEngine, tag: str) -> list[tuple[list[int], list[int], list[float]]]:
    """The three prompts at once (rows join and leave the batch at different steps)."""
    outs = await asyncio.gather(*(
        engine.generate(p, SamplingParams(max_tokens=n, temperature=TEMPERATURE, seed=i), request_id=f"{tag}{i}",
                        ignore_eos=True)
        for i, (p, n) in enumerate(zip(PROMPTS, (40, 25, 33), strict=True))))
    return [(p, o.token_ids, list(o.logprobs)) for p, o in zip(PROMPTS, outs, strict=True)]


def _samples(rollouts: list[tuple[list[int], list[int], list[float]]]) -> list[Sample]:
    return [Sample(rollout_id=f"r{i}", group_index=0, index=i, segment=0, num_segments=1, tokens=p + out,
                   loss_mask=[0] * len(p) + [1] * len(out), rollout_logprobs=[0.0] * len(p) + lps)
            for i, (p, out, lps) in enumerate(rollouts)]


def _trainer_logprobs(backend: TorchBackend, rollouts: list[tuple[list[int], list[int], list[float]]]
                      ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(trainer, engine) logprobs of every sampled token, per rollout, from one packed micro-batch."""
    samples = _samples(rollouts)
    (step,) = plan_steps(samples, [1.0, -1.0, 0.5], max_tokens_per_micro_batch=4096)
    (mb,) = step.micro_batches
    (lp,) = backend.compute_logprobs([mb], temperature=TEMPERATURE)  # [T]
    trainer, engine = [], []
    for s, (start, end) in enumerate(zip(mb.cu_seqlens[:-1].tolist(), mb.cu_seqlens[1:].tolist(), strict=True)):
        sample = samples[mb.sample_indices[s]]
        n_out = sum(sample.loss_mask)
        trainer.append(lp[end - n_out:end])
        engine.append(torch.tensor(sample.rollout_logprobs[-n_out:], dtype=torch.float32))
    return trainer, engine


@pytest.mark.slow
async def test_engine_and_trainer_logprobs_are_bit_identical_across_a_weight_sync(tiny: Path) -> None:
    engine = EmbeddedEngine(tiny, max_batch=4, true_on_policy=True)
    assert engine._static is not None and engine._static.invariant
    backend = TorchBackend(tiny, TorchTrainSettings(lr=1e-3, device="cpu", true_on_policy=True))
    await engine.start()
    try:
        first = await _generate(engine, "a")
        trainer, sampled = _trainer_logprobs(backend, first)
        for t, e in zip(trainer, sampled, strict=True):
            assert torch.equal(t, e), (t - e).abs().max()
        # The default trainer (BLAS matmuls, SDPA) is another function at rounding level: the check above can fail.
        default = TorchBackend(tiny, TorchTrainSettings(lr=1e-3, device="cpu"))
        other, _ = _trainer_logprobs(default, first)
        assert any(not torch.equal(o, e) for o, e in zip(other, sampled, strict=True))
        del default

        # One optimizer step, the weights streamed into the engine as the loop's sync does, and again.
        samples = _samples(first)
        (step,) = plan_steps(samples, [1.0, -1.0, 0.5], max_tokens_per_micro_batch=4096)
        old = backend.compute_logprobs(step.micro_batches, temperature=TEMPERATURE)
        backend.train_step(step, make_loss(LossConfig()), old_logprobs=old, temperature=TEMPERATURE)
        await engine.update_weights(((n, t.clone()) for n, t in backend.export_weights()), version=1)
        second = await _generate(engine, "b")
        moved, _ = _trainer_logprobs(backend, first)
        assert any(not torch.equal(m, t) for m, t in zip(moved, trainer, strict=True))  # the update changed them
        trainer, sampled = _trainer_logprobs(backend, second)
        for t, e in zip(trainer, sampled, strict=True):
            assert torch.equal(t, e), (t - e).abs().max()
    finally:
        await engine.stop()
