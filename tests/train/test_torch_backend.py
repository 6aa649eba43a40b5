"""The torch backend on the real tiny model (CPU, fp32): packed logprobs, optimizer steps, checkpoints."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from lego_rl.errors import ConfigError, TrainerOutOfMemory
from lego_rl.serving.logprobs import teacher_forced_logprobs
from lego_rl.serving.tiny_model import ensure_tiny_model
from lego_rl.serving.weights import load_model
from lego_rl.train.backend import LossInputs, LossOutput, TrainerBackend
from lego_rl.train.batching import OptimizerStep, plan_steps
from lego_rl.train.checkpoint import MARKER
from lego_rl.train.losses import LossConfig, make_loss
from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings
from lego_rl.trajectory.sample import Sample
from support.numerics import forward_tolerance, pinned_cpu_math, rounding_tolerance


@pytest.fixture(scope="module")
def tiny_model() -> Path:
    return ensure_tiny_model()


@pytest.fixture(scope="module")
def vocab(tiny_model: Path) -> int:
    return int(json.loads((tiny_model / "config.json").read_text())["vocab_size"])


@pytest.fixture
def pinned_threads() -> Iterator[None]:
    """For bit-for-bit comparisons: both sides split their CPU reductions the same way, whatever thread count
    the machine or an earlier test (an engine started with ``threads``) left behind."""
    with pinned_cpu_math(2):
        yield


def make_samples(
    seed: int, vocab: int, *, rollouts: int = 4, segments: int = 2
) -> tuple[list[Sample], list[float]]:
    """Rollouts of ``segments`` segments each (context then sampled tokens, lengths vary), with advantages
    of both signs. Rollout logprobs are made up (the sampler is not under test here)."""
    rng = random.Random(seed)
    samples, advantages = [], []
    for r in range(rollouts):
        adv = [1.0, -1.0, 0.5, -0.5][r % 4]
        for s in range(segments):
            context, trained = rng.randint(3, 12), rng.randint(2, 10)
            n = context + trained
            samples.append(
                Sample(
                    rollout_id=f"r{r}",
                    group_index=r // 2,
                    index=r % 2,
                    segment=s,
                    num_segments=segments,
                    tokens=[rng.randrange(vocab) for _ in range(n)],
                    loss_mask=[0] * context + [1] * trained,
                    rollout_logprobs=[0.0] * context + [-rng.uniform(0.5, 8.0) for _ in range(trained)],
                )
            )
            advantages.append(adv)
    return samples, advantages


def one_step(seed: int, vocab: int, budget: int = 48, **kw) -> OptimizerStep:
    samples, adv = make_samples(seed, vocab, **kw)
    (step,) = plan_steps(samples, adv, max_tokens_per_micro_batch=budget)
    return step


def train(
    backend: TorchBackend, step: OptimizerStep, cfg: LossConfig | None = None, temperature: float = 1.0
):
    """One on-policy step: old logprobs recomputed under the current weights, then the update."""
    old = backend.compute_logprobs(step.micro_batches, temperature=temperature)
    return backend.train_step(step, make_loss(cfg or LossConfig()), old_logprobs=old, temperature=temperature)


def settings(**kw) -> TorchTrainSettings:
    return TorchTrainSettings(**{"lr": 1e-3, "device": "cpu", **kw})


def params(backend: TorchBackend) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in backend.export_weights()}


def test_implements_the_contract(tiny_model):
    assert isinstance(TorchBackend(tiny_model, settings()), TrainerBackend)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_packed_logprobs_equal_each_segment_scored_alone(tiny_model, vocab, temperature):
    backend = TorchBackend(tiny_model, settings())
    samples, adv = make_samples(3, vocab, rollouts=3, segments=2)
    (step,) = plan_steps(samples, adv, max_tokens_per_micro_batch=10_000)
    (mb,) = step.micro_batches  # all six segments packed into one row
    assert len(mb.cu_seqlens) == 7
    (lp,) = backend.compute_logprobs([mb], temperature=temperature)
    cu = mb.cu_seqlens.tolist()
    for k, i in enumerate(mb.sample_indices):
        seg = samples[i].tokens
        alone = teacher_forced_logprobs(backend.model, seg, 1, temperature)  # [len - 1]
        assert lp[cu[k]].item() == 0.0  # a segment's first token has no prediction
        # A packed row and one segment alone run other shapes through the forward: fp32 forward noise.
        assert torch.allclose(lp[cu[k] + 1 : cu[k + 1]], alone, atol=forward_tolerance(temperature), rtol=0), \
            f"segment {k} differs"


def test_the_segment_check_can_fail_position_ids_matter(tiny_model, vocab):
    # The same packed row with positions 0..T-1 (no restarts) is one long sequence: later segments then
    # attend to earlier ones and their logprobs move. Shows the check above would catch a mask that crossed.
    backend = TorchBackend(tiny_model, settings())
    samples, adv = make_samples(3, vocab, rollouts=2, segments=1)
    (step,) = plan_steps(samples, adv, max_tokens_per_micro_batch=10_000)
    (mb,) = step.micro_batches
    (packed,) = backend.compute_logprobs([mb], temperature=1.0)
    mb.position_ids = torch.arange(mb.num_tokens)  # [T]
    (crossed,) = backend.compute_logprobs([mb], temperature=1.0)
    second = slice(int(mb.cu_seqlens[1]) + 1, mb.num_tokens)
    assert (packed[second] - crossed[second]).abs().max() > 1e-3


def test_resume_is_bit_for_bit_on_cpu(tiny_model, vocab, tmp_path, pinned_threads):
    cfg = LossConfig(is_correction="tis", is_high=2.0)
    s = settings(warmup_steps=3, weight_decay=0.01, max_grad_norm=0.5)
    steps = [one_step(seed, vocab) for seed in range(4)]

    torch.manual_seed(0)
    straight = TorchBackend(tiny_model, s)
    losses_a = [train(straight, st, cfg).metrics["loss"] for st in steps]
    after_a = torch.rand(3)  # the RNG stream continues identically after a resume

    torch.manual_seed(0)
    first = TorchBackend(tiny_model, s)
    losses_b = [train(first, st, cfg).metrics["loss"] for st in steps[:2]]
    first.save_checkpoint(tmp_path / "step-2", extra_state={"step": 2, "cursor": {"row": 17}})
    torch.manual_seed(12345)  # a fresh process would start from anything
    resumed = TorchBackend(tiny_model, s)
    assert resumed.load_checkpoint(tmp_path / "step-2") == {"step": 2, "cursor": {"row": 17}}
    assert resumed.weight_version == 2
    losses_b += [train(resumed, st, cfg).metrics["loss"] for st in steps[2:]]
    after_b = torch.rand(3)

    assert losses_a == losses_b  # exactly, not approximately
    pa, pb = params(straight), params(resumed)
    assert pa.keys() == pb.keys()
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert torch.equal(after_a, after_b)
    assert resumed.weight_version == straight.weight_version == 4


def test_parameters_change_exactly_when_some_advantage_is_nonzero(tiny_model, vocab):
    samples, _ = make_samples(5, vocab)
    (zero_step,) = plan_steps(samples, [0.0] * len(samples), max_tokens_per_micro_batch=48)
    # No weight decay: zero advantages (GRPO, no KL) give zero gradients, and AdamW moves nothing.
    backend = TorchBackend(tiny_model, settings())
    before = params(backend)
    result = train(backend, zero_step)
    assert result.metrics["grad_norm"] == 0.0 and result.weight_version == 1
    assert all(torch.equal(before[k], v) for k, v in params(backend).items())
    # One rollout with a non-zero advantage: every parameter that takes part in the forward moves.
    adv = [0.0] * len(samples)
    adv[0] = adv[1] = 1.0  # both segments of rollout r0
    (step,) = plan_steps(samples, adv, max_tokens_per_micro_batch=48)
    train(backend, step)
    changed = {k for k, v in params(backend).items() if not torch.equal(before[k], v)}
    assert changed == set(before)


def test_weight_decay_alone_shrinks_matrices_by_exactly_lr_times_decay(tiny_model, vocab):
    # With decay on, zero advantages still change parameters: only by AdamW's decoupled decay, on matrices
    # only, and by exactly the factor (1 - lr * wd). The test says so instead of claiming "unchanged".
    samples, _ = make_samples(5, vocab)
    (step,) = plan_steps(samples, [0.0] * len(samples), max_tokens_per_micro_batch=48)
    backend = TorchBackend(tiny_model, settings(weight_decay=0.1))
    before = params(backend)
    train(backend, step)
    for k, v in params(backend).items():
        expected = before[k] * (1 - 1e-3 * 0.1) if v.dim() >= 2 else before[k]
        assert torch.equal(v, expected), k


@pytest.mark.parametrize("algorithm,is_correction", [("grpo", "none"), ("gspo", "none"), ("grpo", "tis")])
def test_micro_batch_split_gives_the_same_update(tiny_model, vocab, algorithm, is_correction):
    # The same rollouts as one micro-batch or as many (segments of one rollout in different micro-batches):
    # the same loss and the same gradients, up to fp32 summation order. The old logprobs are shifted by a
    # fixed per-token offset (as after an earlier update) so ratios are not 1: GSPO's sequence ratio then
    # depends on the tokens in the other micro-batches (rollout_log_ratio_elsewhere) and clipping is active.
    # With sequence-level TIS the sampler's logprobs differ from the trainer's by another offset, and each
    # rollout's IS product spans micro-batches too (rollout_is_log_ratio_elsewhere).
    eps = 0.2 if algorithm == "grpo" else 0.02  # GSPO clips a mean log-ratio: much tighter, as in its paper
    cfg = LossConfig(
        algorithm=algorithm,
        clip_low=eps,
        clip_high=eps,
        is_correction=is_correction,
        is_level="sequence",
        is_high=1.5,
    )
    samples, adv = make_samples(9, vocab)
    gen = torch.Generator().manual_seed(0)
    offset = [torch.randn(len(s.tokens), generator=gen) * 0.3 for s in samples]  # [n_i] per sample
    sampler = [torch.randn(len(s.tokens), generator=gen) * 0.1 for s in samples]  # [n_i] per sample
    (whole,) = plan_steps(samples, adv, max_tokens_per_micro_batch=10_000)
    (split,) = plan_steps(samples, adv, max_tokens_per_micro_batch=24)
    assert len(whole.micro_batches) == 1 and len(split.micro_batches) > 3
    results = []
    for step in (whole, split):
        backend = TorchBackend(tiny_model, settings())
        current = backend.compute_logprobs(step.micro_batches, temperature=1.0)
        old = []
        for lp, mb in zip(current, step.micro_batches, strict=True):
            old.append(lp + torch.cat([offset[i] for i in mb.sample_indices]))  # [T]
            mb.rollout_logprobs = lp + torch.cat([sampler[i] for i in mb.sample_indices])  # [T]
        result = backend.train_step(step, make_loss(cfg), old_logprobs=old, temperature=1.0)
        results.append((backend, result.metrics))
    (a, ma), (b, mb_) = results
    assert ma["clip_frac_low"] + ma["clip_frac_high"] > 0.05  # the ratios are far enough from 1 to clip
    keys = ["loss", "clip_frac_low", "clip_frac_high", "ratio_mean", "token_weight"]
    if is_correction == "tis":
        assert 0.1 < ma["tis_clamped_frac"] < 0.9  # some rollouts' products clamp, others not
        keys += ["tis_clamped_frac", "is_weight_mean"]
    # Like with like for the logprobs (old = this split's own current + offset), so the metrics differ only
    # by the order of their sums over the step's tokens (values of order 1).
    n_tokens = sum(len(s.tokens) for s in samples)
    for key in keys:
        tol = rounding_tolerance(torch.float32, magnitude=max(1.0, abs(mb_[key])), terms=n_tokens)
        assert ma[key] == pytest.approx(mb_[key], abs=tol), key
    # The gradients pass through micro-batches of other shapes (forward/backward noise, no useful worst case):
    # 1e-4 relative is ~840 fp32 ulps, far below a dropped or doubled micro-batch (>= 1/len(micro_batches)).
    assert ma["grad_norm"] == pytest.approx(mb_["grad_norm"], rel=1e-4)
    assert_same_gradients(a, b)


def assert_same_gradients(a: TorchBackend, b: TorchBackend) -> None:
    """After one step AdamW's first moment is (1 - beta1) * grad: compare the accumulated gradients through
    it (the parameters themselves amplify rounding: Adam's first update is ~lr * sign(grad))."""
    for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        ga, gb = a.optimizer.state[pa]["exp_avg"], b.optimizer.state[pb]["exp_avg"]
        # As grad_norm above: 1e-4 of the tensor's scale (~840 fp32 ulps), far below a missing contribution.
        assert torch.allclose(ga, gb, rtol=1e-4, atol=1e-9 + 1e-4 * float(ga.abs().max()))


def test_gradient_checkpointing_gives_the_same_step(tiny_model, vocab):
    step = one_step(2, vocab)
    plain = TorchBackend(tiny_model, settings())
    ckpt = TorchBackend(tiny_model, settings(gradient_checkpointing=True))
    assert ckpt.model.is_activation_checkpointing and not plain.model.is_activation_checkpointing
    ra, rb = train(plain, step), train(ckpt, step)
    # Checkpointing recomputes the same forward with the same kernels: like with like, within an ulp.
    assert ra.metrics["loss"] == pytest.approx(rb.metrics["loss"], abs=1e-7)
    assert_same_gradients(plain, ckpt)


def test_warmup_and_step_metrics(tiny_model, vocab):
    backend = TorchBackend(tiny_model, settings(warmup_steps=2, lr=2e-3))
    results = [train(backend, one_step(k, vocab)) for k in range(3)]
    assert [r.metrics["lr"] for r in results] == pytest.approx([1e-3, 2e-3, 2e-3])
    result = results[-1]
    assert {
        "loss",
        "grad_norm",
        "lr",
        "tokens",
        "clip_frac_low",
        "clip_frac_high",
        "ratio_mean",
        "entropy",
    } <= set(result.metrics)
    # The old logprobs come from the same forward (like with like): the ratio is 1 up to the mean's rounding.
    assert result.metrics["entropy"] > 0 and result.metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert result.weight_version == 3


def test_kl_to_the_frozen_reference_starts_at_zero_and_grows(tiny_model, vocab):
    cfg = LossConfig(kl_coef=0.1)
    backend = TorchBackend(tiny_model, settings(reference_model=True, lr=5e-3))
    kls = [train(backend, one_step(k, vocab), cfg).metrics["kl"] for k in range(2)]
    # Step 0: the reference is a copy run with the same kernels, so the KL is exactly 0 (like with like).
    assert kls[0] == pytest.approx(0.0, abs=1e-9) and kls[1] > 1e-5
    # Without a reference the loss names what is missing.
    with pytest.raises(ValueError, match="kl_coef=0.1 needs ref_logprobs"):
        train(TorchBackend(tiny_model, settings()), one_step(0, vocab), cfg)


def test_grad_clipping_bounds_the_update(tiny_model, vocab):
    step = one_step(1, vocab)
    clipped = TorchBackend(tiny_model, settings(max_grad_norm=1e-3))
    result = train(clipped, step)
    assert result.metrics["grad_norm"] > 1e-3  # the reported norm is the one before clipping
    grads_ok = [p.grad is None for p in clipped.model.parameters()]
    assert all(grads_ok)  # gradients are released after the step


# ----------------------------------------------------------------------------- checkpoints


def test_checkpoint_is_a_servable_hf_model_and_export_uses_hf_names(tiny_model, vocab, tmp_path):
    backend = TorchBackend(tiny_model, settings())
    train(backend, one_step(0, vocab))
    backend.save_checkpoint(tmp_path / "ckpt", extra_state={})
    assert json.loads((tmp_path / "ckpt" / MARKER).read_text())["weight_version"] == 1
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "ckpt" / name).is_file(), name
    served, _, _ = load_model(tmp_path / "ckpt", torch.device("cpu"), "float32")
    served_params = dict(served.named_parameters())
    exported = dict(backend.export_weights())
    assert exported.keys() == served_params.keys()
    assert all(torch.equal(exported[k], served_params[k]) for k in exported)
    from safetensors import safe_open

    with safe_open(str(tiny_model / "model.safetensors"), "pt") as f:
        assert set(exported) <= set(f.keys())  # the names the original HF files use


