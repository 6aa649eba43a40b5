"""Sampling inside the decode graph (issue 31): ``draw_plain`` — the sampler's arithmetic for rows without
top-k/top-p or nucleus and at most one alternative, as tensor ops alone — gives ``sample_rows``' tokens, logprobs and ranks
exactly, consumes each row's generator as ``sample_rows`` does, and the engine's fast path that uses it
(``StaticDecoder.decode_draw``, and with the next step queued before a step is read: ``launch_draw``) samples
what it sampled before, rows finishing by length and by a stop token mid-burst. CPU, real tiny model; the graphs themselves
and the Triton decode attention run on the H200 (``test_static_decode_gpu.py``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from lego_rl.errors import ConfigError
from lego_rl.serving.engine import EmbeddedEngine
from lego_rl.serving.protocol import SamplingParams
from lego_rl.serving.sampler import RowParams, draw_plain, is_plain, plain_draws, plain_inputs, sample_rows
from lego_rl.serving.static_decode import StaticDecoder
from lego_rl.serving.weights import load_model


def rows(temps: list[float], seed: int, alternatives: int) -> list[RowParams]:
    return [RowParams(temperature=t, top_p=1.0, top_k=0, num_logprobs=alternatives, want_nucleus=False,
                      generator=torch.Generator().manual_seed(seed + i)) for i, t in enumerate(temps)]


@pytest.mark.parametrize("alternatives", [0, 1])
@pytest.mark.parametrize("vocab", [50, 151936])
def test_draw_plain_is_sample_rows_for_plain_rows(vocab: int, alternatives: int) -> None:
    temps = [1.0, 0.0, 0.7, 1.3, 1e-6]  # greedy twice (0 and below GREEDY_EPS)
    logits = torch.randn(len(temps), vocab, generator=torch.Generator().manual_seed(vocab)) * 4  # [B, V]
    want_rows, got_rows = rows(temps, 7, alternatives), rows(temps, 7, alternatives)
    for _ in range(3):  # several steps: the generators advance alike
        want = sample_rows(logits, want_rows)
        t, u = plain_inputs(got_rows)
        packed = draw_plain(logits, torch.tensor(t), torch.tensor(u, dtype=torch.float64)).tolist()
        got = plain_draws(packed, got_rows)
        assert [(d.token, d.logprob, d.rank, d.top) for d in got] == \
            [(d.token, d.logprob, d.rank, d.top) for d in want]
        assert got[1].token == int(logits[1].argmax()) and got[1].rank == 1
        assert all(len(d.top) == alternatives for d in got)
        logits = logits.roll(1, dims=1)


def test_only_untruncated_rows_without_extras_are_plain() -> None:
    base = dict(temperature=1.0, top_p=1.0, top_k=0, num_logprobs=0, want_nucleus=False, generator=None)
    assert is_plain(RowParams(**base))  # type: ignore[arg-type]
    assert is_plain(RowParams(**{**base, "top_k": -1, "num_logprobs": 1}))  # type: ignore[arg-type]
    for change in ({"top_p": 0.95}, {"top_k": 20}, {"num_logprobs": 2}, {"want_nucleus": True}):
        assert not is_plain(RowParams(**{**base, **change}))  # type: ignore[arg-type]


async def generate_all(engine: EmbeddedEngine, top_p: float) -> list[tuple[object, ...]]:
    """Four requests finishing at different steps: by length (5, 8, 11, 40 tokens) and, for the last, by a stop
    token drawn somewhere in its 40 (a burst's look-ahead step then runs past a finished row)."""
    await engine.start()
    try:
        outs = await asyncio.gather(*(engine.generate(
            list(range(3 + 4 * i, 12 + 5 * i)),
            SamplingParams(max_tokens=[5, 8, 11, 40][i], temperature=[1.0, 0.0, 0.8, 1.0][i], top_p=top_p,
                           seed=40 + i, stop_token_ids=list(range(0, 1884, 3)) if i == 3 else []),
            request_id=f"q{i}", ignore_eos=True) for i in range(4)))
    finally:
        await engine.stop()
    return [(o.token_ids, o.logprobs, o.ranks, o.top, o.finish_reason) for o in outs]


@pytest.mark.parametrize("top_p", [1.0, 0.9], ids=["plain-in-graph", "truncated-falls-back"])
async def test_engine_samples_the_same_with_and_without_graph_sampling(tiny_model: Path, top_p: float) -> None:
    ahead = await generate_all(EmbeddedEngine(tiny_model, max_batch=4, fast=True), top_p)
    in_graph = await generate_all(EmbeddedEngine(tiny_model, max_batch=4, fast=True, lookahead=False), top_p)
    without = await generate_all(EmbeddedEngine(tiny_model, max_batch=4, fast=True, graph_sampling=False), top_p)
    assert in_graph == without
    # The look-ahead step of a burst still decodes a row that finished on the step before, so the rows after it run
    # that step in a batch one larger than without look-ahead: the same tokens, logprobs to batch-size rounding.
    for a, b in zip(ahead, in_graph, strict=True):
        assert (a[0], a[2], a[4]) == (b[0], b[2], b[4])
        assert [[t for t, _ in top] for top in a[3]] == [[t for t, _ in top] for top in b[3]]  # type: ignore[attr-defined]
        assert max(abs(x - y) for x, y in zip(a[1], b[1], strict=True)) < 1e-5  # type: ignore[call-overload]
    if top_p == 1.0:
        assert ahead[3][4] == "stop" and len(ahead[3][0]) < 40  # type: ignore[arg-type]  # the stop token case ran


def test_triton_attention_is_refused_off_cuda(tiny_model: Path) -> None:
    model, config, _ = load_model(tiny_model, torch.device("cpu"), "float32")
    with pytest.raises(ValueError, match="attention='triton' cannot run here: device cpu is not CUDA"):
        StaticDecoder(model, config, slots=2, max_len=64, compute_dtype=torch.float32, use_graphs=False,
                      attention="triton")
    assert StaticDecoder(model, config, slots=2, max_len=64, compute_dtype=torch.float32,
                         use_graphs=False).triton_attention is False
    with pytest.raises(ConfigError, match="cannot run here"):
        EmbeddedEngine(tiny_model, max_batch=2, fast=True, decode_attention="triton")
