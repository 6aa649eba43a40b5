"""Score-centering REINFORCE fed with the captured nucleus: packing carries it, the loss refuses tokens
without it, the real embedded engine's nucleus gives a zero correction in the torch backend (fp32: the same
distribution on both sides), and ``lego train`` runs it end to end on the toy environment."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from lego_rl.cli.main import app
from lego_rl.runstore.log import follow_metrics
from lego_rl.serving.engine import EmbeddedEngine
from lego_rl.serving.protocol import SamplingParams
from lego_rl.serving.tiny_model import ensure_tiny_model
from lego_rl.train.backend import LossInputs
from lego_rl.train.batching import plan_steps
from lego_rl.train.losses import LossConfig, make_loss
from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings
from lego_rl.trajectory.sample import Sample
from support.numerics import forward_tolerance
from support.toy_run import scrub_config_env, write_toy_run

TOP_P = 0.9


def sample(rid: str, ctx: int, nucleus: list[list[int]] | None, index: int = 0) -> Sample:
    n = ctx + (len(nucleus) if nucleus is not None else 2)
    tokens = list(range(10, 10 + n))
    if nucleus is not None:
        for k, ids in enumerate(nucleus):
            tokens[ctx + k] = ids[0]
    return Sample(rollout_id=rid, group_index=0, index=index, tokens=tokens, loss_mask=[0] * ctx + [1] * (n - ctx),
                  rollout_logprobs=[0.0] * n,
                  nucleus_ids=None if nucleus is None else [[] for _ in range(ctx)] + nucleus,
                  nucleus_probs=None if nucleus is None else [[] for _ in range(ctx)]
                  + [[1.0 / len(ids)] * len(ids) for ids in nucleus])


def test_micro_batches_carry_the_nucleus_padded_per_token() -> None:
    a = sample("a", 2, [[5, 6, 7], [8]])
    b = sample("b", 3, [[9, 1]], index=1)
    (step,) = plan_steps([a, b], [1.0, -1.0], max_tokens_per_micro_batch=64)
    (mb,) = step.micro_batches
    assert mb.nucleus_ids is not None and mb.nucleus_probs is not None and mb.nucleus_valid is not None
    assert tuple(mb.nucleus_ids.shape) == (mb.num_tokens, 3)
    rows = {i: mb.nucleus_ids[i][mb.nucleus_valid[i]].tolist() for i in range(mb.num_tokens)}
    assert [r for r in rows.values() if r] == [[5, 6, 7], [8], [9, 1]]  # in token order, padding dropped
    assert not mb.nucleus_valid[mb.loss_mask == 0].any()  # context positions carry none
    assert torch.allclose(mb.nucleus_probs[mb.nucleus_valid].sum(), torch.tensor(3.0))
    (plain,) = plan_steps([sample("c", 2, None)], [1.0], max_tokens_per_micro_batch=64)
    assert plain.micro_batches[0].nucleus_ids is None


def test_the_loss_refuses_trained_tokens_without_a_nucleus() -> None:
    a = sample("a", 2, [[5, 6], [8]])
    b = sample("b", 2, None, index=1)  # a rollout recorded without capture
    (step,) = plan_steps([a, b], [1.0, -1.0], max_tokens_per_micro_batch=64)
    (mb,) = step.micro_batches
    t, k = mb.nucleus_ids.shape
    inp = LossInputs(logprobs=torch.zeros(t), old_logprobs=torch.zeros(t), rollout_logprobs=torch.zeros(t),
                     advantages=mb.advantages, loss_mask=mb.loss_mask, token_weights=mb.token_weights,
                     rollout_slots=mb.rollout_slots, rollout_token_counts=torch.tensor([2.0, 2.0]),
                     rollout_log_ratio_elsewhere=torch.zeros(2), nucleus_candidate_logprobs=torch.zeros(t, k),
                     nucleus_sampler_probs=mb.nucleus_probs, nucleus_valid=mb.nucleus_valid)
    with pytest.raises(ValueError, match="2 trained token.*no captured nucleus"):
        make_loss(LossConfig(use_score_centering=True))(inp)


@pytest.fixture(scope="module")
def tiny() -> Path:
    return ensure_tiny_model()


@pytest.fixture
async def engine(tiny: Path) -> AsyncIterator[EmbeddedEngine]:
    e = EmbeddedEngine(tiny, max_batch=4)
    await e.start()
    yield e
    await e.stop()


async def test_engine_nucleus_gives_zero_correction_and_a_step(engine: EmbeddedEngine, tiny: Path) -> None:
    """The engine's own nucleus and probabilities, replayed by a backend holding the same weights in fp32:
    the centred correction is zero up to rounding, the trainer's logprobs equal the engine's, and the
    update moves the weights. Perturbed sampler probabilities (a stale sampler) make it non-zero."""
    prompt = [1, 10, 72, 105, 300, 12]
    samples = []
    for i, seed in enumerate((3, 4)):
        out = await engine.generate(prompt, SamplingParams(max_tokens=24, temperature=1.0, top_p=TOP_P, seed=seed),
                                    request_id=f"sc{i}", want_nucleus=True, ignore_eos=True)
        assert out.nucleus_ids is not None and out.nucleus_probs is not None
        n = len(prompt)
        samples.append(Sample(rollout_id=f"r{i}", group_index=0, index=i, tokens=prompt + out.token_ids,
                              loss_mask=[0] * n + [1] * len(out.token_ids),
                              rollout_logprobs=[0.0] * n + list(out.logprobs),
                              nucleus_ids=[[] for _ in prompt] + out.nucleus_ids,
                              nucleus_probs=[[] for _ in prompt] + out.nucleus_probs))
    (step,) = plan_steps(samples, [1.0, -1.0], max_tokens_per_micro_batch=256)
    backend = TorchBackend(tiny, TorchTrainSettings(lr=1e-3, device="cpu", logprob_chunk_tokens=5))
    old = backend.compute_logprobs(step.micro_batches, temperature=1.0, top_p=TOP_P)
    mb = step.micro_batches[0]
    trained = mb.loss_mask > 0  # [T]
    diff = (old[0] - mb.rollout_logprobs)[trained].abs()  # [n_trained]
    # The replayed nucleus: the engine's exact distribution, up to decode-vs-full-forward fp32 noise.
    assert diff.max().item() < forward_tolerance(1.0), diff
    before = {k: v.clone() for k, v in backend.model.state_dict().items()}
    res = backend.train_step(step, make_loss(LossConfig(use_score_centering=True)), old_logprobs=old,
                             temperature=1.0, top_p=TOP_P)
    # Built from the engine's and the trainer's probabilities of the same nuclei: their forward noise at most
    # (a nucleus that is not replayed moves it by the missing mass, 1e-2 and more).
    assert abs(res.metrics["sc_correction"]) < forward_tolerance(1.0), res.metrics
    assert any(not torch.equal(before[k], v) for k, v in backend.model.state_dict().items())
    # Control: a sampler whose probabilities differ from the trainer's leaves a correction the loss sees.
    stale = mb.nucleus_probs.clone()  # [T, K]
    stale[mb.nucleus_valid] = stale[mb.nucleus_valid] ** 2
    mb.nucleus_probs = stale / stale.sum(-1, keepdim=True).clamp(min=1e-12)  # [T, K]
    res2 = backend.train_step(step, make_loss(LossConfig(use_score_centering=True)),
                              old_logprobs=backend.compute_logprobs(step.micro_batches, temperature=1.0, top_p=TOP_P),
                              temperature=1.0, top_p=TOP_P)
    assert abs(res2.metrics["sc_correction"]) > 1e-3, res2.metrics


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    scrub_config_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    # On-policy: the correction is ~0 only when the trainer's weights are the ones that sampled (staleness 1 would
    # train step 1 on rollouts of policy 0, a real and non-zero correction).
    yield write_toy_run(tmp_path, rollout={"samples_per_prompt": 8, "top_p": 0.9, "capture_nucleus": True,
                                           "max_staleness": 0},
                        train={"use_score_centering": True}, paths={"run_root": "runs/sc"})


@pytest.mark.slow
def test_lego_train_runs_score_centering_through_the_loop(toy: Path) -> None:
    """The whole path: the embedded engine captures the nucleus, the environment's samples keep it, packing
    carries it to the torch backend, and the SC loss trains on it; fp32 on CPU, so the correction is ~0."""
    res = CliRunner().invoke(app, ["train", "-c", "lego.toml", "--json"])
    assert res.exit_code == 0, res.output
    rows = list(follow_metrics(toy / "runs" / "sc" / "metrics.jsonl").read())
    trained = [r for r in rows if "sc_correction" in r.values]
    assert trained, [r.values for r in rows]  # at least one step had a non-zero advantage and trained
    for r in trained:
        # fp32 engine and trainer on CPU: forward noise only (as above).
        assert abs(r.values["sc_correction"]) < forward_tolerance(1.0), r.values
        assert r.values["consistency/mean_abs_diff"] < forward_tolerance(1.0), r.values


def test_lego_train_refuses_score_centering_without_the_nucleus(toy: Path) -> None:
    res = CliRunner().invoke(app, ["train", "-c", "lego.toml", "--set", "rollout.capture_nucleus=false"])
    assert res.exit_code == 2, res.output
    assert "rollout.capture_nucleus" in " ".join(res.output.split())
    assert not (toy / "runs" / "sc").exists()
