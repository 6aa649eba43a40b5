"""One optimizer step's bookkeeping, shared by every trainer backend (torch, Megatron).

A backend owns its forwards, its parallelism and its gradient reduction; what a step computes *around* them is
the same everywhere and lives here, so two backends cannot drift apart on it:

* ``check_step``: the step and its old logprobs agree (one ``[T]`` tensor per micro-batch);
* ``StepTotals``: per-rollout quantities a micro-batch's loss needs from the *other* micro-batches of its step
  (token counts, the rollout-vs-old importance log-ratio, GSPO's current-vs-old sequence log-ratio), and the
  ``LossInputs`` of one micro-batch built from them;
* ``make_optimizer`` / ``apply_update``: AdamW with weight decay on matrices only, linear warm-up, one update;
* ``check_grad_norm`` and ``step_metrics``: a non-finite gradient is refused, the step's metrics are summed.

Everything is CPU arithmetic over small ``[R]`` vectors except what the backend's own forwards compute.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from lego_rl.train.backend import LossFn, LossInputs, OptimizerSettings
from lego_rl.train.batching import MicroBatch, OptimizerStep

Scorer = Callable[[list[MicroBatch]], list[torch.Tensor]]
"""The backend's no-grad ``[T]`` logprobs of each micro-batch, at the step's sampling settings."""


def segment_starts(mb: MicroBatch) -> torch.Tensor:
    """[T] bool, True at each segment's first token (it has no prediction)."""
    starts = torch.zeros(mb.num_tokens, dtype=torch.bool)  # [T]
    starts[mb.cu_seqlens[:-1].long()] = True
    return starts


def rollout_sums(values: torch.Tensor, mb: MicroBatch, n_rollouts: int) -> torch.Tensor:
    """[R] detached sum over each rollout's trained tokens in ``mb`` of ``values`` [T]."""
    v = values.detach().float().cpu() * mb.loss_mask  # [T]
    return torch.zeros(n_rollouts).index_add(0, mb.rollout_slots, v)  # [R]


def check_step(step: OptimizerStep, old_logprobs: Sequence[torch.Tensor]) -> None:
    """Refuse a step without micro-batches, or old logprobs that are not one ``[T]`` tensor per micro-batch."""
    if not step.micro_batches:
        raise ValueError(f"optimizer step over rollouts {step.rollout_ids} has no micro-batches")
    if len(old_logprobs) != len(step.micro_batches):
        raise ValueError(f"{len(old_logprobs)} old_logprobs tensors for {len(step.micro_batches)} micro-batches")
    for i, (mb, old) in enumerate(zip(step.micro_batches, old_logprobs, strict=True)):
        if tuple(old.shape) != (mb.num_tokens,):
            raise ValueError(f"old_logprobs[{i}] has shape {tuple(old.shape)} but micro-batch {i} has "
                             f"{mb.num_tokens} tokens")


def spanning_micro_batches(step: OptimizerStep) -> list[int]:
    """Indices, ascending, of the micro-batches holding trained tokens of a rollout that spans several."""
    spans: dict[int, set[int]] = {}
    for i, mb in enumerate(step.micro_batches):
        for slot in mb.rollout_slots[mb.loss_mask > 0].unique().tolist():
            spans.setdefault(slot, set()).add(i)
    return sorted({i for members in spans.values() if len(members) > 1 for i in members})


def log_ratio_elsewhere(step: OptimizerStep, old_logprobs: Sequence[torch.Tensor], score: Scorer) -> list[torch.Tensor]:
    """Per micro-batch ``[R]``: sum of ``current - old`` over its rollouts' tokens in the *other* micro-batches
    (GSPO's sequence ratio). Exact: ``score`` runs a no-grad forward of the micro-batches whose rollouts span
    several; zeros for the rest (nothing elsewhere to add)."""
    r = len(step.rollout_ids)
    sums = [torch.zeros(r) for _ in step.micro_batches]  # [R] each
    shared = spanning_micro_batches(step)
    current = score([step.micro_batches[i] for i in shared]) if shared else []  # [T_i] each
    for i, lp in zip(shared, current, strict=True):
        sums[i] = rollout_sums(lp - old_logprobs[i], step.micro_batches[i], r)  # [R]
    total = torch.stack(sums).sum(0)  # [R]
    return [total - s for s in sums]  # [R] each


