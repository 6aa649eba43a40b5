"""Expert parallelism in the Megatron backend: two gloo ranks under torchrun (EP = DP = 2, each holding half
the tiny Qwen3-MoE's experts, megatron-core's all-gather dispatcher) against one process (EP = 1) on the same
weights, fp32 on CPU.

The step's micro-batches split unevenly over the two ranks (an odd count, all of different lengths), so the
ranks must pad their rounds to run the dispatcher's equal-size collectives: the numbers show that padding
changes nothing. ``megatron_ep_ranks.py`` is the rank side.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from lego_rl.errors import ConfigError
from lego_rl.serving.tiny_model import MOE_SHAPE, ensure_tiny_model
from lego_rl.train.losses import LossConfig, make_loss
from support.numerics import forward_tolerance

pytest.importorskip("megatron.core", reason="megatron-core is not installed (the `megatron` extra)")

from lego_rl.train.megatron_backend import MegatronBackend, MegatronTrainSettings  # noqa: E402

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from megatron_ep_ranks import STEP  # noqa: E402
from megatron_steps import fixed_step, routed  # noqa: E402

E = int(MOE_SHAPE["num_experts"])


@pytest.fixture(scope="module")
def moe_model() -> Path:
    return ensure_tiny_model(moe=True)


@pytest.fixture(scope="module")
def vocab(moe_model: Path) -> int:
    return int(json.loads((moe_model / "config.json").read_text())["vocab_size"])


def run_ranks(moe_model: Path, out: Path, *, world: int, ep: int, pp: int = 1) -> dict[str, Any]:
    """``megatron_ep_ranks.py`` on ``world`` gloo ranks with expert parallel size ``ep`` and ``pp`` pipeline
    stages: rank 0's results."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    with socket.socket() as sock:  # torchrun's --master-port 0 hangs the workers' rendezvous (torch 2.13)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world), "--master-addr",
           "127.0.0.1", "--master-port", str(port), str(HERE / "megatron_ep_ranks.py"), str(moe_model), str(out),
           str(ep), str(pp)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got: dict[str, Any] = torch.load(out / "rank0.pt", weights_only=True)
    return got


