"""The engine's fast path (``StaticDecoder``: preallocated KV slots, compacted rows) against its generic path
(transformers' own forward over ``kv.py``'s cache): the same sampled tokens and logprobs for the same seeds,
with requests joining and leaving mid-batch, a reused prefix, and a weight update mid-generation. Real tiny
model on CPU in fp32 (CUDA graphs are GPU-only; ``test_static_decode_gpu`` covers them on the H200)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from lego_rl.errors import ConfigError
from lego_rl.serving.engine import EmbeddedEngine, engine_precision
from lego_rl.serving.logprobs import teacher_forced_logprobs
from lego_rl.serving.protocol import SamplingParams
from lego_rl.serving.static_decode import StaticDecoder, unsupported_reason
from lego_rl.serving.weights import load_model
from support.numerics import FORWARD_ULPS, TINY_LOGIT_BOUND, forward_tolerance, ulp_tolerance

PROMPTS = [[1, 10, 72, 105, 300, 12], [5, 6, 7], list(range(20, 60)), [9, 8, 7, 6, 5, 4, 3, 2]]


async def run_mix(engine: EmbeddedEngine) -> list[tuple[list[int], list[float]]]:
    """Four requests of different lengths and budgets, two arriving late: rows join and leave mid-batch."""
    async def one(i: int, delay: float) -> tuple[list[int], list[float]]:
        await asyncio.sleep(delay)
        sp = SamplingParams(max_tokens=6 + 5 * i, temperature=1.0, top_p=0.9 if i % 2 else 1.0, seed=100 + i)
        out = await engine.generate(PROMPTS[i], sp, request_id=f"r{i}", ignore_eos=True)
        return out.token_ids, out.logprobs

    await engine.start()
    try:
        return list(await asyncio.gather(one(0, 0), one(1, 0), one(2, 0.05), one(3, 0.1)))
    finally:
        await engine.stop()


async def test_fast_path_samples_what_the_generic_path_samples(tiny_model: Path) -> None:
    fast = await run_mix(EmbeddedEngine(tiny_model, max_batch=3, fast=True))
    slow = await run_mix(EmbeddedEngine(tiny_model, max_batch=3, fast=False))
    for (ft, fl), (st, sl) in zip(fast, slow, strict=True):
        assert ft == st
        # Two paths through the whole forward (other kernels): fp32 forward noise only.
        assert max(abs(a - b) for a, b in zip(fl, sl, strict=True)) < forward_tolerance(1.0)


async def test_fast_path_reuses_a_prefix_and_survives_a_weight_update(tiny_model: Path) -> None:
    results = []
    for fast in (True, False):
        engine = EmbeddedEngine(tiny_model, max_batch=2, fast=fast)
        await engine.start()
        sp = SamplingParams(max_tokens=8, temperature=1.0, seed=3, ignore_eos=True)
        first = await engine.generate(PROMPTS[0], sp, request_id="a", ignore_eos=True)
        follow = PROMPTS[0] + first.token_ids + [44, 45]
        second = await engine.generate(follow, sp, request_id="b", ignore_eos=True)
        assert engine.prefix_cache.hits == 1
        results.append((second.token_ids, second.logprobs))
        if fast:
            # A weight change while a request is frozen mid-generation: its KV is recomputed under the new
            # weights, so every token after the change has the logprob a fresh forward of the new model gives.
            long = asyncio.create_task(engine.generate(PROMPTS[2], sp.model_copy(update={"max_tokens": 40}),
                                                       request_id="c", ignore_eos=True))
            while "c" not in engine._by_id or len(engine._by_id["c"].out.token_ids) < 5:
                await asyncio.sleep(0.001)
            await engine.pause("keep")
            state = {n: p.detach() * 1.5 for n, p in engine.model.named_parameters()}
            await engine.update_weights(state.items(), version=1)
            await engine.resume()
            third = await long
            cut = third.versions.index("1")
            assert 0 < cut < len(third.token_ids) and set(third.versions[cut:]) == {"1"}
            fresh = teacher_forced_logprobs(engine.model, PROMPTS[2] + third.token_ids, len(PROMPTS[2]), 1.0)
            new_diff = (fresh[cut:] - torch.tensor(third.logprobs[cut:])).abs().max().item()
            assert new_diff < forward_tolerance(1.0)
            assert (fresh[:cut] - torch.tensor(third.logprobs[:cut])).abs().max().item() > 1e-3  # old weights
        await engine.stop()
    (f2, fl2), (s2, sl2) = results
    assert f2 == s2 and max(abs(a - b) for a, b in zip(fl2, sl2, strict=True)) < forward_tolerance(1.0)


def test_decoder_logits_equal_the_hf_forward(tiny_model: Path) -> None:
    """Prefill, a prefix-continued prefill and per-row decode at different positions, against HF's forward."""
    model, config, _ = load_model(tiny_model, torch.device("cpu"), "float32")
    dec = StaticDecoder(model, config, slots=3, max_len=256, compute_dtype=torch.float32, use_graphs=False)
    seqs = [list(range(3, 40)), list(range(100, 110)), [7] * 3]
    for slot, seq in enumerate(seqs):
        dec.prefill(slot, seq[:-1][:5], 0)
        if len(seq) > 6:
            dec.prefill(slot, seq[5:-1], 5)  # the rest after a "cached" prefix
    got = dec.decode([s[-1] for s in seqs], [len(s) - 1 for s in seqs])  # [3, V]
    for i, seq in enumerate(seqs):
        with torch.no_grad():
            want = model(input_ids=torch.tensor([seq])).logits[0, -1].float()  # [V]
        # Logits of two paths through the whole forward: forward noise at the logits' magnitude.
        assert torch.allclose(got[i], want, atol=forward_tolerance(), rtol=0), (got[i] - want).abs().max()
    # New weights (every parameter, norms included) reach the decoder's derived copies through refresh_weights.
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(1.25)
    dec.refresh_weights()
    got = dec.prefill(0, seqs[0], 0)[0]  # [V]
    with torch.no_grad():
        want = model(input_ids=torch.tensor([seqs[0]])).logits[0, -1].float()  # [V]
    # Every parameter x1.25 (the final norm's and the head's too): logits up to 1.25^2 times larger.
    scaled = ulp_tolerance(torch.float32, magnitude=TINY_LOGIT_BOUND * 1.25**2, ulps=FORWARD_ULPS)
    assert torch.allclose(got, want, atol=scaled, rtol=0), (got - want).abs().max()


