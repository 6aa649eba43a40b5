"""The torch trainer backend: one process holds any Hugging Face causal LM and trains it.

``TorchBackend`` implements ``TrainerBackend``. Choices, and why:

* **Packed micro-batches, one forward each.** A micro-batch is one row of ``T`` tokens whose
  ``position_ids`` restart at 0 per segment and no ``attention_mask`` is passed: transformers then derives
  the segments from the position restarts (``masking_utils.find_packed_sequence_indices``) and builds a
  block-diagonal causal mask for SDPA/eager (flash-attention kernels take the same input as varlen
  ``cu_seqlens``). One forward per micro-batch instead of one per segment keeps CPU and GPU busy with
  large matmuls; ``tests/train/test_torch_backend.py`` checks every segment's logprobs against a forward
  of that segment alone, which fails if attention ever crossed a segment boundary.
* **Precision.** fp32 master weights and optimizer state everywhere; the forward runs under bf16 autocast
  on CUDA and in fp32 on CPU (where the resume test is bit-for-bit). Logits are cast to fp32 before
  ``log_softmax``.
* **Logprob convention.** The token's log-probability under the distribution the sampler drew it from:
  ``softmax(logits / T)`` after top-k then top-p, renormalised (``serving.logprobs.sampler_logprobs``; plain
  ``log_softmax(logits / T)`` when nothing is truncated), temperature below ``GREEDY_EPS`` taken as 1 — the
  serving engine's and vLLM's ``processed_logprobs``. Old, new and rollout logprobs then mean one distribution.
* **Optimizer.** AdamW; weight decay on matrices only (not on norms and biases, the usual choice);
  linear warm-up over ``warmup_steps`` optimizer steps, then constant; gradient-norm clipping. A step whose
  gradient norm is not finite raises and leaves the parameters and optimizer state untouched.
* **No dropout.** Old and new logprobs must come from the same deterministic function, or the ratio is noise.
* **KL reference.** With ``reference_model`` a frozen copy of the loaded weights scores each micro-batch
  (``ref_logprobs``) for the loss's k3 KL.

Not here yet: FSDP2 sharding, and feeding the captured nucleus (score centering) from ``MicroBatch``, which
does not carry it; a loss that needs it fails with a message naming the missing inputs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from lego_rl.errors import ConfigError
from lego_rl.runstore.files import write_new
from lego_rl.serving.weights import load_checkpoint_into, load_model
from lego_rl.train.backend import LossFn, LossInputs, StepResult
from lego_rl.train.batching import MicroBatch, OptimizerStep
from lego_rl.train.head_logprobs import DEFAULT_CHUNK, HeadOutputs, head_logprobs
from lego_rl.train.checkpoint import (
    EXTRA_STATE,
    TRAINER_STATE,
    publish_checkpoint,
    read_marker,
    rng_state,
    set_rng_state,
)

_MODEL_SIDE_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
)
"""Copied from the loaded model directory into every checkpoint, so a checkpoint is a servable model."""

_log = logging.getLogger(__name__)


class TorchTrainSettings(BaseModel):
    """What the torch backend needs; ``orchestrate`` projects ``train.*`` onto it once."""

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
    device: str | None = None
    """``cuda``, ``cuda:1``, ``cpu``; None = the first CUDA device if there is one, else CPU."""
    logprob_chunk_tokens: int = Field(default=DEFAULT_CHUNK, ge=0)
    """Positions whose ``[chunk, V]`` logits exist at once when scoring (``train.head_logprobs``); 0 = the
    model's full ``[T, V]`` logits in one piece (the unchunked baseline)."""


def _segment_starts(mb: MicroBatch) -> torch.Tensor:
    """[T] bool, True at each segment's first token (it has no prediction)."""
    starts = torch.zeros(mb.num_tokens, dtype=torch.bool)  # [T]
    starts[mb.cu_seqlens[:-1].long()] = True
    return starts


