"""The Megatron backend on the real tiny Qwen3 model (CPU, fp32, megatron-core): the same logprobs, the same
optimizer step and the same weights as the torch backend; checkpoints; TP=2 × DP=2 over four gloo ranks.

megatron-core runs on CPU for forward and backward (``megatron_model.cpu_device_shim``); the backend's
optimizer is torch's AdamW, so whole training steps run here too.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from lego_rl.errors import ConfigError
from lego_rl.serving.tiny_model import ensure_tiny_model
from lego_rl.serving.weights import load_checkpoint_into, load_model
from lego_rl.train.backend import TrainerBackend
from lego_rl.train.losses import LossConfig, make_loss
from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings
from support.numerics import forward_tolerance, pinned_cpu_math

pytest.importorskip("megatron.core", reason="megatron-core is not installed (the `megatron` extra)")

from lego_rl.train.megatron_backend import MegatronBackend, MegatronTrainSettings  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from megatron_steps import fixed_step  # noqa: E402

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def tiny_model() -> Path:
    return ensure_tiny_model()


@pytest.fixture(scope="module")
def vocab(tiny_model: Path) -> int:
    return int(json.loads((tiny_model / "config.json").read_text())["vocab_size"])


def megatron(model: Path, **kw: object) -> MegatronBackend:
    return MegatronBackend(model, MegatronTrainSettings(**{"lr": 1e-3, "device": "cpu", **kw}))


def torch_backend(model: Path, **kw: object) -> TorchBackend:
    return TorchBackend(model, TorchTrainSettings(**{"lr": 1e-3, "device": "cpu", **kw}))


@pytest.fixture
def one_thread() -> Iterator[None]:
    """The in-process side of a comparison with rank subprocesses (``OMP_NUM_THREADS=1`` in their env) runs on
    one thread too: the same kernels in the same order as the ranks, so the bit-identity claims (a pipeline
    stage boundary rounds nothing) hold on any core count."""
    with pinned_cpu_math(1):
        yield


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def train(backend: TrainerBackend, step, cfg: LossConfig, temperature: float = 1.0, **kw):  # type: ignore[no-untyped-def]
    old = backend.compute_logprobs(step.micro_batches, temperature=temperature, **kw)
    return backend.train_step(step, make_loss(cfg), old_logprobs=old, temperature=temperature, **kw)


def weights(backend: TrainerBackend) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in backend.export_weights()}


def test_logprobs_equal_the_torch_backend(tiny_model: Path, vocab: int) -> None:
    step = fixed_step(vocab)
    assert len(step.micro_batches) >= 2 and any(len(mb.sample_indices) > 1 for mb in step.micro_batches)
    mega, ref = megatron(tiny_model), torch_backend(tiny_model)
    assert isinstance(mega, TrainerBackend)
    for kw in ({"temperature": 1.0}, {"temperature": 0.7}, {"temperature": 0.7, "top_p": 0.9},
               {"temperature": 1.0, "top_k": 20}, {"temperature": 0.0, "top_p": 0.5}):
        a = mega.compute_logprobs(step.micro_batches, **kw)  # type: ignore[arg-type]
        b = ref.compute_logprobs(step.micro_batches, **kw)  # type: ignore[arg-type]
        assert [t.shape for t in a] == [t.shape for t in b]
        # Two implementations of the same fp32 forward: forward noise at |logit| / T.
        assert max_diff(a, b) < forward_tolerance(kw["temperature"]), kw
    starts = step.micro_batches[0].cu_seqlens[:-1].long()
    assert not a[0][starts].any()  # a segment's first token has no prediction


def test_exported_weights_are_the_checkpoint_in_hf_layout(tiny_model: Path) -> None:
    from safetensors.torch import load_file

    mega = megatron(tiny_model)
    exported = weights(mega)
    on_disk = load_file(str(tiny_model / "model.safetensors"))
    assert exported.keys() == on_disk.keys()  # tied: embed_tokens once, no lm_head, as the torch backend
    assert all(torch.equal(exported[n], on_disk[n]) for n in on_disk)
    assert {n for n, _ in torch_backend(tiny_model).export_weights()} == exported.keys()


@pytest.mark.parametrize("cfg", [LossConfig(), LossConfig(algorithm="gspo", is_correction="tis", kl_coef=0.1)],
                         ids=["ppo", "gspo-tis-kl"])
def test_one_step_changes_weights_like_the_torch_backend(tiny_model: Path, vocab: int, cfg: LossConfig) -> None:
    step = fixed_step(vocab, seed=1)
    kl = cfg.kl_coef > 0
    mega, ref = megatron(tiny_model, reference_model=kl), torch_backend(tiny_model, reference_model=kl)
    before = weights(ref)
    a = train(mega, step, cfg, temperature=0.8, top_p=0.95)
    b = train(ref, step, cfg, temperature=0.8, top_p=0.95)
    assert a.weight_version == b.weight_version == 1
    for key in ("loss", "grad_norm", "entropy", "tokens", "lr"):
        # Sums over the step's tokens and gradients of two fp32 forwards/backwards: 1e-4 relative is ~840 ulps,
        # well above their noise and far below a token or micro-batch counted wrongly.
        assert a.metrics[key] == pytest.approx(b.metrics[key], rel=1e-4, abs=1e-6), key
    wa, wb = weights(mega), weights(ref)
    for name in before:
        moved_a, moved_b = wa[name] - before[name], wb[name] - before[name]
        assert moved_b.norm() > 0, name
        # Adam's first step is lr·g/(|g|+eps): entries whose gradient is near eps amplify fp32 noise, so the
        # update is compared as a whole (relative L2) rather than entry by entry.
        assert float((moved_a - moved_b).norm() / moved_b.norm()) < 2e-2, name
    after_a = mega.compute_logprobs(step.micro_batches, temperature=0.8)
    after_b = ref.compute_logprobs(step.micro_batches, temperature=0.8)
    # After one step the two updates differ (relative 2e-2 at most, above): the logprobs move by that share
    # of an lr-sized step, so 1e-3 here, ~6x forward noise at T = 0.8.
    assert max_diff(after_a, after_b) < 1e-3


def test_checkpoint_resume_continues_bit_for_bit(tiny_model: Path, vocab: int, tmp_path: Path) -> None:
    cfg = LossConfig()
    a = megatron(tiny_model, warmup_steps=3)
    train(a, fixed_step(vocab, seed=2), cfg)
    a.save_checkpoint(tmp_path / "ckpt", extra_state={"step": 1, "cursor": [3, 1]})
    with pytest.raises(FileExistsError, match="never overwritten"):
        a.save_checkpoint(tmp_path / "ckpt", extra_state={})
    b = megatron(tiny_model, warmup_steps=3)
    assert b.load_checkpoint(tmp_path / "ckpt") == {"step": 1, "cursor": [3, 1]}
    assert b.weight_version == 1
    ra, rb = train(a, fixed_step(vocab, seed=3), cfg), train(b, fixed_step(vocab, seed=3), cfg)
    assert ra.metrics == rb.metrics and ra.weight_version == rb.weight_version == 2
    wa, wb = weights(a), weights(b)
    assert all(torch.equal(wa[n], wb[n]) for n in wa)
    # The checkpoint is a servable HF model: the engine's loader takes it as is.
    hf, _, _ = load_model(tiny_model, torch.device("cpu"), "float32")
    load_checkpoint_into(hf, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "tokenizer.json").is_file()


def test_refusals_name_the_key(tiny_model: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"pipeline_parallel = 3 does not divide the model's 4 layers") as exc:
        megatron(tiny_model, pipeline_parallel=3)
    assert exc.value.parameter == "train.pipeline_parallel"
    with pytest.raises(ConfigError, match=r"1×2 needs a multiple of 2 trainer processes, but 1 is running") as exc:
        megatron(tiny_model, pipeline_parallel=2)
    assert exc.value.parameter == "train.pipeline_parallel"
    with pytest.raises(ConfigError, match=r"tensor_parallel = 2 needs a multiple of 2 trainer processes, but 1 is"):
        megatron(tiny_model, tensor_parallel=2)
    with pytest.raises(ConfigError, match=r"data_parallel \(2\) = 2 trainer processes, but 1 is running"):
        megatron(tiny_model, data_parallel=2)
    with pytest.raises(ConfigError, match=r"tensor_parallel = 3 does not divide"):
        megatron(tiny_model, tensor_parallel=3)
    with pytest.raises(ConfigError, match=r"sequence_parallel with train.pipeline_parallel = 2 is not built") as exc:
        megatron(tiny_model, tensor_parallel=2, pipeline_parallel=2, sequence_parallel=True)
    assert exc.value.parameter == "train.sequence_parallel"
    with pytest.raises(ConfigError, match=r"routing replay needs a mixture-of-experts model; this one is dense"):
        megatron(tiny_model, routing_replay=True)
    # megatron-core recomputes under its CUDA RNG tracker: unset means off here, asking for it is refused.
    assert megatron(tiny_model, gradient_checkpointing=None).recompute is False
    with pytest.raises(ConfigError, match=r"gradient_checkpointing = true with the Megatron backend needs CUDA") as exc:
        megatron(tiny_model, gradient_checkpointing=True)
    assert exc.value.parameter == "train.gradient_checkpointing"
    # A torch-backend checkpoint has no optimizer shards for this trainer.
    t = torch_backend(tiny_model)
    t.save_checkpoint(tmp_path / "torch-ckpt", extra_state={})
    with pytest.raises(ConfigError, match="written by backend 'torch'"):
        megatron(tiny_model).load_checkpoint(tmp_path / "torch-ckpt")


def test_missing_megatron_core_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from lego_rl.train.megatron_backend import require_megatron

    monkeypatch.setitem(sys.modules, "megatron.core", None)  # import now raises ImportError
    with pytest.raises(ConfigError, match=r"lego-rl\[megatron\]"):
        require_megatron()


def run_ranks(tiny_model: Path, out: Path, *, tp: int, dp: int, pp: int = 1, sp: bool = False) -> dict[str, Any]:
    """``megatron_ranks.py`` on ``tp * dp * pp`` gloo ranks under torchrun; rank 0's results."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    with socket.socket() as sock:  # torchrun's --master-port 0 hangs the workers' rendezvous (torch 2.13)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(tp * dp * pp), "--master-addr",
           "127.0.0.1", "--master-port", str(port),
           str(HERE / "megatron_ranks.py"), str(tiny_model), str(out), str(tp), str(dp), str(pp),
           *(["sp"] if sp else [])]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got: dict[str, Any] = torch.load(out / "rank0.pt", weights_only=True)
    return got


