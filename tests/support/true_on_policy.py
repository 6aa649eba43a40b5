"""The ``train.true_on_policy`` end-to-end check the CPU and GPU tests share: a real embedded engine and a real
torch backend, both in that mode; every sampled token's engine logprob must equal the trainer's recomputation
bit for bit (``torch.equal``), for fresh prompts, for prompts that extend earlier ones (the engine reuses the
cached prefix's KV), and after one optimizer step whose weights are streamed into the engine (the loop's sync)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import torch

from lego_rl.serving.engine import EmbeddedEngine
from lego_rl.serving.protocol import SamplingParams
from lego_rl.train.batching import plan_steps
from lego_rl.train.losses import LossConfig, make_loss
from lego_rl.train.torch_backend import TorchBackend
from lego_rl.trajectory.sample import Sample

Rollout = tuple[list[int], list[int], list[float]]
"""(prompt ids, sampled ids, the engine's logprob of each sampled id)."""


async def generate(engine: EmbeddedEngine, prompts: list[list[int]], max_tokens: list[int], tag: str,
                   temperature: float) -> list[Rollout]:
    """All prompts at once: rows join the batch together and leave it at different steps."""
    outs = await asyncio.gather(*(
        engine.generate(p, SamplingParams(max_tokens=n, temperature=temperature, seed=i), request_id=f"{tag}{i}",
                        ignore_eos=True)
        for i, (p, n) in enumerate(zip(prompts, max_tokens, strict=True))))
    return [(p, o.token_ids, list(o.logprobs)) for p, o in zip(prompts, outs, strict=True)]


def samples_of(rollouts: list[Rollout]) -> list[Sample]:
    return [Sample(rollout_id=f"r{i}", group_index=0, index=i, segment=0, num_segments=1, tokens=p + out,
                   loss_mask=[0] * len(p) + [1] * len(out), rollout_logprobs=[0.0] * len(p) + lps)
            for i, (p, out, lps) in enumerate(rollouts)]


def advantages(n: int) -> list[float]:
    return [[1.0, -1.0, 0.5, -0.5][i % 4] for i in range(n)]


def trainer_and_engine(backend: TorchBackend, rollouts: list[Rollout], temperature: float,
                       micro_batch_tokens: int = 1 << 16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per rollout: (the trainer's logprobs of its sampled tokens, the engine's), all rollouts packed together."""
    samples = samples_of(rollouts)
    (step,) = plan_steps(samples, advantages(len(samples)), max_tokens_per_micro_batch=micro_batch_tokens)
    out = []
    lps = backend.compute_logprobs(step.micro_batches, temperature=temperature)
    for mb, lp in zip(step.micro_batches, lps, strict=True):
        for s, end in enumerate(mb.cu_seqlens[1:].tolist()):
            sample = samples[mb.sample_indices[s]]
            n_out = sum(sample.loss_mask)
            out.append((lp[end - n_out:end], torch.tensor(sample.rollout_logprobs[-n_out:], dtype=torch.float32)))
    return out


def assert_identical(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
    """Every pair equal bit for bit; returns the tokens compared."""
    for i, (t, e) in enumerate(pairs):
        assert t.shape == e.shape and torch.equal(t, e), (
            f"rollout {i}: {int((t != e).sum())} of {e.numel()} logprobs differ, max |Δ| {(t - e).abs().max():.3g}")
    return sum(e.numel() for _, e in pairs)


@dataclass
class Checked:
    tokens: int
    """Sampled tokens compared bit for bit."""


async def check_across_sync(engine: EmbeddedEngine, backend: TorchBackend, prompts: list[list[int]],
                            max_tokens: list[int], temperature: float) -> Checked:
    """The three rounds of the module docstring; the engine must have been started."""
    first = await generate(engine, prompts, max_tokens, "a", temperature)
    tokens = assert_identical(trainer_and_engine(backend, first, temperature))
    # Prompts that extend round one's whole sequences: the engine prefills only the new tail over cached KV.
    hits = engine.prefix_cache.hits
    longer = [p + out + [7, 8, 9] for p, out, _ in first]
    second = await generate(engine, longer, [8] * len(longer), "b", temperature)
    assert engine.prefix_cache.hits > hits, "round two reused no cached prefix"
    tokens += assert_identical(trainer_and_engine(backend, second, temperature))
    # One optimizer step, its weights streamed into the engine in place, then fresh rollouts.
    samples = samples_of(first)
    (step,) = plan_steps(samples, advantages(len(samples)), max_tokens_per_micro_batch=1 << 16)
    old = backend.compute_logprobs(step.micro_batches, temperature=temperature)
    backend.train_step(step, make_loss(LossConfig()), old_logprobs=old, temperature=temperature)
    await engine.update_weights(((n, t.clone()) for n, t in backend.export_weights()), version=1)
    before = trainer_and_engine(backend, first, temperature)
    assert any(not torch.equal(t, e) for t, e in before), "the optimizer step changed no logprob"
    third = await generate(engine, prompts, max_tokens, "c", temperature)
    tokens += assert_identical(trainer_and_engine(backend, third, temperature))
    return Checked(tokens=tokens)