@pytest.fixture(scope="module")
def ranks(moe_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """Two ranks, EP = DP = 2: rank 0's results and the output directory."""
    out = tmp_path_factory.mktemp("ep")
    return run_ranks(moe_model, out, world=2, ep=2), out


def one_process(model: Path, **kw: object) -> MegatronBackend:
    return MegatronBackend(model, MegatronTrainSettings(**{"lr": 1e-3, "device": "cpu", **kw}))


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def test_the_step_splits_unevenly_over_two_ranks(vocab: int) -> None:
    lengths = [mb.num_tokens for mb in fixed_step(vocab, **STEP).micro_batches]  # type: ignore[arg-type]
    assert len(lengths) % 2 == 1 and len(lengths) >= 3, lengths  # rank 1 runs one micro-batch fewer
    assert len(set(lengths)) == len(lengths), lengths  # every round pads one rank


@pytest.mark.slow  # torchrun ranks, as the other multi-rank Megatron tests
def test_ep2_holds_half_the_experts_per_rank(ranks: tuple[dict[str, Any], Path]) -> None:
    _, out = ranks
    for rank in (0, 1):
        names = json.loads((out / f"names{rank}.json").read_text())
        experts = {int(n.split(".")[6]) for n in names if ".local_experts." in n}
        assert experts == set(range(rank * E // 2, (rank + 1) * E // 2)), (rank, experts)
        assert "decoder.layers.0.mlp.router.weight" in names  # the router is dense: every rank has it


@pytest.mark.slow  # torchrun ranks, as the other multi-rank Megatron tests
def test_ep2_export_before_training_is_the_hf_file(moe_model: Path, ranks: tuple[dict[str, Any], Path]) -> None:
    from safetensors.torch import load_file

    got, _ = ranks
    hf = load_file(str(next(moe_model.glob("*.safetensors"))))
    initial: dict[str, torch.Tensor] = got["initial"]
    stacked = 0
    for name, t in initial.items():
        if name.endswith("mlp.experts.gate_up_proj"):  # the engine's layout (transformers >= 5): [E, 2F, H]
            base = name.removesuffix("gate_up_proj")
            want = torch.stack([torch.cat([hf[f"{base}{e}.gate_proj.weight"], hf[f"{base}{e}.up_proj.weight"]])
                                for e in range(E)])
            stacked += 1
        elif name.endswith("mlp.experts.down_proj"):  # [E, H, F]
            base = name.removesuffix("down_proj")
            want = torch.stack([hf[f"{base}{e}.down_proj.weight"] for e in range(E)])
        else:
            want = hf[name]
        assert torch.equal(t, want), name
    assert stacked == 4 or not stacked  # transformers < 5 exports the per-expert names, compared one by one


@pytest.mark.slow  # torchrun ranks, as the other multi-rank Megatron tests
def test_ep2_logprobs_and_step_equal_one_process(moe_model: Path, vocab: int,
                                                 ranks: tuple[dict[str, Any], Path]) -> None:
    got, _ = ranks
    step = fixed_step(vocab, **STEP)  # type: ignore[arg-type]
    one = one_process(moe_model)
    plain = one.compute_logprobs(step.micro_batches, temperature=0.7)
    # The ranks run each expert on other token counts (other matmul shapes): forward noise at |logit| / T
    # (the MoE tiny model's logits are below 7, as the dense one's).
    assert max_diff(got["plain"], plain) < forward_tolerance(0.7)
    assert [t.shape for t in got["plain"]] == [t.shape for t in plain]  # the padding is cut off again
    nucleus = one.compute_logprobs(step.micro_batches, temperature=0.7, top_p=0.9, top_k=50)
    assert max_diff(got["nucleus"], nucleus) < forward_tolerance(0.7)
    before = {n: t.clone() for n, t in one.export_weights()}
    result = one.train_step(step, make_loss(LossConfig(algorithm="gspo")), old_logprobs=plain, temperature=0.7)
    for key in ("loss", "grad_norm", "tokens"):
        assert got["metrics"][key] == pytest.approx(result.metrics[key], rel=1e-5, abs=1e-7), key
    after = dict(one.export_weights())
    assert sorted(after) == sorted(got["weights"])
    for name, t in after.items():
        moved, moved_ep = t - before[name], got["weights"][name] - before[name]
        assert moved.norm() > 0, name  # every weight trains, every expert included
        assert float((moved_ep - moved).norm() / moved.norm()) < 1e-3, name


@pytest.mark.slow  # torchrun ranks, as the other multi-rank Megatron tests
@pytest.mark.parametrize("pp", [1, 2], ids=["dp4", "pp2"])
def test_ep2_over_four_ranks(moe_model: Path, vocab: int, tmp_path: Path, pp: int) -> None:
    """Four ranks, EP = 2. With PP = 1 (DP = 4) each expert lives on two ranks (an expert-data-parallel pair whose
    gradients are summed), the micro-batches split 2/1/1/1; with PP = 2 (DP = 2) each stage's experts are split
    and its export and checkpoint gather them before sending to rank 0. The step (GSPO with a KL term to a frozen
    reference, itself expert-parallel) equals one process's, a resume from the checkpoint holds the same weights,
    and one optimizer shard is written per (PP, EP) rank."""
    got = run_ranks(moe_model, tmp_path, world=4, ep=2, pp=pp)
    step = fixed_step(vocab, **STEP)  # type: ignore[arg-type]
    one = one_process(moe_model, reference_model=True)
    plain = one.compute_logprobs(step.micro_batches, temperature=0.7)
    assert max_diff(got["plain"], plain) < forward_tolerance(0.7)  # other expert batch shapes, as above
    before = {n: t.clone() for n, t in one.export_weights()}
    result = one.train_step(step, make_loss(LossConfig(algorithm="gspo", kl_coef=0.1)), old_logprobs=plain,
                            temperature=0.7)
    for key in ("loss", "grad_norm"):
        assert got["metrics"][key] == pytest.approx(result.metrics[key], rel=1e-5, abs=1e-7), key
    for name, t in one.export_weights():
        moved = t - before[name]
        assert float((got["weights"][name] - before[name] - moved).norm() / moved.norm()) < 1e-3, name
    assert all(torch.equal(got["reloaded"][n], t) for n, t in got["weights"].items())
    assert all(torch.equal(got["initial"][n], t) for n, t in before.items())  # every expert, every stage
    shards = sorted(p.name for p in (tmp_path / "ckpt").glob("trainer_state*"))
    stages = [""] if pp == 1 else ["pp0.", "pp1."]
    assert shards == [f"trainer_state.{s}ep{e}.tp0.pt" for s in stages for e in (0, 1)]


@pytest.mark.slow  # torchrun ranks, as the other multi-rank Megatron tests
def test_ep2_checkpoint_round_trip(ranks: tuple[dict[str, Any], Path], moe_model: Path) -> None:
    got, out = ranks
    from safetensors.torch import load_file

    assert got["extra"] == {"step": 1}
    shards = sorted(p.name for p in (out / "ckpt").glob("trainer_state*"))
    assert shards == ["trainer_state.ep0.tp0.pt", "trainer_state.ep1.tp0.pt"]  # one per expert-parallel rank
    marker = json.loads((out / "ckpt" / "lego_checkpoint.json").read_text())
    assert marker["expert_parallel"] == 2
    saved = load_file(str(out / "ckpt" / "model.safetensors"))
    assert set(saved) == set(load_file(str(next(moe_model.glob("*.safetensors")))))  # every expert, HF names
    a, b = got["next"]
    assert a == b  # the resumed backend takes the same next step, bit for bit
    assert got["equal"] == got["names"]
    # Another expert-parallel size is refused (the optimizer shards hold other experts).
    with pytest.raises(ConfigError, match="written with expert parallel 2; this trainer runs 1"):
        one_process(moe_model).load_checkpoint(out / "ckpt")


@pytest.mark.slow  # torchrun ranks, as the other multi-rank Megatron tests
def test_ep2_replays_routes_like_one_process(moe_model: Path, vocab: int,
                                             ranks: tuple[dict[str, Any], Path]) -> None:
    got, _ = ranks
    step = routed(fixed_step(vocab, **STEP), seed=0)  # type: ignore[arg-type]
    one = one_process(moe_model, routing_replay=True)
    replayed = one.compute_logprobs(step.micro_batches, temperature=1.0)
    assert max_diff(got["replayed"], replayed) < forward_tolerance(1.0)  # other expert batch shapes, as above
    free = one_process(moe_model).compute_logprobs(step.micro_batches, temperature=1.0)
    assert max_diff(got["replayed"], free) > 0.05  # random routes: replay shows in the numbers
    # A step under replay (padding positions have no route: they take experts 0..k-1 and train nothing).
    before = {n: t.clone() for n, t in one.export_weights()}
    result = one.train_step(step, make_loss(LossConfig()), old_logprobs=replayed, temperature=1.0)
    for key in ("loss", "grad_norm"):
        assert got["replay_metrics"][key] == pytest.approx(result.metrics[key], rel=1e-5, abs=1e-7), key
    for name, t in one.export_weights():
        moved = t - before[name]
        diff = float((got["replay_weights"][name] - before[name] - moved).norm())
        assert diff <= 1e-3 * float(moved.norm()) + 1e-7, name  # an expert no replayed route names stays put


def test_expert_parallel_refusals(moe_model: Path) -> None:
    with pytest.raises(ConfigError, match="needs a mixture-of-experts model; this one is dense"):
        one_process(ensure_tiny_model(), expert_parallel=2)
    with pytest.raises(ConfigError, match=f"expert_parallel = 3 does not divide the model's {E} experts"):
        one_process(moe_model, expert_parallel=3)
    with pytest.raises(ConfigError, match="tensor_parallel = 2 with a mixture-of-experts model"):
        one_process(moe_model, expert_parallel=2, tensor_parallel=2)
    with pytest.raises(ConfigError, match="tensor_parallel = 2 with a mixture-of-experts model.*sequence_parallel"):
        one_process(moe_model, tensor_parallel=2)  # megatron-core would raise in the first training forward
    with pytest.raises(ConfigError, match="expert_parallel = 2 with train.tensor_parallel = 2 is not built"):
        one_process(moe_model, expert_parallel=2, tensor_parallel=2, sequence_parallel=True)
    with pytest.raises(ConfigError, match="expert_parallel = 2 does not divide the data-parallel size 1"):
        one_process(moe_model, expert_parallel=2)