def test_batched_prefill_equals_one_prompt_at_a_time(tiny_model: Path) -> None:
    """``prefill_rows`` (right-padded prompts of different lengths in one forward) writes the KV and returns the
    last-position logits that one prefill per prompt gives, and the rows then decode as HF's forward does."""
    model, config, _ = load_model(tiny_model, torch.device("cpu"), "float32")
    dec = StaticDecoder(model, config, slots=4, max_len=128, compute_dtype=torch.float32, use_graphs=False)
    ref = StaticDecoder(model, config, slots=4, max_len=128, compute_dtype=torch.float32, use_graphs=False)
    seqs = [list(range(3, 40)), [7, 8], list(range(100, 117))]
    got = dec.prefill_rows(1, [s[:-1] for s in seqs])  # [3, V] into slots 1..3
    for i, seq in enumerate(seqs):
        want = ref.prefill(i + 1, seq[:-1], 0)[0]  # [V]
        # A padded batch against one prompt: other matmul shapes through the forward (forward noise).
        assert torch.allclose(got[i], want, atol=forward_tolerance(), rtol=0), (i, (got[i] - want).abs().max())
        n = len(seq) - 1
        for mine, theirs in ((dec.k[:, i + 1, :, :n], ref.k[:, i + 1, :, :n]),
                             (dec.v[:, i + 1, :, :n], ref.v[:, i + 1, :, :n])):
            # The same noise at the cache entries' own magnitude.
            kv_tol = ulp_tolerance(torch.float32, magnitude=float(theirs.abs().max()), ulps=FORWARD_ULPS)
            assert torch.allclose(mine, theirs, atol=kv_tol, rtol=0)
    dec.move(1, 0, len(seqs[0]) - 1)
    dec.move(2, 1, len(seqs[1]) - 1)
    dec.move(3, 2, len(seqs[2]) - 1)
    # The padding's KV (slot 2 past position 1) is never attended to: decode at each row's own position.
    out = dec.decode([s[-1] for s in seqs], [len(s) - 1 for s in seqs])  # [3, V]
    for i, seq in enumerate(seqs):
        with torch.no_grad():
            want = model(input_ids=torch.tensor([seq])).logits[0, -1].float()  # [V]
        assert torch.allclose(out[i], want, atol=forward_tolerance(), rtol=0), (i, (out[i] - want).abs().max())
    with pytest.raises(ValueError, match="slots 2..4 exceed the static cache's 4 slots"):
        dec.prefill_rows(2, seqs)
    with pytest.raises(ValueError, match="no empty prompt"):
        dec.prefill_rows(0, [[1, 2], []])


