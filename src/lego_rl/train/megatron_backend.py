"""The Megatron-core trainer backend: a Qwen3-architecture model split by tensor and data parallelism.

``MegatronBackend`` implements ``TrainerBackend`` like ``TorchBackend`` does, and is built to give the same
numbers on the same weights (``tests/train/test_megatron_backend.py`` compares them). Choices, and why:

* **SPMD.** Every trainer process builds one backend and calls the same methods with the same arguments (the
  loop's inputs are small: packed token ids). A plain ``lego train`` is one process (``tp × dp = 1``); under
  ``torchrun`` or Ray each rank runs the same calls. Micro-batch ``i`` of a step runs on data-parallel rank
  ``i mod dp``; because ``token_weights`` already carry each rollout's denominator over the whole step,
  *summing* gradients over DP ranks gives exactly the one-process gradient, whatever the split.
* **Weights.** Loaded from the HF checkpoint the engine serves (``megatron_convert``); exported in that
  layout for weight sync, every TP shard gathered; checkpoints are HF directories too, plus one optimizer
  shard per TP rank.
* **Optimizer.** ``torch.optim.AdamW`` over this rank's fp32 shards, weight decay on matrices only, linear
  warm-up, clipping by the global norm (sharded parameters summed over TP ranks, replicated ones counted
  once): the torch backend's optimizer, so one step moves the same weights the same way. Megatron's own
  optimizers need CUDA (its ``DistributedOptimizer`` accepts only ``torch.cuda`` parameters), and its distributed
  optimizer shards state over DP, which this backend does not yet (docs/cluster.md says what that needs).
* **Pipeline parallelism.** Stage ``s`` of ``pp`` holds ``num_layers / pp`` consecutive layers (megatron-core's
  ``pre_process``/``post_process`` split); micro-batches run through ``pipeline``'s 1F1B schedule (ours:
  megatron-core's schedules need CUDA, see that module). Logprobs are recomputed on the last stage and
  broadcast to every stage, so results are on every rank (rank 0 included) as with TP/DP; losses and their
  per-rollout denominators are unchanged, computed on the last stage; each stage steps its own parameters with
  the gradient norm summed over stages. A tied embedding is two copies (first and last stage) loaded from one
  HF tensor, whose gradients are summed. Export and checkpoints send every stage's tensors to rank 0.
  Every micro-batch is one pipeline message per stage boundary, ``[T, 1, H]`` fp32 (the residual stream's
  dtype even under bf16 autocast, so PP changes no number).
* **Qwen3-MoE** runs with megatron-core's all-gather dispatcher and no auxiliary loss, with TP = 1 (megatron-core
  refuses to train MoE layers under TP without sequence parallelism). With ``expert_parallel`` = EP > 1 each of EP
  data-parallel ranks holds ``E / EP`` experts: expert gradients are summed over the expert-data-parallel ranks
  only, their share of the gradient norm over the EP group, export and checkpoints gather every expert, and
  the ranks' micro-batches are padded into rounds of equal token counts (``megatron_parallel.rounds``), which
  the dispatcher's equal-size collectives need. With ``routing_replay`` (R3) each router is handed the rollout's experts
  through megatron-core's own ``RouterReplay`` (``train.routing_replay`` builds and checks them).

Precision, packing and the logprob convention are ``megatron_model``'s (fp32 params, bf16 autocast on CUDA;
segments attend within themselves; the sampler's top-p/top-k convention).

The backend is split by job: ``megatron_setup`` (settings, the rank's place in the grid, building and loading
the model), ``megatron_parallel`` (which micro-batches a rank runs, collectives of results), ``megatron_step``
(forwards, one step's forward/backward and gradient reduction), ``megatron_weights`` (full HF tensors for export)
and ``megatron_checkpoint``; ``train.step`` holds the step bookkeeping shared with the torch backend. This class
holds the rank with its optimizer and weight version.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from lego_rl.train import megatron_checkpoint, megatron_step, megatron_weights
from lego_rl.train.backend import LossFn, StepResult
from lego_rl.train.batching import MicroBatch, OptimizerStep
from lego_rl.train.megatron_setup import (
    MEGATRON_EXTRA_HINT,
    MegatronRank,
    MegatronTrainSettings,
    require_megatron,
)
from lego_rl.train.step import apply_update, check_grad_norm, make_optimizer, rebase_optimizer, step_metrics

__all__ = ["MEGATRON_EXTRA_HINT", "MegatronBackend", "MegatronTrainSettings", "require_megatron"]


class MegatronBackend:
    """A Qwen3-architecture policy held by megatron-core (see the module docstring)."""

    def __init__(self, model_dir: Path, settings: MegatronTrainSettings) -> None:
        self.settings = settings
        self.model_dir = Path(model_dir)
        self.parts = MegatronRank.create(self.model_dir, settings)
        p = self.parts
        # What callers read of the rank, fixed once it is built (the model is the policy's stage on this rank).
        self.model, self.layout, self.device, self.recompute = p.model, p.layout, p.device, p.recompute
        self.optimizer, self.scheduler = make_optimizer(
            self.parts.params, settings,
            fused=self.parts.device.type == "cuda")  # one kernel over all shards instead of a launch per tensor
        self._version = 0

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def rank(self) -> int:
        """This process's rank in the default process group (``train.distributed`` drives ranks > 0)."""
        return self.parts.layout.rank

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps taken, as AdamW counts them (``train.audit``)."""
        from lego_rl.train.audit import adam_steps

        return adam_steps(self.optimizer)

    def local_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """This rank's TP shard of every trained parameter, by Megatron name."""
        yield from zip(self.parts.names, self.parts.params, strict=True)

    # ------------------------------------------------------------------------------------ forward and step

    def compute_logprobs(self, micro_batches: Sequence[MicroBatch], *, temperature: float, top_p: float = 1.0,
                         top_k: int = -1) -> list[torch.Tensor]:
        return megatron_step.compute_logprobs(self.parts, micro_batches, temperature=temperature, top_p=top_p,
                                              top_k=top_k)

    def train_step(self, step: OptimizerStep, loss_fn: LossFn, *, old_logprobs: Sequence[torch.Tensor],
                   temperature: float, top_p: float = 1.0, top_k: int = -1) -> StepResult:
        r = self.parts
        with r.mm.cpu_device_shim(r.device):  # megatron's TP mappings allocate on the "current" device
            self.optimizer.zero_grad(set_to_none=True)
            loss, norm, metrics = megatron_step.run_share(r, step, loss_fn, old_logprobs, temperature=temperature,
                                                          top_p=top_p, top_k=top_k)
            check_grad_norm(norm, self._version, self.optimizer)
            megatron_step.clip_grads(r, norm)
            lr = apply_update(self.optimizer, self.scheduler)
        self._version += 1
        return StepResult(metrics=step_metrics(metrics, step, loss=loss, grad_norm=norm, lr=lr),
                          weight_version=self._version)

    # ------------------------------------------------------------------------------------ weights

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Parameters in the engine's layout (``megatron_weights.export_weights``): a collective, every rank
        must iterate to the end."""
        return megatron_weights.export_weights(self.parts)

    def save_checkpoint(self, path: Path, *, extra_state: dict[str, Any]) -> None:
        """``megatron_checkpoint.save_checkpoint``: every rank must call it."""
        megatron_checkpoint.save_checkpoint(self.parts, path, optimizer=self.optimizer, scheduler=self.scheduler,
                                            weight_version=self._version, extra_state=extra_state)

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        self._version, extra = megatron_checkpoint.load_checkpoint(self.parts, path, optimizer=self.optimizer,
                                                                   scheduler=self.scheduler)
        rebase_optimizer(self.optimizer, self.scheduler, self.settings)  # the config's lr, not the saved one
        return extra
