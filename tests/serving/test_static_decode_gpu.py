"""The engine's fast path on a GPU (marked ``gpu``; skipped without CUDA): CUDA-graph decode equals the HF
forward in fp32, continuous batching through graphs samples what the generic path samples, and in the
trainer's recipe (fp32 weights, bf16 compute) the engine's logprobs meet issue 11's consistency targets
against the torch trainer backend (fp32 weights under bf16 autocast).

The model is a random-init Qwen3 (4 layers, hidden 512, GQA, head_dim 128) with the real 151,936 vocabulary.
Run on the lent H200: ``python3 -m pytest -q -m gpu tests/serving/test_static_decode_gpu.py``; the 0.6B
figures are ``benchmarks/gpu_engine_bench.py``'s, in benchmarks/RESULTS.md.
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

from lego_rl.serving.engine import EmbeddedEngine  # noqa: E402
from lego_rl.serving.protocol import SamplingParams  # noqa: E402
from lego_rl.serving.sampler import RowParams, sample_rows  # noqa: E402
from lego_rl.serving.static_decode import StaticDecoder  # noqa: E402
from lego_rl.serving.weights import load_model  # noqa: E402
from lego_rl.train.batching import plan_steps  # noqa: E402
from lego_rl.train.consistency import consistency_report  # noqa: E402
from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings  # noqa: E402
from lego_rl.trajectory.sample import Sample  # noqa: E402
from support.gpu_qwen3 import VOCAB, save_random_qwen3  # noqa: E402

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_qwen3(tmp_path_factory.mktemp("qwen3-gpu"), max_position_embeddings=4096)

@pytest.mark.parametrize("attention", ["triton", "sdpa"])
@pytest.mark.parametrize("compiled", [False, True], ids=["captured", "compiled-then-captured"])
def test_graph_decode_equals_the_hf_forward_fp32(model_dir: Path, compiled: bool, attention: str) -> None:
    model, config, _ = load_model(model_dir, torch.device("cuda"), "float32")
    dec = StaticDecoder(model, config, slots=8, max_len=1024, compute_dtype=torch.float32, use_graphs=True,
                        compile=compiled, attention=attention)  # type: ignore[arg-type]
    assert dec.triton_attention is (attention == "triton")
    rng = random.Random(0)
    seqs = [[rng.randrange(VOCAB) for _ in range(n)] for n in (5, 130, 300)]  # spans 128 and 512 buckets
    for slot, seq in enumerate(seqs):
        dec.prefill(slot, seq[:-1], 0)
    got = dec.decode([s[-1] for s in seqs], [len(s) - 1 for s in seqs])  # [3, V] replayed graph (bucket 4)
    again = dec.decode([s[-1] for s in seqs], [len(s) - 1 for s in seqs])  # [3, V] the same graph, replayed
    assert torch.equal(got, again)
    for i, seq in enumerate(seqs):
        with torch.no_grad():
            want = model(input_ids=torch.tensor([seq], device="cuda")).logits[0, -1].float()  # [V]
        assert (got[i] - want).abs().max().item() < 1e-3

async def sample(model_dir: Path, n: int, new: int, **kw: object) -> tuple[list[list[int]], list[object]]:
    engine = EmbeddedEngine(model_dir, device="cuda", max_batch=n, max_model_len=1024, **kw)  # type: ignore[arg-type]
    await engine.start()
    rng = random.Random(1)
    prompts = [[rng.randrange(VOCAB) for _ in range(64 + 16 * i)] for i in range(n)]
    try:
        outs = await asyncio.gather(*(
            engine.generate(p, SamplingParams(max_tokens=new - 8 * (i % 3), temperature=1.0, seed=i),
                            request_id=f"r{i}", ignore_eos=True) for i, p in enumerate(prompts)))
    finally:
        await engine.stop()
    return prompts, list(outs)

def test_graphs_with_rows_leaving_sample_what_the_generic_path_samples(model_dir: Path) -> None:
    # Plain asyncio.run: the lent machine has no pytest-asyncio.
    _, fast = asyncio.run(sample(model_dir, 6, 40, dtype="float32", fast=True))
    _, slow = asyncio.run(sample(model_dir, 6, 40, dtype="float32", fast=False))
    for f, s in zip(fast, slow, strict=True):
        assert f.token_ids == s.token_ids  # type: ignore[attr-defined]
        assert max(abs(a - b) for a, b in zip(f.logprobs, s.logprobs, strict=True)) < 1e-3  # type: ignore[attr-defined]

def test_trainer_recipe_meets_the_consistency_targets(model_dir: Path) -> None:
    torch.backends.cuda.enable_cudnn_sdp(False)  # the trainer has no switch of its own (RESULTS.md)
    backend = TorchBackend(model_dir, TorchTrainSettings(lr=1e-6, device="cuda"))
    figures = {}
    for label, kw in (("pure", {"dtype": "bfloat16"}), ("recipe", {"dtype": "float32", "compute_dtype": "bfloat16"})):
        prompts, outs = asyncio.run(sample(model_dir, 8, 128, fast=True, **kw))
        samples = [Sample(rollout_id=f"r{i}", group_index=i, index=0, segment=0, num_segments=1,
                          tokens=p + o.token_ids, loss_mask=[0] * len(p) + [1] * len(o.token_ids),  # type: ignore[attr-defined]
                          rollout_logprobs=[0.0] * len(p) + list(o.logprobs))  # type: ignore[attr-defined]
                   for i, (p, o) in enumerate(zip(prompts, outs, strict=True))]
        [step] = plan_steps(samples, [1.0] * len(samples), max_tokens_per_micro_batch=8192)
        trainer = backend.compute_logprobs(step.micro_batches, temperature=1.0)
        figures[label] = consistency_report(torch.cat([mb.rollout_logprobs for mb in step.micro_batches]),
                                            torch.cat(trainer),
                                            torch.cat([mb.loss_mask for mb in step.micro_batches])).overall
    print(figures)
    assert figures["recipe"].pearson >= 0.9999 and figures["recipe"].mean_abs_diff <= 0.004, figures
    assert figures["recipe"].mean_abs_diff < figures["pure"].mean_abs_diff


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_attention_and_the_draw_in_the_graph_match_the_sdpa_step(model_dir: Path, dtype: torch.dtype) -> None:
    """One decode step through the Triton kernel (KV write inside) against the SDPA step, same inputs; then the
    graph's own draw against ``sample_rows`` on that graph's logits."""
    model, config, _ = load_model(model_dir, torch.device("cuda"), "float32" if dtype == torch.float32 else "bfloat16")
    rng = random.Random(3)
    seqs = [[rng.randrange(VOCAB) for _ in range(n)] for n in (7, 200, 45, 129, 64)]  # 5 rows: bucket 8
    logits = {}
    decs = {}
    for attention in ("triton", "sdpa"):
        dec = StaticDecoder(model, config, slots=8, max_len=512, compute_dtype=dtype, use_graphs=True,
                            attention=attention)  # type: ignore[arg-type]
        for slot, seq in enumerate(seqs):
            dec.prefill(slot, seq[:-1], 0)
        logits[attention] = dec.decode([s[-1] for s in seqs], [len(s) - 1 for s in seqs]).clone()  # [5, V]
        decs[attention] = dec
    tol = 1e-4 if dtype == torch.float32 else 0.1  # bf16: a different summation order over bf16 inputs
    assert (logits["triton"] - logits["sdpa"]).abs().max().item() < tol
    # Layer 0's new keys and values are the same numbers (later layers' inputs carry the attention's kernel noise).
    for cache in ("k", "v"):
        assert torch.equal(getattr(decs["triton"], cache)[0], getattr(decs["sdpa"], cache)[0])
        assert (getattr(decs["triton"], cache).float() - getattr(decs["sdpa"], cache).float()).abs().max() < 10 * tol
    dec = decs["triton"]
    row_params = [RowParams(temperature=t, top_p=1.0, top_k=0, num_logprobs=i % 2, want_nucleus=False,
                            generator=torch.Generator().manual_seed(i)) for i, t in enumerate([1.0, 0.0, 0.7, 1.0, 1.2])]
    twins = [RowParams(**{**vars(r), "generator": torch.Generator().manual_seed(i)}) for i, r in enumerate(row_params)]
    ids, pos = [s[-1] for s in seqs], [len(s) - 1 for s in seqs]
    want = sample_rows(dec.decode(ids, pos), twins)
    got = dec.decode_draw(ids, pos, row_params)
    assert [d.token for d in got] == [d.token for d in want]
    assert [d.rank for d in got] == [d.rank for d in want]
    assert [d.top for d in got] == [d.top for d in want]
    assert [len(d.top) for d in got] == [0, 1, 0, 1, 0]  # num_logprobs = row index % 2
    assert max(abs(a.logprob - b.logprob) for a, b in zip(got, want, strict=True)) < 1e-5