@pytest.mark.slow
@pytest.mark.parametrize(("tp", "dp", "sp", "moe"), [(2, 2, False, False), (2, 1, True, False), (2, 1, True, True)],
                         ids=["tp2-dp2", "tp2-sequence-parallel", "moe-tp2-sequence-parallel"])
def test_tp2_dp2_over_four_ranks_equals_one_process(tiny_model: Path, vocab: int, tmp_path: Path, tp: int, dp: int,
                                                    sp: bool, moe: bool, one_thread: None) -> None:
    """Four gloo ranks (TP 2 × DP 2): vocab-parallel logprobs, the nucleus gathered across TP, micro-batches
    split over DP with summed gradients, GSPO's cross-micro-batch ratio, a checkpoint from sharded state. And
    TP 2 with sequence parallelism: micro-batches of odd length (padded to a multiple of 2), norms on half the
    sequence each with their gradients summed over TP; each weight's update must match, norms included. And the
    tiny Qwen3-MoE the same way: megatron-core trains a MoE layer under TP only with sequence parallelism (its
    experts split by TP, its router on half the sequence per rank)."""
    if moe:
        from lego_rl.serving.tiny_model import ensure_tiny_model

        tiny_model = ensure_tiny_model(moe=True)
    got = run_ranks(tiny_model, tmp_path, tp=tp, dp=dp, sp=sp)
    step = fixed_step(vocab)
    one = megatron(tiny_model)
    plain = one.compute_logprobs(step.micro_batches, temperature=0.7)
    # TP splits the matmuls (and the vocabulary) across ranks: other sums, forward noise at |logit| / T.
    assert max_diff(got["plain"], plain) < forward_tolerance(0.7)
    assert max_diff(got["nucleus"], one.compute_logprobs(step.micro_batches, temperature=0.7, top_p=0.9,
                                                         top_k=50)) < forward_tolerance(0.7)
    res = one.train_step(step, make_loss(LossConfig(algorithm="gspo")), old_logprobs=plain, temperature=0.7)
    for key in ("loss", "grad_norm", "tokens", "entropy"):
        assert got["metrics"][key] == pytest.approx(res.metrics[key], rel=1e-4, abs=1e-6), key
    init = weights(megatron(tiny_model))  # the engine's layout, as exported (the MoE's HF file stacks experts)
    mine = weights(one)
    assert got["weights"].keys() == mine.keys()
    for name, t in mine.items():
        # Summation order differs (DP, TP); Adam's first step amplifies that for near-zero gradients, so the
        # update is compared as a whole (seen: ≤ 1.2e-3 relative).
        theirs, ours = got["weights"][name] - init[name], t - init[name]
        assert float((theirs - ours).norm() / ours.norm()) < 1e-2, name
    if moe:  # the checkpoint keeps the HF file's per-expert tensors (transformers 5 stacks them on load)
        from safetensors.torch import load_file

        assert sorted(load_file(str(tmp_path / "ckpt" / "model.safetensors"))) == sorted(
            load_file(str(tiny_model / "model.safetensors")))
    else:
        hf, _, _ = load_model(tiny_model, torch.device("cpu"), "float32")
        load_checkpoint_into(hf, tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("trainer_state.tp*.pt")) == [
        "trainer_state.tp0.pt", "trainer_state.tp1.pt"]