def test_checkpoints_are_never_overwritten_and_incomplete_ones_refused(tiny_model, vocab, tmp_path):
    backend = TorchBackend(tiny_model, settings())
    backend.save_checkpoint(tmp_path / "ckpt", extra_state={"step": 0})
    with pytest.raises(FileExistsError, match="ckpt already exists; it is never overwritten"):
        backend.save_checkpoint(tmp_path / "ckpt", extra_state={"step": 1})
    assert json.loads((tmp_path / "ckpt" / "extra_state.json").read_text()) == {"step": 0}
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="not a complete lego checkpoint"):
        backend.load_checkpoint(tmp_path / "empty")
    with pytest.raises(ConfigError, match="does not exist"):
        backend.load_checkpoint(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="extra_state must be JSON-serialisable"):
        backend.save_checkpoint(tmp_path / "bad", extra_state={"x": object()})
    assert not (tmp_path / "bad").exists()


def test_a_crash_while_saving_leaves_nothing_that_looks_like_a_checkpoint(tiny_model, tmp_path, monkeypatch):
    backend = TorchBackend(tiny_model, settings())

    def crash(*args, **kwargs):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        backend.save_checkpoint(tmp_path / "ckpt", extra_state={})
    assert list(tmp_path.iterdir()) == []


def test_bad_step_inputs_are_refused(tiny_model, vocab):
    backend = TorchBackend(tiny_model, settings())
    step = one_step(0, vocab)
    old = backend.compute_logprobs(step.micro_batches, temperature=1.0)
    loss = make_loss(LossConfig())
    with pytest.raises(
        ValueError, match=rf"{len(old) - 1} old_logprobs tensors for {len(old)} micro-batches"
    ):
        backend.train_step(step, loss, old_logprobs=old[:-1], temperature=1.0)
    with pytest.raises(ValueError, match=r"old_logprobs\[0\] has shape \(3,\) but micro-batch 0 has"):
        backend.train_step(step, loss, old_logprobs=[torch.zeros(3)] + old[1:], temperature=1.0)
    assert backend.weight_version == 0


