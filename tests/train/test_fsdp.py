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
            # Both ranks past their last collective before either tears gloo down: under load, rank 1 tearing
            # down while rank 0 was still in the stop broadcast once aborted it ("terminate called without an
            # active exception", SIGABRT) after every check had run. Only on success: after a failure the
            # other rank may never reach it.
            dist.barrier()
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
        dist.barrier()  # see rank 1's
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


TOML = """
[serving]
device = "cpu"
port = 0

[sandbox]
provider = "bwrap"

[rollout]
prompt_data = "toy.jsonl"
batch_size = 2
samples_per_prompt = 8
top_p = 1.0

[train]
environment = "first_letter"
num_rollout = 2
micro_batch_tokens = 64
audit = true

[paths]
run_root = "runs/dp"
"""


@pytest.mark.slow
def test_lego_train_under_torchrun_trains_with_two_ranks(tmp_path: Path) -> None:
    """``torchrun --nproc-per-node 2 lego train``: rank 0 runs the loop and the engine, rank 1 follows its trainer
    calls (gloo on CPU); both exit 0, the run directory has its rows and a checkpoint, and `lego audit` passes."""
    import json
    import os
    import subprocess
    import sys

    from lego_rl.driver.toy_env import make_rows
    from lego_rl.runstore.log import follow_metrics

    (tmp_path / "toy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in make_rows(8, letters="a")))
    (tmp_path / "lego.toml").write_text(TOML)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEGO_", "SWE_", "ADAPTER_"))
           and k not in {"PROMPT_DATA", "RUN_ROOT", "RUN_LOG", "HF_CHECKPOINT", "DATA_ROOT"}}
    lego = str(Path(sys.executable).with_name("lego"))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           lego, "train", "-c", "lego.toml", "--json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(follow_metrics(tmp_path / "runs" / "dp" / "metrics.jsonl").read())
    assert [r.step for r in rows] == [0, 1]
    assert any("loss" in r.values for r in rows), [r.values for r in rows]  # some step trained across ranks
    assert (tmp_path / "runs" / "dp" / "checkpoints" / "latest").read_text().strip() == "step-000001"
    # The audit over both FSDP2 ranks: each recorded every optimizer step and changed its own shards (no DP size
    # was set: torchrun's two processes are the ranks).
    audit = subprocess.run([lego, "audit", "runs/dp", "--json"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=300)
    assert audit.returncode == 0, audit.stdout[-3000:] + audit.stderr[-2000:]
    assert json.loads(audit.stdout)["ranks"] == 2