@pytest.mark.slow
@pytest.mark.parametrize(("tp", "dp"), [(1, 1), (2, 1), (1, 2)], ids=["pp2", "pp2-tp2", "pp2-dp2"])
def test_two_pipeline_stages_equal_one_process(tiny_model: Path, vocab: int, tmp_path: Path, tp: int,
                                               dp: int, one_thread: None) -> None:
    """The tiny model's 4 layers on 2 pipeline stages (× TP 2 or × DP 2): logprobs recomputed on the last stage
    and shared, the 1F1B schedule's step (tied embedding split over the first and last stage), export and a
    checkpoint gathered on rank 0, and a resume from the per-stage shards."""
    got = run_ranks(tiny_model, tmp_path, tp=tp, dp=dp, pp=2)
    step = fixed_step(vocab)
    assert len(step.micro_batches) > 2  # more micro-batches than stages: the steady 1F1B state runs
    one = megatron(tiny_model)
    plain = one.compute_logprobs(step.micro_batches, temperature=0.7)
    nucleus = one.compute_logprobs(step.micro_batches, temperature=0.7, top_p=0.9, top_k=50)
    if tp == 1:  # a stage boundary is an fp32 message of the fp32 residual stream: nothing is rounded
        assert all(torch.equal(a, b) for a, b in zip(got["plain"], plain, strict=True))
        assert all(torch.equal(a, b) for a, b in zip(got["nucleus"], nucleus, strict=True))
    assert max_diff(got["plain"], plain) < forward_tolerance(0.7)  # TP: other sums (forward noise)
    assert max_diff(got["nucleus"], nucleus) < forward_tolerance(0.7)
    res = one.train_step(step, make_loss(LossConfig(algorithm="gspo")), old_logprobs=plain, temperature=0.7)
    for key in ("loss", "grad_norm", "tokens", "entropy"):
        assert got["metrics"][key] == pytest.approx(res.metrics[key], rel=1e-4, abs=1e-6), key
    from safetensors.torch import load_file

    init = load_file(str(tiny_model / "model.safetensors"))
    # Before training, rank 0's export (both stages' layers, gathered) is the HF checkpoint bit for bit.
    assert got["initial"].keys() == init.keys()
    assert all(torch.equal(got["initial"][n], init[n]) for n in init)
    mine = weights(one)
    assert got["weights"].keys() == mine.keys()
    for name, t in mine.items():
        theirs, ours = got["weights"][name] - init[name], t - init[name]
        assert float((theirs - ours).norm() / ours.norm()) < 1e-2, name
    # The checkpoint holds what was exported after the step, one trainer-state shard per stage and TP rank.
    saved = load_file(str(tmp_path / "ckpt" / "model.safetensors"))
    assert saved.keys() == got["weights"].keys()
    assert all(torch.equal(saved[n], got["weights"][n]) for n in saved)
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("trainer_state.*.pt")) == [
        f"trainer_state.pp{s}.tp{r}.pt" for s in range(2) for r in range(tp)]
    resumed = got["resumed"]
    assert resumed["extra"] == {"step": 1} and resumed["versions"] == (2, 2)
    assert resumed["metrics"][0] == resumed["metrics"][1]  # the resumed backend steps exactly like the original
    assert resumed["equal"] == resumed["names"] == sorted(init)
    why = "written with pipeline parallel 2; this trainer runs 1 stages" if tp == 1 else "with tensor parallel 2"
    with pytest.raises(ConfigError, match=why):
        one.load_checkpoint(tmp_path / "ckpt")