def test_a_non_finite_gradient_is_not_applied(tiny_model, vocab):
    backend = TorchBackend(tiny_model, settings())
    before = params(backend)

    def nan_loss(inp: LossInputs) -> LossOutput:
        return LossOutput(loss=(inp.logprobs * float("nan")).sum())

    step = one_step(0, vocab)
    old = backend.compute_logprobs(step.micro_batches, temperature=1.0)
    with pytest.raises(
        FloatingPointError, match="gradient norm is nan at weight version 0; the step was not applied"
    ):
        backend.train_step(step, nan_loss, old_logprobs=old, temperature=1.0)
    assert backend.weight_version == 0
    assert all(torch.equal(before[k], v) for k, v in params(backend).items())
    assert not backend.optimizer.state  # no moments were recorded either


def test_cuda_asked_for_without_cuda_is_a_config_error(tiny_model):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ConfigError, match="CUDA is not available"):
        TorchBackend(tiny_model, settings(device="cuda"))


def test_dropout_is_off_so_the_ratio_starts_at_one(tmp_path, vocab):
    # A copy of the tiny model whose config asks for attention dropout: the backend turns it off, so two
    # scorings of the same tokens agree exactly (old and new logprobs of the PPO ratio).
    import shutil

    model_dir = tmp_path / "dropout-model"
    shutil.copytree(ensure_tiny_model(), model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**cfg, "attention_dropout": 0.5}))
    backend = TorchBackend(model_dir, settings())
    assert all(getattr(m, "attention_dropout", 0.0) == 0.0 for m in backend.model.modules())
    step = one_step(0, vocab)
    with torch.enable_grad():
        a = backend._token_logprobs(backend.model, step.micro_batches[0], 1.0, with_entropy=False)[0]
        b = backend._token_logprobs(backend.model, step.micro_batches[0], 1.0, with_entropy=False)[0]
    assert torch.equal(a, b)


