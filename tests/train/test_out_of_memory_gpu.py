"""A real CUDA out-of-memory in the torch trainer (marked ``gpu``; skipped without CUDA): the caching
allocator is capped at 3 GiB, a 120k-token micro-batch without gradient checkpointing cannot fit, and the
backend must say so in its own words, apply nothing and train the next step normally once memory is back.
Run on the lent H200: ``python3 -m pytest -q -m gpu tests/train/test_out_of_memory_gpu.py``.
"""

from __future__ import annotations

import gc
import random
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs CUDA (run on the lent H200)", allow_module_level=True)

from lego_rl.errors import TrainerOutOfMemory  # noqa: E402
from lego_rl.train.batching import plan_steps  # noqa: E402
from lego_rl.train.losses import LossConfig, make_loss  # noqa: E402
from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings  # noqa: E402
from lego_rl.trajectory.sample import Sample  # noqa: E402
from support.gpu_qwen3 import VOCAB, save_random_qwen3  # noqa: E402

CAP_GIB = 3


def rollouts(n: int, length: int) -> tuple[list[Sample], list[float]]:
    rng = random.Random(n)
    half = length // 2
    return [Sample(rollout_id=f"r{r}", group_index=0, index=r, segment=0, num_segments=1,
                   tokens=[rng.randrange(VOCAB) for _ in range(length)], loss_mask=[0] * half + [1] * (length - half),
                   rollout_logprobs=[0.0] * half + [-3.0] * (length - half)) for r in range(n)], \
        [1.0 if r % 2 else -1.0 for r in range(n)]  # fmt: skip


def test_a_real_out_of_memory_is_named_applies_nothing_and_the_next_step_trains(tmp_path: Path) -> None:
    model_dir = save_random_qwen3(tmp_path / "model", max_position_embeddings=4096)
    b = TorchBackend(model_dir, TorchTrainSettings(lr=1e-4, device="cuda"))  # gradient checkpointing off
    loss = make_loss(LossConfig())
    data, adv = rollouts(30, 4000)
    (big,) = plan_steps(data, adv, max_tokens_per_micro_batch=120_000)
    assert len(big.micro_batches) == 1
    old = b.compute_logprobs(big.micro_batches, temperature=1.0)  # no-grad: fits without the cap
    before = {k: v.detach().clone() for k, v in b.export_weights()}
    torch.cuda.empty_cache()
    resting = torch.cuda.memory_allocated()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(CAP_GIB * 2**30 / total)
    try:
        with pytest.raises(TrainerOutOfMemory) as caught:
            b.train_step(big, loss, old_logprobs=old, temperature=1.0)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    message = str(caught.value)
    del caught  # its traceback holds the failed step's frames, and with them their activations
    gc.collect()  # traceback <-> frame cycles: the frames go at the next collection
    assert message.startswith("training ran out of memory on cuda") and "120000 tokens in 30 segment(s)" in message
    assert "CUDA out of memory" in message and "train.gradient_checkpointing = true" in message
    assert b.weight_version == 0 and not b.optimizer.state
    assert all(torch.equal(before[k], v) for k, v in b.export_weights())
    torch.cuda.empty_cache()
    assert torch.cuda.memory_allocated() <= resting + 2**20  # nothing of the failed step is still held

    data, adv = rollouts(4, 1000)
    (small,) = plan_steps(data, adv, max_tokens_per_micro_batch=8192)
    old = b.compute_logprobs(small.micro_batches, temperature=1.0)
    assert b.train_step(small, loss, old_logprobs=old, temperature=1.0).weight_version == 1