def untied_copy(tiny_model: Path, out: Path) -> Path:
    """The tiny model with its own output layer (``tie_word_embeddings`` false, ``lm_head.weight`` a perturbed
    copy of the embedding): on two stages the last one loads ``lm_head``, not the embedding."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(tiny_model, out)
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}))
    w = load_file(str(out / "model.safetensors"))
    noise = torch.randn(w["model.embed_tokens.weight"].shape, generator=torch.Generator().manual_seed(5))
    w["lm_head.weight"] = w["model.embed_tokens.weight"] + 0.02 * noise  # [V, H]
    save_file(w, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("model", "pp", "flags"), [("moe", 2, "replay,kl"), ("dense", 4, "kl"), ("untied", 2, "")],
                         ids=["moe-r3-kl-pp2", "kl-pp4", "untied-pp2"])
def test_pipeline_variants_equal_one_process(tiny_model: Path, tmp_path: Path, model: str, pp: int,
                                             flags: str, one_thread: None) -> None:
    """Qwen3-MoE with R3 replay (each stage replays its own layers' routes) and a reference model for the KL
    term; four stages of one layer each (two middle stages, the tied embedding split over the first and the
    last); an untied output layer on the last stage. Two steps each, against the same in one process."""
    from megatron_pipeline_ranks import run_variant

    path = {"moe": lambda: ensure_tiny_model(moe=True), "dense": lambda: tiny_model,
            "untied": lambda: untied_copy(tiny_model, tmp_path / "untied")}[model]()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(pp), "--master-addr", "127.0.0.1",
           "--master-port", str(port), str(HERE / "megatron_pipeline_ranks.py"), str(path), str(tmp_path), str(pp),
           "1", flags]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = torch.load(tmp_path / "rank0.pt", weights_only=True)
    one = run_variant(path, flags={f for f in flags.split(",") if f})
    assert all(torch.equal(a, b) for a, b in zip(got["old"], one["old"], strict=True))
    for mine, theirs in zip(got["metrics"], one["metrics"], strict=True):
        assert mine.keys() == theirs.keys()
        for key in mine:
            assert mine[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), key
    assert ("kl" in got["metrics"][1]) == ("kl" in flags)
    assert got["weights"].keys() == one["weights"].keys()
    for name, t in one["weights"].items():
        assert float((got["weights"][name] - t).norm()) <= 1e-4 * float(t.norm()), name
    assert max_diff(got["new"], one["new"]) < 1e-3
    if model == "untied":
        head, embed = got["weights"]["lm_head.weight"], got["weights"]["model.embed_tokens.weight"]
        assert not torch.equal(head, embed)
