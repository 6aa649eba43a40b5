"""The trainer backend contract: what the training loop needs of a policy model, whichever library holds it.

The loop in ``lego_rl.driver`` drives a ``TrainerBackend`` and never knows which one: the torch backend
(one process, or FSDP2 under torchrun) and the Megatron-core backend (TP/PP/DP workers) implement the same
methods. Losses stay pure functions of tensors (``lego_rl.train.losses``): a backend runs the forward pass,
hands a ``LossInputs`` per micro-batch to the loss, and accumulates the gradients.

Alignment convention (the one ``lego_rl.train.batching`` packs with): every per-token tensor is ``[T]`` and
aligned with ``input_ids``: position ``i`` holds the log-probability of ``input_ids[i]`` given the tokens
before it *in its own segment* (``cu_seqlens`` bounds the segments). A segment's first position has no
prediction; backends put 0 there, and its loss mask is always 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from pydantic import BaseModel, ConfigDict, Field

from lego_rl.train.batching import MicroBatch, OptimizerStep


@dataclass
class LossInputs:
    """One micro-batch as the loss sees it. ``R`` is the number of rollouts in the optimizer step."""

    logprobs: torch.Tensor
    """[T] the trainer's log-probabilities under the current parameters (carries the gradient)."""
    old_logprobs: torch.Tensor
    """[T] the trainer's log-probabilities before this optimizer step (no grad): the PPO/GSPO ratio's base."""
    rollout_logprobs: torch.Tensor
    """[T] what the sampler reported for the same tokens (no grad): the base of TIS/MIS corrections."""
    advantages: torch.Tensor
    """[T] the token's rollout advantage (GRPO, broadcast to every token of the rollout)."""
    loss_mask: torch.Tensor
    """[T] 1.0 for sampled (trained) tokens, 0.0 for context."""
    token_weights: torch.Tensor
    """[T] ``loss_mask / (N_r * R)``: summing ``token_weights * per_token_loss`` over every micro-batch of the
    step gives the mean over rollouts of each rollout's token mean (one denominator per rollout)."""
    rollout_slots: torch.Tensor
    """[T] int64 index of the token's rollout in the step (``OptimizerStep.rollout_ids``)."""
    rollout_token_counts: torch.Tensor
    """[R] trained tokens of each rollout over the whole step (``N_r``)."""
    rollout_log_ratio_elsewhere: torch.Tensor
    """[R] detached sum over the rollout's trained tokens in the step's *other* micro-batches of
    ``logprobs - old_logprobs``: what a sequence-level ratio (GSPO) needs when a rollout spans micro-batches.
    Zero when every rollout fits one micro-batch or nothing was updated yet."""
    ref_logprobs: torch.Tensor | None = None
    """[T] a frozen reference model's log-probabilities (no grad), when a KL penalty is configured."""
    entropy: torch.Tensor | None = None
    """[T] the current distribution's entropy per position (no grad), a metric only."""
    nucleus_logprobs: torch.Tensor | None = None
    """[T] the sampler's log-mass of its top-p/top-k nucleus at each token, when captured (consistency
    checks; the losses read the candidate tensors below instead)."""
    rollout_is_log_ratio_elsewhere: torch.Tensor | None = None
    """[R] detached sum over the rollout's trained tokens in the step's *other* micro-batches of
    ``old_logprobs - rollout_logprobs``: what sequence-level TIS/MIS needs when a rollout spans
    micro-batches (zeros when it does not). Needed only for ``is_level="sequence"``."""
    nucleus_candidate_logprobs: torch.Tensor | None = None
    """[T, K] the trainer's log-probabilities (carrying the gradient, same temperature as ``logprobs``) of
    the sampler's K nucleus candidates at each position, normalised over that nucleus (score centering)."""
    nucleus_sampler_probs: torch.Tensor | None = None
    """[T, K] the sampler's probability of each nucleus candidate (no grad); 0 on padding."""
    nucleus_valid: torch.Tensor | None = None
    """[T, K] bool: which candidate slots are real (positions have nuclei of different sizes)."""


@dataclass
class LossOutput:
    loss: torch.Tensor
    """[] this micro-batch's share of the step loss; the backend calls ``backward()`` on it and sums grads."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Token-weighted partial sums (the backend adds them over micro-batches): e.g. ``clip_frac``, ``kl``."""


LossFn = Callable[[LossInputs], LossOutput]


@dataclass
class StepResult:
    metrics: dict[str, float]
    """Summed loss metrics plus the backend's own: ``loss``, ``grad_norm``, ``lr``, ``tokens``."""
    weight_version: int
    """The version the parameters have after this step (the engines are synced to it next)."""


@runtime_checkable
class TrainerBackend(Protocol):
    """A policy model that can score packed micro-batches, take optimizer steps and hand its weights over."""

    @property
    def weight_version(self) -> int:
        """0 for the loaded checkpoint, +1 per optimizer step."""
        ...

    def compute_logprobs(self, micro_batches: Sequence[MicroBatch], *, temperature: float, top_p: float = 1.0,
                         top_k: int = -1) -> list[torch.Tensor]:
        """[T] per micro-batch under the current parameters (no grad): each token's log-probability under the
        distribution the sampler drew it from (``softmax(logits / temperature)`` after top-k then top-p,
        renormalised), the serving engine's convention (``serving.protocol``)."""
        ...

    def train_step(self, step: OptimizerStep, loss_fn: LossFn, *, old_logprobs: Sequence[torch.Tensor],
                   temperature: float, top_p: float = 1.0, top_k: int = -1) -> StepResult:
        """Forward every micro-batch of ``step``, run ``loss_fn`` on it, accumulate gradients, clip, step the
        optimizer and scheduler once. ``old_logprobs[i]`` belongs to ``step.micro_batches[i]``."""
        ...

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The parameters by their Hugging Face names, full (not sharded) tensors, for weight sync."""
        ...

    def save_checkpoint(self, path: Path, *, extra_state: dict[str, Any]) -> None:
        """Model in Hugging Face format plus optimizer, scheduler and RNG state and ``extra_state`` (the loop's
        data cursor and step), written so that a crash never leaves a checkpoint that looks complete."""
        ...

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        """Restore what ``save_checkpoint`` wrote; returns its ``extra_state``."""
        ...


class OptimizerSettings(BaseModel):
    """The AdamW / schedule / memory settings every trainer backend takes (its settings class adds its own)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lr: float = Field(gt=0)
    """Peak learning rate (train.lr)."""
    warmup_steps: int = Field(default=0, ge=0)
    """Optimizer steps of linear warm-up from lr/(warmup_steps) to lr (train.warmup_steps)."""
    max_grad_norm: float | None = Field(default=1.0, gt=0)
    """Clip the global gradient 2-norm to this; None = no clipping (the norm is still reported)."""
    weight_decay: float = Field(default=0.0, ge=0)
    """AdamW decoupled weight decay on weight matrices (not norms or biases)."""
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = Field(default=1e-8, gt=0)
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, ~30 % more compute)."""
    reference_model: bool = False
    """Keep a frozen copy of the loaded weights to give the loss ``ref_logprobs`` (KL penalty)."""
