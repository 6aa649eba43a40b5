"""TEST DOUBLE for ``lego_rl.train.torch_backend.TorchBackend`` until it is merged: ``ReferenceSGDBackend``.

It implements the ``TrainerBackend`` protocol with a real Hugging Face causal LM (the tiny model), real
forward passes and real gradients, but plain SGD (no warm-up, no weight decay, no clipping) and one
segment per forward pass. ``policy_gradient_loss`` is the plain REINFORCE-with-baseline loss
``-(w * A * log pi)`` (GRPO's advantage, no ratio or clipping) standing in for ``train.losses``.
With zero advantages its gradient is exactly zero, so SGD leaves every parameter bit-identical.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from lego_rl.train.backend import LossFn, LossInputs, LossOutput, StepResult
from lego_rl.train.batching import MicroBatch, OptimizerStep


def policy_gradient_loss(x: LossInputs) -> LossOutput:
    """``-sum(token_weights * advantages * logprobs)``: the step's mean over rollouts of token means."""
    per_token = -x.advantages * x.logprobs  # [T]
    loss = (x.token_weights * per_token).sum()  # []
    return LossOutput(loss=loss, metrics={"pg_loss": float(loss.detach())})


class ReferenceSGDBackend:
    """TEST DOUBLE standing in for TorchBackend: real model and gradients, plain SGD, fp32 on CPU."""

    def __init__(self, model_dir: Path, *, lr: float, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32,
                                                          attn_implementation="sdpa")
        self.model.train()
        self.lr = lr
        self.opt = torch.optim.SGD(self.model.parameters(), lr=lr)
        self._version = 0
        self.steps_taken = 0

    @property
    def weight_version(self) -> int:
        return self._version

    def _segment_logprobs(self, mb: MicroBatch, temperature: float) -> torch.Tensor:
        """All segments of the micro-batch in one right-padded forward pass (padding never precedes a real
        token, so causal attention gives every real position the logits of its own segment alone)."""
        cu = mb.cu_seqlens.tolist()
        lengths = [b - a for a, b in zip(cu[:-1], cu[1:], strict=True)]
        width = max(lengths)
        ids = torch.zeros(len(lengths), width, dtype=torch.long)  # [S, L]
        mask = torch.zeros(len(lengths), width, dtype=torch.long)  # [S, L]
        for s, (a, n) in enumerate(zip(cu[:-1], lengths, strict=True)):
            ids[s, :n] = mb.input_ids[a:a + n]
            mask[s, :n] = 1
        logits = self.model(input_ids=ids, attention_mask=mask).logits  # [S, L, V]
        logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # [S, L, V]
        picked = logp[:, :-1].gather(2, ids[:, 1:, None])[..., 0]  # [S, L-1]: token i+1 given tokens <= i
        picked = torch.cat([picked.new_zeros(len(lengths), 1), picked], dim=1)  # [S, L]: position 0 has none
        return torch.cat([picked[s, :n] for s, n in enumerate(lengths)])  # [T]

    def compute_logprobs(self, micro_batches: Sequence[MicroBatch], *, temperature: float) -> list[torch.Tensor]:
        with torch.no_grad():
            return [self._segment_logprobs(mb, temperature) for mb in micro_batches]

    def train_step(self, step: OptimizerStep, loss_fn: LossFn, *, old_logprobs: Sequence[torch.Tensor],
                   temperature: float) -> StepResult:
        self.opt.zero_grad(set_to_none=True)
        counts = torch.tensor(step.rollout_token_counts, dtype=torch.float32)  # [R]
        total = 0.0
        metrics: dict[str, float] = {}
        tokens = 0
        for mb, old in zip(step.micro_batches, old_logprobs, strict=True):
            logprobs = self._segment_logprobs(mb, temperature)  # [T]
            out = loss_fn(LossInputs(
                logprobs=logprobs, old_logprobs=old, rollout_logprobs=mb.rollout_logprobs,
                advantages=mb.advantages, loss_mask=mb.loss_mask, token_weights=mb.token_weights,
                rollout_slots=mb.rollout_slots, rollout_token_counts=counts,
                rollout_log_ratio_elsewhere=torch.zeros_like(counts),  # [R]
            ))
            out.loss.backward()
            total += float(out.loss.detach())
            tokens += int(mb.loss_mask.sum())
            for k, v in out.metrics.items():
                metrics[k] = metrics.get(k, 0.0) + v
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), float("inf"))
        self.opt.step()
        self._version += 1
        self.steps_taken += 1
        return StepResult(metrics={**metrics, "loss": total, "grad_norm": float(grad_norm), "lr": self.lr,
                                   "tokens": float(tokens)}, weight_version=self._version)

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from self.model.state_dict().items()

    def save_checkpoint(self, path: Path, *, extra_state: dict[str, Any]) -> None:
        tmp = path.with_name(path.name + ".partial")
        self.model.save_pretrained(str(tmp), safe_serialization=True)
        torch.save({"optimizer": self.opt.state_dict(), "version": self._version, "extra": extra_state,
                    "rng": torch.get_rng_state()}, tmp / "trainer_state.pt")
        os.replace(tmp, path)  # complete or absent: never a half-written checkpoint under its name

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        from safetensors.torch import load_file

        state = load_file(str(path / "model.safetensors"))
        self.model.load_state_dict(state, strict=False)
        trainer = torch.load(path / "trainer_state.pt", weights_only=False)
        self.opt.load_state_dict(trainer["optimizer"])
        self._version = trainer["version"]
        torch.set_rng_state(trainer["rng"])
        return dict(trainer["extra"])