def test_an_empty_step_is_refused(tiny_model):
    backend = TorchBackend(tiny_model, settings())
    with pytest.raises(ValueError, match=r"optimizer step over rollouts \['r0'\] has no micro-batches"):
        backend.train_step(
            OptimizerStep(["r0"], [1]), make_loss(LossConfig()), old_logprobs=[], temperature=1.0
        )


def test_varlen_attention_is_refused_off_cuda_and_auto_keeps_sdpa(tiny_model):
    with pytest.raises(ConfigError, match="packed_attention 'varlen' cannot run here: device cpu is not CUDA"):
        TorchBackend(tiny_model, settings(packed_attention="varlen"))
    backend = TorchBackend(tiny_model, settings(packed_attention="auto"))
    assert backend._varlen is False
    assert backend.model.config._attn_implementation != "lego_varlen"


def allocator_failure() -> torch.OutOfMemoryError:
    """TEST DOUBLE for the CUDA caching allocator's failure (a real one needs a GPU: the GPU test in
    test_varlen_attention_gpu.py runs one); the text is the allocator's own first line."""
    return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                                  "139 GiB")


def test_out_of_memory_in_a_step_names_the_micro_batch_and_applies_nothing(tiny_model, vocab):
    backend = TorchBackend(tiny_model, settings())
    before = params(backend)
    step = one_step(0, vocab)
    assert len(step.micro_batches) >= 2
    old = backend.compute_logprobs(step.micro_batches, temperature=1.0)
    loss, calls = make_loss(LossConfig()), []

    def fails_on_the_second(inp: LossInputs) -> LossOutput:
        calls.append(1)
        if len(calls) == 2:  # the first micro-batch's gradient is already accumulated
            raise allocator_failure()
        return loss(inp)

    mb = step.micro_batches[1]
    lengths = (mb.cu_seqlens[1:] - mb.cu_seqlens[:-1]).tolist()
    with pytest.raises(TrainerOutOfMemory) as caught:
        backend.train_step(step, fails_on_the_second, old_logprobs=old, temperature=1.0)
    message = str(caught.value)
    assert message.startswith(f"training ran out of memory on cpu with a micro-batch of {mb.num_tokens} tokens in "
                              f"{len(lengths)} segment(s), the longest {max(lengths)} (CUDA out of memory. Tried")
    assert "the step was not applied" in message and "train.gradient_checkpointing = true" in message
    assert f"its longest, {max(lengths)}, is the floor" in message
    assert backend.weight_version == 0 and not backend.optimizer.state
    assert all(p.grad is None for p in backend.model.parameters())  # the half-step's gradients are dropped
    assert all(torch.equal(before[k], v) for k, v in params(backend).items())
    assert train(backend, step).weight_version == 1  # the backend is usable afterwards