@dataclass
class StepTotals:
    """What each micro-batch's loss needs from the whole step, all ``[R]`` on the CPU (one per micro-batch in
    the lists): the step's trained tokens per rollout, the rollout-vs-old importance log-ratio summed over each
    micro-batch's tokens, and GSPO's current-vs-old log-ratio over the *other* micro-batches."""

    counts: torch.Tensor  # [R]
    is_sums: list[torch.Tensor]  # [R] each
    is_total: torch.Tensor  # [R]
    elsewhere: list[torch.Tensor]  # [R] each

    @classmethod
    def of(cls, step: OptimizerStep, old_logprobs: Sequence[torch.Tensor], loss_fn: LossFn,
           score: Scorer) -> StepTotals:
        """The totals of ``step``; ``score`` runs only when the loss needs the sequence log-ratio."""
        r = len(step.rollout_ids)
        counts = torch.tensor(step.rollout_token_counts, dtype=torch.float32)  # [R]
        is_sums = [rollout_sums(old - mb.rollout_logprobs, mb, r)
                   for mb, old in zip(step.micro_batches, old_logprobs, strict=True)]  # [R] each
        is_total = torch.stack(is_sums).sum(0)  # [R]
        if getattr(loss_fn, "needs_rollout_log_ratio", True):
            elsewhere = log_ratio_elsewhere(step, old_logprobs, score)
        else:
            elsewhere = [torch.zeros(r) for _ in step.micro_batches]
        return cls(counts=counts, is_sums=is_sums, is_total=is_total, elsewhere=elsewhere)

    def loss_inputs(self, i: int, mb: MicroBatch, device: torch.device, *, logprobs: torch.Tensor,
                    old_logprobs: torch.Tensor, entropy: torch.Tensor | None, ref_logprobs: torch.Tensor | None,
                    nucleus_candidate_logprobs: torch.Tensor | None = None, nucleus: bool = False) -> LossInputs:
        """The loss's inputs for micro-batch ``i`` (``mb``: what ran, padding included) on ``device``; with
        ``nucleus``, the sampler's captured nucleus goes along with the trainer's candidates."""
        return LossInputs(
            logprobs=logprobs,  # [T]
            old_logprobs=old_logprobs.to(device),  # [T]
            rollout_logprobs=mb.rollout_logprobs.to(device),
            advantages=mb.advantages.to(device),
            loss_mask=mb.loss_mask.to(device),
            token_weights=mb.token_weights.to(device),
            rollout_slots=mb.rollout_slots.to(device),
            rollout_token_counts=self.counts.to(device),
            rollout_log_ratio_elsewhere=self.elsewhere[i].to(device),
            rollout_is_log_ratio_elsewhere=(self.is_total - self.is_sums[i]).to(device),
            ref_logprobs=ref_logprobs,
            entropy=entropy,  # [T]
            nucleus_candidate_logprobs=nucleus_candidate_logprobs,  # [T, K] when the nucleus was captured
            nucleus_sampler_probs=None if not nucleus or mb.nucleus_probs is None
            else mb.nucleus_probs.to(device),  # [T, K]
            nucleus_valid=None if not nucleus or mb.nucleus_valid is None else mb.nucleus_valid.to(device),  # [T, K]
        )


def add_metrics(into: dict[str, float], part: dict[str, float]) -> None:
    """Add ``part``'s values into ``into``, key by key (micro-batch and rank metrics are sums)."""
    for key, value in part.items():
        into[key] = into.get(key, 0.0) + value


def sum_parts(parts: Iterable[tuple[float, dict[str, float]]]) -> tuple[float, dict[str, float]]:
    """The sum of ``(loss, metrics)`` partial sums gathered from several ranks."""
    loss_sum = 0.0
    metrics: dict[str, float] = {}
    for part_loss, part in parts:
        loss_sum += part_loss
        add_metrics(metrics, part)
    return loss_sum, metrics


def make_optimizer(params: Sequence[torch.nn.Parameter], settings: OptimizerSettings, *,
                   fused: bool | None = None) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over ``params`` (weight decay on matrices only, not on norms and biases) and its linear warm-up
    over ``warmup_steps`` updates, then constant. ``fused`` goes to AdamW as given (None: torch's choice)."""
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=settings.lr, betas=settings.adam_betas, eps=settings.adam_eps,
                                  fused=fused)
    warmup = settings.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0)
    return optimizer, scheduler


def rebase_optimizer(optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR,
                     settings: OptimizerSettings) -> None:
    """After a checkpoint's optimizer and scheduler state were loaded: the configured hyperparameters win over
    the restored ones. ``load_state_dict`` brings back the saved run's lr, weight decay, betas and eps with the
    moments, and the scheduler its base lr, so a resume at a new ``train.lr`` would otherwise train at the old
    one while its config file said the new one. The moments and the scheduler's step count are kept; the lr
    becomes the configured peak times the warm-up factor at that step. A no-op when nothing changed (a resume
    may change these keys only with ``--override``: config/resume_keys.py)."""
    decays = [settings.weight_decay, 0.0]  # make_optimizer's groups: matrices, then norms and biases
    for group, decay in zip(optimizer.param_groups, decays, strict=False):
        group.update(initial_lr=settings.lr, weight_decay=decay, betas=settings.adam_betas, eps=settings.adam_eps)
    scheduler.base_lrs = [settings.lr for _ in optimizer.param_groups]
    for group, factor in zip(optimizer.param_groups, scheduler.lr_lambdas, strict=False):
        group["lr"] = settings.lr * factor(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]  # what get_last_lr() reports


def check_grad_norm(grad_norm: float, version: int, optimizer: torch.optim.Optimizer) -> None:
    """Refuse a non-finite gradient norm: the gradients are dropped and nothing is applied."""
    if not torch.isfinite(torch.tensor(grad_norm)):
        optimizer.zero_grad(set_to_none=True)
        raise FloatingPointError(f"gradient norm is {grad_norm} at weight version {version}; the step "
                                 "was not applied (check the batch's logprobs and advantages)")


def apply_update(optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler) -> float:
    """One optimizer update and scheduler tick, gradients cleared; the learning rate the update used."""
    lr = float(scheduler.get_last_lr()[0])
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return lr


def step_metrics(metrics: dict[str, float], step: OptimizerStep, *, loss: float, grad_norm: float,
                 lr: float) -> dict[str, float]:
    """``metrics`` (the loss's, summed over micro-batches) with the step's loss, gradient norm, learning rate
    and trained-token count."""
    metrics.update(loss=loss, grad_norm=grad_norm, lr=lr,
                   tokens=float(sum(int(mb.loss_mask.sum()) for mb in step.micro_batches)))
    return metrics