def _rollout_sums(values: torch.Tensor, mb: MicroBatch, n_rollouts: int) -> torch.Tensor:
    """[R] detached sum over each rollout's trained tokens in ``mb`` of ``values`` [T]."""
    v = values.detach().float().cpu() * mb.loss_mask  # [T]
    return torch.zeros(n_rollouts).index_add(0, mb.rollout_slots, v)  # [R]


def _disable_dropout(model: torch.nn.Module) -> None:
    """Dropout off everywhere: the PPO/GSPO ratio compares two evaluations of one deterministic function
    (old and new logprobs); with dropout on, the ratio would be noise even before any update."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        # Attention layers pass a float to their kernel (``dropout=self.attention_dropout``), no module.
        for key in ("attention_dropout", "dropout"):
            if isinstance(getattr(module, key, None), float):
                setattr(module, key, 0.0)


class TorchBackend:
    """A Hugging Face causal LM trained in this process (see the module docstring)."""

    def __init__(self, model_dir: Path, settings: TorchTrainSettings) -> None:
        self.settings = settings
        self.model_dir = Path(model_dir)
        self.device = torch.device(settings.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(
                f"device {settings.device!r} asked for but CUDA is not available",
                parameter="device",
                value=settings.device,
            )
        self.model, self.config, _ = load_model(self.model_dir, self.device, "float32")
        self.model.train()  # gradient checkpointing only acts in train mode
        _disable_dropout(self.model)
        if settings.gradient_checkpointing:
            # transformers 5.x renamed it (the old name warns); >= 4.51 is supported, which has only the old one.
            if hasattr(self.model, "activation_checkpointing_enable"):
                self.model.activation_checkpointing_enable({"use_reentrant": False})
            else:
                self.model.gradient_checkpointing_enable(
                    gradient_checkpointing_kwargs={"use_reentrant": False}
                )
        self.reference: Any = None
        if settings.reference_model:
            self.reference, _, _ = load_model(self.model_dir, self.device, "float32")
            self.reference.requires_grad_(False)
        decay = [p for p in self.model.parameters() if p.requires_grad and p.dim() >= 2]
        no_decay = [p for p in self.model.parameters() if p.requires_grad and p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": settings.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=settings.lr,
            betas=settings.adam_betas,
            eps=settings.adam_eps,
        )
        warmup = settings.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
        )
        self._version = 0
        self._chunked = settings.logprob_chunk_tokens > 0 and self._probe_chunking()

    # ------------------------------------------------------------------------------------ forward

    @property
    def weight_version(self) -> int:
        return self._version

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _probe_chunking(self) -> bool:
        """Whether this model's logits are ``lm_head(last hidden state)``, so the chunked path computes the
        same numbers: checked once on a short sequence against the model's own logits. False (full logits,
        the unchunked path) for a head that post-processes (logit soft-capping, scaling) or a model whose
        forward takes no ``logits_to_keep``."""
        ids = torch.arange(8, device=self.device) % int(self.config.vocab_size)  # [8]
        mb_pos = torch.arange(8, device=self.device)  # [8]
        try:
            with torch.no_grad(), self._autocast():
                full = self.model(input_ids=ids.unsqueeze(0), position_ids=mb_pos.unsqueeze(0),
                                  use_cache=False).logits[0].float()  # [8, V]
                hidden = self._hidden_states(self.model, ids, mb_pos)  # [8, H]
                mine = self.model.get_output_embeddings()(hidden).float()  # [8, V]
        except (TypeError, AttributeError, NotImplementedError) as exc:
            _log.warning("chunked logprobs disabled for %s: %s", self.model_dir, exc)
            return False
        if mine.shape != full.shape or not torch.allclose(mine, full, rtol=1e-3, atol=1e-3):
            _log.warning("chunked logprobs disabled for %s: lm_head(hidden) is not the model's logits "
                         "(a post-processed head)", self.model_dir)
            return False
        return True

    def _hidden_states(self, model: Any, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """[T, H] the decoder's last hidden state (what ``lm_head`` consumes), from the whole model's forward
        with ``logits_to_keep`` empty: no ``[T, V]`` logits are built, and wrappers that hook the top-level
        module (FSDP) see an ordinary forward."""
        captured: list[torch.Tensor] = []
        handle = model.get_decoder().register_forward_hook(lambda _m, _a, out: captured.append(out[0]))
        try:
            model(input_ids=ids.unsqueeze(0), position_ids=positions.unsqueeze(0), use_cache=False,
                  logits_to_keep=torch.zeros(0, dtype=torch.long, device=ids.device))
        finally:
            handle.remove()
        if len(captured) != 1:
            raise RuntimeError(f"the decoder ran {len(captured)} times in one forward (expected once)")
        return captured[0][0]  # [T, H]

    def _score(
        self, model: Any, mb: MicroBatch, temperature: float, with_entropy: bool, top_p: float = 1.0,
        top_k: int = -1,
    ) -> HeadOutputs:
        """Per token of ``mb`` (``[T]``, aligned with ``input_ids``, 0 at segment starts): logprob under the
        sampler's convention, entropy when asked, and the captured nucleus candidates' logprobs ``[T, K]``
        when the micro-batch carries a nucleus. On the backend's device; carries the gradient when called
        with grad enabled. Chunked over positions unless ``logprob_chunk_tokens`` is 0 or the model's head
        cannot be applied on its own (``_probe_chunking``)."""
        ids = mb.input_ids.to(self.device)  # [T]
        pos = mb.position_ids.to(self.device)  # [T]
        nuc_ids = None if mb.nucleus_ids is None else mb.nucleus_ids[1:].to(self.device)  # [T-1, K]
        nuc_valid = None if mb.nucleus_valid is None else mb.nucleus_valid[1:].to(self.device)  # [T-1, K]
        with self._autocast():
            if self._chunked:
                hidden = self._hidden_states(model, ids, pos)[:-1]  # [T-1, H] position i predicts token i+1
                head = model.get_output_embeddings()
                chunk = self.settings.logprob_chunk_tokens
            else:
                # The unchunked path: the model's own full logits [T-1, V], scored in one piece.
                hidden = model(input_ids=ids.unsqueeze(0), position_ids=pos.unsqueeze(0),
                               use_cache=False).logits[0, :-1]  # [T-1, V]
                head = torch.nn.Identity()
                chunk = max(1, hidden.shape[0])
            out = head_logprobs(head, hidden, ids[1:], temperature=temperature, top_p=top_p, top_k=top_k,
                                with_entropy=with_entropy, nucleus_ids=nuc_ids, nucleus_valid=nuc_valid,
                                chunk=chunk, checkpoint_chunks=self._chunked)
        starts = _segment_starts(mb).to(self.device)  # [T] a segment's first token has no prediction
        lp = torch.cat([out.logprobs.new_zeros(1), out.logprobs])  # [T] aligned with input_ids
        lp = torch.where(starts, torch.zeros_like(lp), lp)  # [T]
        entropy = None
        if out.entropy is not None:
            entropy = torch.where(starts, 0.0, torch.cat([out.entropy.new_zeros(1), out.entropy]))  # [T]
        cand = None
        if out.candidate_logprobs is not None:
            c = out.candidate_logprobs  # [T-1, K]
            cand = torch.cat([c.new_zeros(1, c.shape[1]), c])  # [T, K]
        return HeadOutputs(logprobs=lp, entropy=entropy, candidate_logprobs=cand)

    def _token_logprobs(
        self, model: Any, mb: MicroBatch, temperature: float, with_entropy: bool, top_p: float = 1.0,
        top_k: int = -1,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``([T] logprob of each token given its segment's prefix, 0 at segment starts; [T] entropy or
        None)``, on the backend's device. Carries the gradient when called with grad enabled."""
        out = self._score(model, mb, temperature, with_entropy, top_p, top_k)
        return out.logprobs, out.entropy

    def compute_logprobs(
        self, micro_batches: Sequence[MicroBatch], *, temperature: float, top_p: float = 1.0, top_k: int = -1
    ) -> list[torch.Tensor]:
        out = []
        with torch.no_grad():
            for mb in micro_batches:
                lp, _ = self._token_logprobs(self.model, mb, temperature, with_entropy=False, top_p=top_p,
                                             top_k=top_k)
                out.append(lp.cpu())  # [T]
        return out

    # ------------------------------------------------------------------------------------ training

    def _check_step(self, step: OptimizerStep, old_logprobs: Sequence[torch.Tensor]) -> None:
        if not step.micro_batches:
            raise ValueError(f"optimizer step over rollouts {step.rollout_ids} has no micro-batches")
        if len(old_logprobs) != len(step.micro_batches):
            raise ValueError(
                f"{len(old_logprobs)} old_logprobs tensors for {len(step.micro_batches)} micro-batches"
            )
        for i, (mb, old) in enumerate(zip(step.micro_batches, old_logprobs, strict=True)):
            if tuple(old.shape) != (mb.num_tokens,):
                raise ValueError(
                    f"old_logprobs[{i}] has shape {tuple(old.shape)} but micro-batch {i} has "
                    f"{mb.num_tokens} tokens"
                )

    def _log_ratio_elsewhere(
        self, step: OptimizerStep, old_logprobs: Sequence[torch.Tensor], temperature: float, top_p: float = 1.0,
        top_k: int = -1,
    ) -> list[torch.Tensor]:
        """Per micro-batch ``[R]``: sum of ``current - old`` over its rollouts' tokens in the *other*
        micro-batches (GSPO's sequence ratio). Computed exactly with a no-grad forward of the micro-batches
        whose rollouts span several; zeros for the rest (nothing elsewhere to add)."""
        r = len(step.rollout_ids)
        spans: dict[int, set[int]] = {}
        for i, mb in enumerate(step.micro_batches):
            for slot in mb.rollout_slots[mb.loss_mask > 0].unique().tolist():
                spans.setdefault(slot, set()).add(i)
        shared = {i for members in spans.values() if len(members) > 1 for i in members}
        sums = [torch.zeros(r) for _ in step.micro_batches]  # [R] each
        with torch.no_grad():
            for i in sorted(shared):
                mb = step.micro_batches[i]
                lp, _ = self._token_logprobs(self.model, mb, temperature, with_entropy=False, top_p=top_p,
                                             top_k=top_k)
                sums[i] = _rollout_sums(lp.cpu() - old_logprobs[i], mb, r)  # [R]
        total = torch.stack(sums).sum(0)  # [R]
        return [total - s for s in sums]  # [R] each

    def train_step(
        self,
        step: OptimizerStep,
        loss_fn: LossFn,
        *,
        old_logprobs: Sequence[torch.Tensor],
        temperature: float,
        top_p: float = 1.0,
        top_k: int = -1,
    ) -> StepResult:
        self._check_step(step, old_logprobs)
        r = len(step.rollout_ids)
        counts = torch.tensor(step.rollout_token_counts, dtype=torch.float32)  # [R]
        is_sums = [
            _rollout_sums(old - mb.rollout_logprobs, mb, r)
            for mb, old in zip(step.micro_batches, old_logprobs, strict=True)
        ]  # [R] each
        is_total = torch.stack(is_sums).sum(0)  # [R]
        if getattr(loss_fn, "needs_rollout_log_ratio", True):
            elsewhere = self._log_ratio_elsewhere(step, old_logprobs, temperature, top_p, top_k)
        else:
            elsewhere = [torch.zeros(r) for _ in step.micro_batches]
        dev = self.device
        self.optimizer.zero_grad(set_to_none=True)
        metrics: dict[str, float] = {}
        loss_sum = 0.0
        for i, mb in enumerate(step.micro_batches):
            scored = self._score(self.model, mb, temperature, with_entropy=True, top_p=top_p, top_k=top_k)
            ref = None
            if self.reference is not None:
                with torch.no_grad():
                    ref, _ = self._token_logprobs(self.reference, mb, temperature, with_entropy=False,
                                                  top_p=top_p, top_k=top_k)  # [T]
            inp = LossInputs(
                logprobs=scored.logprobs,  # [T]
                old_logprobs=old_logprobs[i].to(dev),
                rollout_logprobs=mb.rollout_logprobs.to(dev),
                advantages=mb.advantages.to(dev),
                loss_mask=mb.loss_mask.to(dev),
                token_weights=mb.token_weights.to(dev),
                rollout_slots=mb.rollout_slots.to(dev),
                rollout_token_counts=counts.to(dev),
                rollout_log_ratio_elsewhere=elsewhere[i].to(dev),
                rollout_is_log_ratio_elsewhere=(is_total - is_sums[i]).to(dev),
                ref_logprobs=ref,
                entropy=scored.entropy,  # [T]
                nucleus_candidate_logprobs=scored.candidate_logprobs,  # [T, K] when the nucleus was captured
                nucleus_sampler_probs=None if mb.nucleus_probs is None else mb.nucleus_probs.to(dev),  # [T, K]
                nucleus_valid=None if mb.nucleus_valid is None else mb.nucleus_valid.to(dev),  # [T, K]
            )
            out = loss_fn(inp)
            out.loss.backward()  # gradients add up over micro-batches: the token weights carry 1/(N_r R)
            loss_sum += float(out.loss.detach())
            for key, value in out.metrics.items():
                metrics[key] = metrics.get(key, 0.0) + value
        params = [p for p in self.model.parameters() if p.requires_grad]
        max_norm = self.settings.max_grad_norm if self.settings.max_grad_norm is not None else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        if not torch.isfinite(torch.tensor(grad_norm)):
            self.optimizer.zero_grad(set_to_none=True)
            raise FloatingPointError(
                f"gradient norm is {grad_norm} at weight version {self._version}; the step "
                "was not applied (check the batch's logprobs and advantages)"
            )
        lr = float(self.scheduler.get_last_lr()[0])
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._version += 1
        metrics.update(
            loss=loss_sum,
            grad_norm=grad_norm,
            lr=lr,
            tokens=float(sum(int(mb.loss_mask.sum()) for mb in step.micro_batches)),
        )
        return StepResult(metrics=metrics, weight_version=self._version)

    # ------------------------------------------------------------------------------------ weights

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Parameters by their HF names (tied weights once, under the embedding's name), detached views:
        copy them before the next ``train_step`` if they must outlive it."""
        for name, p in self.model.named_parameters():
            yield name, p.detach()

    def save_checkpoint(self, path: Path, *, extra_state: dict[str, Any]) -> None:
        try:
            extra_json = json.dumps(extra_state, indent=2, sort_keys=True) + "\n"
        except TypeError as exc:
            raise ValueError(
                f"extra_state must be JSON-serialisable (the loop's cursor and step): {exc}"
            ) from exc
        state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "weight_version": self._version,
            "rng": rng_state(),
        }

        def fill(tmp: Path) -> None:
            self.model.save_pretrained(str(tmp), safe_serialization=True)
            for name in _MODEL_SIDE_FILES:
                if (self.model_dir / name).is_file() and not (tmp / name).exists():
                    shutil.copy2(self.model_dir / name, tmp / name)
            write_new(tmp / TRAINER_STATE, lambda fh: torch.save(state, fh), what="trainer state")
            write_new(tmp / EXTRA_STATE, extra_json, what="extra state")

        publish_checkpoint(Path(path), fill, info={"weight_version": self._version, "backend": "torch"})

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        path = Path(path)
        read_marker(path)
        load_checkpoint_into(self.model, path)
        state = torch.load(path / TRAINER_STATE, map_location="cpu", weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self._version = int(state["weight_version"])
        set_rng_state(state["rng"])
        extra: dict[str, Any] = json.loads((path / EXTRA_STATE).read_text())
        return extra