def test_out_of_memory_while_scoring_does_not_suggest_what_is_already_on(tiny_model, vocab, monkeypatch):
    backend = TorchBackend(tiny_model, settings(gradient_checkpointing=True))
    step = one_step(1, vocab)

    def no_memory(*args, **kwargs):
        raise allocator_failure()

    monkeypatch.setattr(backend, "_token_logprobs", no_memory)
    with pytest.raises(TrainerOutOfMemory, match=r"^scoring ran out of memory on cpu with a micro-batch of") as caught:
        backend.compute_logprobs(step.micro_batches, temperature=1.0)
    assert "gradient_checkpointing" not in str(caught.value)
    assert "train.micro_batch_tokens" in str(caught.value)


def test_a_resume_trains_at_the_configured_lr_not_the_checkpoint_s(tiny_model, vocab, tmp_path):
    """``--resume --set train.lr=... --override train.lr``: the restored optimizer and scheduler state must not
    win over the new learning rate (they did: the record said 3e-3, the run trained at 3e-4)."""
    first = TorchBackend(tiny_model, settings(lr=3e-4, warmup_steps=4, weight_decay=0.01))
    lrs = [train(first, one_step(k, vocab)).metrics["lr"] for k in range(2)]
    assert lrs == pytest.approx([0.75e-4, 1.5e-4])
    first.save_checkpoint(tmp_path / "step-1", extra_state={"step": 1})

    same = TorchBackend(tiny_model, settings(lr=3e-4, warmup_steps=4, weight_decay=0.01))
    same.load_checkpoint(tmp_path / "step-1")
    assert train(same, one_step(2, vocab)).metrics["lr"] == pytest.approx(2.25e-4)  # unchanged: as before

    changed = TorchBackend(tiny_model, settings(lr=3e-3, warmup_steps=4, weight_decay=0.02))
    changed.load_checkpoint(tmp_path / "step-1")
    # The warm-up continues where it was (step 2 of 4), at the new peak; the weight decay is the new one too.
    assert [g["lr"] for g in changed.optimizer.param_groups] == pytest.approx([2.25e-3, 2.25e-3])
    assert [g["weight_decay"] for g in changed.optimizer.param_groups] == [0.02, 0.0]
    assert any(changed.optimizer.state.values())  # the moments were kept
    rows = [train(changed, one_step(k, vocab)).metrics["lr"] for k in (2, 3)]
    assert rows == pytest.approx([2.25e-3, 3e-3])
