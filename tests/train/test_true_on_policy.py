"""train.true_on_policy on CPU: the embedded engine's sampled-token logprobs and the torch trainer's recomputation
are bit-identical (``torch.equal``), before and after a weight sync. Real engine, real backend, the tiny model; the
ops' batch invariance itself is checked on small tensors first."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from lego_rl.cli.main import app
from lego_rl.runstore.log import follow_metrics
from lego_rl.serving import batch_invariant as bi
from lego_rl.serving.engine import EmbeddedEngine
from lego_rl.serving.tiny_model import ensure_tiny_model
from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings
from support.numerics import pinned_cpu_math
from support.toy_run import scrub_config_env, write_toy_run
from support.true_on_policy import assert_identical, check_across_sync, generate, trainer_and_engine

TEMPERATURE = 0.8
# The first prompt crosses a 64-key block of the attention reduction; the rows leave the batch at different steps.
PROMPTS = [[1, 10, 72, 105, 300, 12] * 11, [5, 6, 7], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18]]
MAX_TOKENS = [16, 8, 12]


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


@pytest.mark.slow
async def test_engine_and_trainer_logprobs_are_bit_identical_across_a_weight_sync(tiny: Path) -> None:
    engine = EmbeddedEngine(tiny, max_batch=4, true_on_policy=True)
    assert engine._static is not None and engine._static.invariant
    backend = TorchBackend(tiny, TorchTrainSettings(lr=1e-3, device="cpu", true_on_policy=True))
    await engine.start()
    try:
        checked = await check_across_sync(engine, backend, PROMPTS, MAX_TOKENS, TEMPERATURE)
        assert checked.tokens == 2 * sum(MAX_TOKENS) + 3 * 8
    finally:
        await engine.stop()


@pytest.mark.slow
async def test_the_default_trainer_is_not_bit_identical(tiny: Path) -> None:
    """The check has teeth: the default trainer (BLAS matmuls, SDPA) computes the same function at rounding level,
    and the bit-for-bit comparison sees it."""
    engine = EmbeddedEngine(tiny, max_batch=4, true_on_policy=True)
    await engine.start()
    try:
        rollouts = await generate(engine, PROMPTS, MAX_TOKENS, "d", TEMPERATURE)
    finally:
        await engine.stop()
    default = TorchBackend(tiny, TorchTrainSettings(lr=1e-3, device="cpu"))
    with pytest.raises(AssertionError, match="logprobs differ"):
        assert_identical(trainer_and_engine(default, rollouts, TEMPERATURE))


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    scrub_config_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    # Staleness 0: every trained token was sampled by the weights the trainer holds (the second step's after a sync).
    yield write_toy_run(tmp_path, rollout={"max_staleness": 0}, train={"true_on_policy": True},
                        paths={"run_root": "runs/tops"})


@pytest.mark.slow
def test_lego_train_reads_max_abs_diff_zero(toy: Path) -> None:
    """The whole chain: config → engine and trainer in this mode → HTTP → samples → packing → the loop's
    consistency figures, which read exactly 0 on every trained step."""
    res = CliRunner().invoke(app, ["train", "-c", "lego.toml", "--json"])
    assert res.exit_code == 0, res.output
    rows = [r.values for r in follow_metrics(toy / "runs" / "tops" / "metrics.jsonl").read()]
    trained = [v for v in rows if "consistency/max_abs_diff" in v]
    assert trained, rows
    for v in trained:
        assert v["consistency/tokens"] > 0 and v["consistency/max_abs_diff"] == 0.0, v
        assert v["consistency/k3_kl"] == 0.0, v