async def test_admissions_prefill_as_batches_within_the_token_budget(tiny_model: Path) -> None:
    """Requests arriving together are prefilled in batches bounded by ``prefill_batch_tokens`` (and one that
    reuses a cached prefix on its own); tokens and logprobs equal a budget that prefills one at a time."""
    calls: list[int] = []
    results = []
    for budget in (1, 80):
        engine = EmbeddedEngine(tiny_model, max_batch=4, fast=True, prefill_batch_tokens=budget)
        assert engine._static is not None
        inner = engine._static.prefill_rows

        def counted(slot: int, prompts: list[list[int]], inner: Any = inner) -> torch.Tensor:
            calls.append(len(prompts))
            return inner(slot, prompts)

        engine._static.prefill_rows = counted  # type: ignore[method-assign]
        await engine.start()
        try:
            outs = await asyncio.gather(*(engine.generate(p, SamplingParams(max_tokens=5, temperature=1.0, seed=i),
                                                          request_id=f"q{i}", ignore_eos=True)
                                          for i, p in enumerate(PROMPTS)))
        finally:
            await engine.stop()
        results.append([(o.token_ids, o.logprobs) for o in outs])
        if budget == 1:  # every prompt is longer than the budget: each alone, through the chunked path
            assert calls == []
        else:  # 6, 3 (padded 6·3 = 18), then 40 joins (3·40 = 120 > 80): [6, 3], then [40, 8] (2·40 = 80)
            assert calls == [2, 2]
    assert results[0] == results[1] or all(
        # Other prefill batch shapes: fp32 forward noise only.
        a[0] == b[0] and max(abs(x - y) for x, y in zip(a[1], b[1], strict=True)) < forward_tolerance(1.0)
        for a, b in zip(results[0], results[1], strict=True))


def test_mixed_precision_matches_autocast_on_cpu(tiny_model: Path) -> None:
    """fp32 weights with bf16 compute is the HF forward under bf16 autocast (CPU autocast here): the same
    matmul inputs, the fp32 residual stream."""
    model, config, _ = load_model(tiny_model, torch.device("cpu"), "float32")
    dec = StaticDecoder(model, config, slots=1, max_len=128, compute_dtype=torch.bfloat16, use_graphs=False)
    seq = list(range(3, 30))
    got = dec.prefill(0, seq, 0)[0]  # [V]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = model(input_ids=torch.tensor([seq])).logits[0, -1].float()  # [V]
    pure = model.to(torch.bfloat16)
    with torch.no_grad():
        bf16 = pure(input_ids=torch.tensor([seq])).logits[0, -1].float()  # [V]
    err, pure_err = (got - want).abs().max().item(), (bf16 - want).abs().max().item()
    assert err < 0.25 * pure_err, (err, pure_err)  # far closer to autocast than the pure-bf16 model is


def test_unsupported_models_are_refused_by_name(tiny_model: Path) -> None:
    model, config, _ = load_model(tiny_model, torch.device("cpu"), "float32")
    assert unsupported_reason(model, config) is None
    config.rope_parameters = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}
    assert "yarn" in (unsupported_reason(model, config) or "")
    config.rope_parameters = {"rope_type": "default", "rope_theta": 1e6}
    config.model_type = "gemma2"
    assert "gemma2" in (unsupported_reason(model, config) or "")


def test_serving_precision_picks_the_trainer_recipe_on_cuda_only_by_default() -> None:
    assert engine_precision("cuda", "auto", "auto") == ("float32", "bfloat16")
    assert engine_precision("cuda", "bfloat16", "auto") == ("bfloat16", None)  # an explicit dtype is kept
    assert engine_precision("cuda", "auto", "weights") == ("bfloat16", None)
    assert engine_precision("cuda", "bfloat16", "trainer") == ("float32", "bfloat16")
    assert engine_precision("cpu", "auto", "auto") == ("float32", None)
    assert engine_precision("cpu", "auto", "trainer") == ("float32", None)
    # an fp32 trainer: "trainer" precision samples in fp32 too (it used to stay bf16 whatever train.precision said)
    assert engine_precision("cuda", "auto", "trainer", trainer_precision="fp32") == ("float32", None)
    assert engine_precision("cuda", "auto", "auto", trainer_precision="fp32") == ("float32", None)


async def test_compute_dtype_on_the_generic_path_runs_under_autocast(tiny_model: Path) -> None:
    """fp32 weights with bf16 compute on the generic path (CPU autocast): logprobs move off the fp32 ones by
    bf16 rounding, and an unknown compute dtype is refused by name."""
    sp = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    outs = []
    for compute in (None, "bfloat16"):
        engine = EmbeddedEngine(tiny_model, max_batch=1, fast=False, compute_dtype=compute)
        await engine.start()
        outs.append(await engine.generate(PROMPTS[0], sp, request_id="x", ignore_eos=True))
        await engine.stop()
    # Compared at the first token (the same prompt; later tokens may differ once a draw lands elsewhere).
    assert outs[0].token_ids[0] == outs[1].token_ids[0]
    assert 1e-5 < abs(outs[0].logprobs[0] - outs[1].logprobs[0]) < 0.2
    with pytest.raises(ConfigError, match="compute_dtype 'int8'"):
        EmbeddedEngine(tiny_model, compute_dtype="int8")
