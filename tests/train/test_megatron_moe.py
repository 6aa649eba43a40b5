"""The Megatron backend on the real tiny Qwen3-MoE (CPU, fp32, megatron-core's MoE layer): the same logprobs
and the same optimizer step as the torch backend, with free routing and with R3 routing replay.

The replayed routes here are drawn at random (distinct experts per layer), far from what either router would
choose: replay then changes the logprobs a lot, so two backends agreeing on them shows both replay, and
replay, not the routers, decides the experts. ``test_routing_replay.py`` has the engine-captured routes.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
import torch

from lego_rl.errors import ConfigError
from lego_rl.serving.engine import EmbeddedEngine
from lego_rl.serving.tiny_model import MOE_SHAPE, ensure_tiny_model
from lego_rl.train.backend import TrainerBackend
from lego_rl.train.losses import LossConfig, make_loss
from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings
from support.numerics import forward_tolerance

pytest.importorskip("megatron.core", reason="megatron-core is not installed (the `megatron` extra)")

from lego_rl.train.megatron_backend import MegatronBackend, MegatronTrainSettings  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from megatron_steps import fixed_step, routed  # noqa: E402

E, K, LAYERS = int(MOE_SHAPE["num_experts"]), int(MOE_SHAPE["num_experts_per_tok"]), 4


@pytest.fixture(scope="module")
def moe_model() -> Path:
    return ensure_tiny_model(moe=True)


@pytest.fixture(scope="module")
def vocab(moe_model: Path) -> int:
    return int(json.loads((moe_model / "config.json").read_text())["vocab_size"])


def megatron(model: Path, **kw: object) -> MegatronBackend:
    return MegatronBackend(model, MegatronTrainSettings(**{"lr": 1e-3, "device": "cpu", **kw}))


def torch_backend(model: Path, **kw: object) -> TorchBackend:
    return TorchBackend(model, TorchTrainSettings(**{"lr": 1e-3, "device": "cpu", **kw}))


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def replaying(moe_model: Path) -> tuple[MegatronBackend, TorchBackend]:
    return megatron(moe_model, routing_replay=True), torch_backend(moe_model, routing_replay=True)


def test_moe_logprobs_equal_the_torch_backend_free_and_replayed(
        moe_model: Path, vocab: int, replaying: tuple[MegatronBackend, TorchBackend]) -> None:
    step = routed(fixed_step(vocab), seed=0)
    free_m, free_t = megatron(moe_model), torch_backend(moe_model)
    # Two implementations of the same fp32 forward: forward noise at |logit| / T (MoE tiny model: |logit| < 7).
    for kw in ({"temperature": 1.0}, {"temperature": 0.7, "top_p": 0.9}):
        tol = forward_tolerance(kw["temperature"])
        assert max_diff(free_m.compute_logprobs(step.micro_batches, **kw),  # type: ignore[arg-type]
                        free_t.compute_logprobs(step.micro_batches, **kw)) < tol, kw  # type: ignore[arg-type]
    mega, ref = replaying
    a = mega.compute_logprobs(step.micro_batches, temperature=1.0)
    b = ref.compute_logprobs(step.micro_batches, temperature=1.0)
    assert max_diff(a, b) < forward_tolerance(1.0)
    # Random routes are far from the routers' own choice: replay must show in the numbers.
    assert max_diff(a, free_m.compute_logprobs(step.micro_batches, temperature=1.0)) > 0.05


def test_moe_step_with_replay_moves_weights_like_the_torch_backend(moe_model: Path, vocab: int) -> None:
    step = routed(fixed_step(vocab, seed=1), seed=1)
    cfg = LossConfig(algorithm="gspo", is_correction="tis")
    # Megatron's recompute needs CUDA's RNG state (not on this CPU); the torch side recomputes, so replay through
    # a recomputed backward is checked against a plain one.
    backends: list[TrainerBackend] = [megatron(moe_model, routing_replay=True),
                                      torch_backend(moe_model, routing_replay=True, gradient_checkpointing=True)]
    before = {n: t.detach().clone() for n, t in backends[1].export_weights()}
    results, moved = [], []
    for b in backends:
        old = b.compute_logprobs(step.micro_batches, temperature=0.8)
        results.append(b.train_step(step, make_loss(cfg), old_logprobs=old, temperature=0.8))
        moved.append({n: t.detach() - before[n] for n, t in b.export_weights()})
    a, b = results
    for key in ("loss", "grad_norm", "tokens"):
        assert a.metrics[key] == pytest.approx(b.metrics[key], rel=1e-4, abs=1e-6), key
    routers = [n for n in before if n.endswith("mlp.gate.weight")]
    assert len(routers) == LAYERS
    for name in before:
        if moved[1][name].norm() == 0:  # an expert no replayed route names gets no gradient on either side
            assert moved[0][name].norm() == 0, name
            continue
        # Adam's first step amplifies fp32 noise in tiny gradients: compare each update as a whole.
        assert float((moved[0][name] - moved[1][name]).norm() / moved[1][name].norm()) < 2e-2, name
    assert all(moved[0][n].norm() > 0 for n in routers)  # the routers learn through the replayed weights

    # Weight sync: the Megatron export is the engine's own layout (stacked experts under transformers 5).
    engine = EmbeddedEngine(moe_model)
    copied = asyncio.run(engine.update_weights(backends[0].export_weights(), 1))
    assert copied > 0
    mine = dict(backends[0].export_weights())
    for name, p in engine.model.named_parameters():
        assert torch.equal(p.detach(), mine[name]), name


def test_replay_refusals(moe_model: Path, vocab: int, replaying: tuple[MegatronBackend, TorchBackend]) -> None:
    mega, _ = replaying
    step = routed(fixed_step(vocab, seed=2), seed=2)
    mb = step.micro_batches[0]
    assert mb.routed_experts is not None
    mb.routed_experts[3, 1, 0] = E
    with pytest.raises(ValueError, match=f"expert {E} but the model has {E} experts"):
        mega.compute_logprobs([mb], temperature=1.0)
    bare = fixed_step(vocab, seed=2).micro_batches[0]
    with pytest.raises(ValueError, match="carry no routed experts"):
        mega.compute_logprobs([bare], temperature=1.0)
    with pytest.raises(ConfigError, match="needs a mixture-of-experts model"):
        megatron(ensure_tiny_model(), routing_replay=True)


def test_router_backward_works_under_autocast(replaying: tuple[MegatronBackend, TorchBackend]) -> None:
    """megatron-core's router linear fails in backward under autocast (its forward comes out bf16, its backward
    multiplies by the fp32 weight: the H200 MoE step died on it); the backend runs it with autocast off in fp32.
    CPU autocast shows the same failure, so it is checked here, router by router, against megatron's own."""
    from lego_rl.train.megatron_model import cpu_device_shim

    router = replaying[0].model.decoder.layers[0].mlp.router
    x = torch.randn(5, 1, router.weight.shape[1], requires_grad=True)  # [T, B, H]
    with cpu_device_shim(torch.device("cpu")):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ours = router.gating(x)  # [T*B, E]
        ours.float().sum().backward()
        assert ours.dtype == torch.float32 and router.weight.grad is not None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            theirs = type(router).gating(router, x)
        with pytest.raises(RuntimeError, match="same dtype"):
            theirs.float().sum().backward()
    router.weight.grad = None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="megatron's recompute keeps CUDA RNG state: run on the H200")
def test_replay_holds_through_megatron_recompute(moe_model: Path, vocab: int) -> None:
    """Full recomputation re-runs every router in backward; with the replayed routes kept set it must give the
    step a plain backward gives (random routes: a free re-route would change the gradients completely)."""
    step = routed(fixed_step(vocab, seed=3), seed=3)
    results = []
    for recompute in (False, True):
        b = megatron(moe_model, device="cuda", bf16=False, routing_replay=True, gradient_checkpointing=recompute)
        old = b.compute_logprobs(step.micro_batches, temperature=1.0)
        r = b.train_step(step, make_loss(LossConfig()), old_logprobs=old, temperature=1.0)
        results.append((r.metrics, {n: t.detach().cpu().clone() for n, t in b.export_weights()}))
    (plain, w_plain), (recomputed, w_rec) = results
    assert recomputed["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-5)
    assert recomputed["loss"] == pytest.approx(plain["loss"], rel=1e-5, abs=1e-7)
    assert max(float((w_plain[n] - w_rec[n]).abs().max()) for n in w_plain) < 1e-5
