"""FSDP2 data parallelism on CPU: two gloo processes (real ``torch.distributed``, spawned) train the real tiny
model over the same optimizer step as one process, through ``RankZeroBackend`` / ``follow_rank_zero``; the
loss and the weights must agree, and a checkpoint written sharded resumes in one process and in two."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from lego_rl.serving.tiny_model import ensure_tiny_model
from lego_rl.train.batching import OptimizerStep, plan_steps
from lego_rl.train.losses import LossConfig, make_loss
from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings
from lego_rl.trajectory.sample import Sample

WORLD = 2
LOSS = make_loss(LossConfig(algorithm="gspo"))  # GSPO: rollouts spanning micro-batches need cross-rank sums


def the_step(vocab: int) -> OptimizerStep:
    """Five rollouts of two segments, packed small so that there are an odd number of micro-batches (one
    rank runs a padding slot) and rollouts span micro-batches."""
    rng = random.Random(7)
    samples, adv = [], []
    for r in range(5):
        for s in range(2):
            ctx, out = rng.randint(3, 9), rng.randint(3, 9)
            samples.append(Sample(rollout_id=f"r{r}", group_index=0, index=r, segment=s, num_segments=2,
                                  tokens=[rng.randrange(vocab) for _ in range(ctx + out)],
                                  loss_mask=[0] * ctx + [1] * out,
                                  rollout_logprobs=[0.0] * ctx + [-rng.uniform(1, 6) for _ in range(out)]))
            adv.append([1.0, -1.0, 0.5, -0.5, 0.25][r])
    (step,) = plan_steps(samples, adv, max_tokens_per_micro_batch=40)
    assert len(step.micro_batches) % WORLD == 1, len(step.micro_batches)
    return step


def settings() -> TorchTrainSettings:
    # A large Adam epsilon makes the update ~ lr * g / eps, linear in the gradient: the first Adam step is
    # otherwise ~ lr * sign(g), where fp32 summation order flips the sign of near-zero gradients.
    return TorchTrainSettings(lr=0.1, adam_eps=10.0, device="cpu", logprob_chunk_tokens=8)


def full_params(backend: object) -> dict[str, torch.Tensor]:
    return {n: t.clone() for n, t in backend.export_weights()}  # type: ignore[attr-defined]


def one_step(backend: object, step: OptimizerStep) -> float:
    old = backend.compute_logprobs(step.micro_batches, temperature=1.0)  # type: ignore[attr-defined]
    res = backend.train_step(step, LOSS, old_logprobs=old, temperature=1.0)  # type: ignore[attr-defined]
    return float(res.metrics["loss"])


def _rank(rank: int, port: int, tmp: str) -> None:
    import torch.distributed as dist

    from lego_rl.train.distributed import RankZeroBackend, follow_rank_zero

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        tiny = ensure_tiny_model()
        inner = TorchBackend(tiny, settings())
        assert inner.world == WORLD
        if rank != 0:
            follow_rank_zero(inner)  # the first session: step, checkpoint, step
            follow_rank_zero(TorchBackend(tiny, settings()))  # the second: resume from the checkpoint, step
            return
        vocab = int(inner.config.vocab_size)
        step = the_step(vocab)
        backend = RankZeroBackend(inner)
        out: dict[str, object] = {"loss1": one_step(backend, step), "params1": full_params(backend)}
        backend.save_checkpoint(Path(tmp) / "ckpt", extra_state={"step": 1})
        out["loss2"] = one_step(backend, step)
        out["params2"] = full_params(backend)
        backend.stop()
        resumed = RankZeroBackend(TorchBackend(tiny, settings()))
        out["extra"] = resumed.load_checkpoint(Path(tmp) / "ckpt")
        out["params_loaded"] = full_params(resumed)
        out["loss2_resumed"] = one_step(resumed, step)
        out["params2_resumed"] = full_params(resumed)
        resumed.stop()
        torch.save(out, Path(tmp) / "rank0.pt")
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_two_gloo_ranks_match_one_process_and_checkpoints_resume(tmp_path: Path) -> None:
    mp.spawn(_rank, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    dp = torch.load(tmp_path / "rank0.pt", weights_only=False)
    tiny = ensure_tiny_model()
    single = TorchBackend(tiny, settings())
    assert single.world == 1
    step = the_step(int(single.config.vocab_size))
    before = full_params(single)
    loss1 = one_step(single, step)
    params1 = full_params(single)
    assert dp["loss1"] == pytest.approx(loss1, abs=1e-6)
    moved = 0
    for name, value in params1.items():
        torch.testing.assert_close(dp["params1"][name], value, rtol=1e-5, atol=1e-6, msg=name)
        moved += int(not torch.equal(before[name], value))
    assert moved > 0  # the comparison is not between two unchanged models
    loss2 = one_step(single, step)
    assert dp["loss2"] == pytest.approx(loss2, abs=1e-5)
    # The sharded checkpoint: loaded by two ranks it holds step 1's weights and continues like the run did.
    assert dp["extra"] == {"step": 1}
    for name, value in params1.items():
        torch.testing.assert_close(dp["params_loaded"][name], value, rtol=1e-5, atol=1e-6, msg=name)
    assert dp["loss2_resumed"] == pytest.approx(dp["loss2"], abs=1e-6)
    for name, value in dp["params2"].items():
        torch.testing.assert_close(dp["params2_resumed"][name], value, rtol=1e-5, atol=1e-6, msg=name)
    # ... and one process can resume it too (optimizer state by parameter name).
    alone = TorchBackend(tiny, settings())
    assert alone.load_checkpoint(tmp_path / "ckpt") == {"step": 1}
    assert one_step(alone, step) == pytest.approx(loss2, abs=1e-5)
    for name, value in full_params(alone).items():
        torch.testing.assert_close(value, dp["params2"][name], rtol=1e-5, atol=1e-6, msg=name)
