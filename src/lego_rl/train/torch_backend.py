"""The torch trainer backend: one process holds any Hugging Face causal LM and trains it.

``TorchBackend`` implements ``TrainerBackend``. Choices, and why:

* **Packed micro-batches, one forward each.** A micro-batch is one row of ``T`` tokens whose
  ``position_ids`` restart at 0 per segment and no ``attention_mask`` is passed: transformers then derives
  the segments from the position restarts (``masking_utils.find_packed_sequence_indices``) and builds a
  block-diagonal causal mask for SDPA/eager. On CUDA the model attends through varlen flash attention
  instead (``packed_attention``, ``train.varlen_attention``): the segments' ``cu_seqlens`` go to every
  layer and no ``[T, T]`` mask or score matrix exists. One forward per micro-batch instead of one per
  segment keeps CPU and GPU busy with large matmuls; ``tests/train/test_torch_backend.py`` checks every
  segment's logprobs against a forward of that segment alone, which fails if attention ever crossed a
  segment boundary.
* **Precision.** fp32 master weights and optimizer state everywhere; the forward runs under bf16 autocast
  on CUDA and in fp32 on CPU (where the resume test is bit-for-bit); ``precision = "fp32"`` turns autocast
  off on CUDA too (attention then takes the SDPA path). Logits are cast to fp32 before ``log_softmax``.
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

* **Chunked head.** Logprobs come from the decoder's last hidden state through the LM head a chunk of
  positions at a time (``train.head_logprobs``): no ``[T, V]`` logits; a post-processed head (soft-capping,
  scaling) is detected at load and scored from the full logits instead.
* **Captured nucleus.** A micro-batch that carries the sampler's nucleus has it replayed, and the candidates'
  logprobs go to the loss (score centering).
* **Routing replay (R3).** With ``routing_replay`` a MoE model's routers pick the experts the engine chose at
  rollout (``train.routing_replay``): the micro-batches carry them, and a micro-batch without them is refused.
* **FSDP2.** When a process group exists (torchrun), the model is sharded per decoder layer over it; each rank
  runs its round-robin share of a step's micro-batches and the loss is scaled by the world size (FSDP averages
  gradients). ``train.distributed`` keeps the ranks' calls in step.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from pydantic import Field, model_validator

from lego_rl.errors import ConfigError, TrainerOutOfMemory
from lego_rl.runstore.files import write_new
from lego_rl.serving.weights import load_checkpoint_into, load_model
from lego_rl.train.backend import LossFn, OptimizerSettings, StepResult
from lego_rl.train.batching import MicroBatch, OptimizerStep
from lego_rl.train.head_logprobs import DEFAULT_CHUNK, HeadOutputs, head_logprobs
from lego_rl.train.routing_replay import RouteReplay
from lego_rl.train import true_on_policy, varlen_attention
from lego_rl.train.checkpoint import (
    EXTRA_STATE,
    TRAINER_STATE,
    copy_side_files,
    extra_state_json,
    publish_checkpoint,
    read_marker,
    restore_trainer_state,
    trainer_state,
)
from lego_rl.train.step import (
    StepTotals,
    add_metrics,
    apply_update,
    check_grad_norm,
    check_step,
    make_optimizer,
    rebase_optimizer,
    segment_starts,
    step_metrics,
    sum_parts,
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


class TorchTrainSettings(OptimizerSettings):
    """What the torch backend needs; ``compose.train_session`` projects ``train.*`` onto it once."""

    device: str | None = None
    """``cuda``, ``cuda:1``, ``cpu``; None = the first CUDA device if there is one, else CPU."""
    logprob_chunk_tokens: int = Field(default=DEFAULT_CHUNK, ge=0)
    """Positions whose ``[chunk, V]`` logits exist at once when scoring (``train.head_logprobs``); 0 = the
    model's full ``[T, V]`` logits in one piece (the unchunked baseline)."""
    packed_attention: Literal["auto", "varlen", "sdpa"] = "auto"
    """How attention keeps a packed micro-batch's segments apart. ``varlen``: torch's variable-length flash
    attention over the segments' ``cu_seqlens`` (CUDA only; cost ``Σ len²``); ``sdpa``: the model's own
    attention with the block-diagonal mask transformers builds from the position restarts (cost ``T²``);
    ``auto``: varlen wherever it can run (``train.varlen_attention.unsupported_reason``: CUDA, bf16 compute),
    else sdpa."""
    precision: Literal["bf16", "fp32"] = "bf16"
    """The forward's compute on CUDA (``train.precision``): ``bf16`` = bf16 autocast over the fp32 master weights;
    ``fp32`` = autocast off, fp32 throughout (parity checks; attention then goes through SDPA, as varlen's flash
    kernel takes no fp32). CPU always computes in fp32."""

    @model_validator(mode="after")
    def _varlen_needs_half(self) -> TorchTrainSettings:
        if self.packed_attention == "varlen" and self.precision == "fp32":
            raise ConfigError("packed_attention 'varlen' cannot run with precision 'fp32': "
                              f"{varlen_attention.dtype_reason(torch.float32)} (use 'auto' or 'sdpa')",
                              parameter="packed_attention", value=self.packed_attention)
        return self
    true_on_policy: bool = False
    """``train.true_on_policy``: the forward through the engine's batch-invariant ops (``train.true_on_policy``'s
    module), so every token's logprob is bit-identical to what the embedded engine (in the same mode) sampled it
    with. Autocast is off; the casts to bf16 (CUDA) are explicit. ``packed_attention`` is not used."""
    routing_replay: bool = False
    """R3: force the rollout's routed experts in every forward (``rollout.use_rollout_routing_replay``); MoE
    models only, and every micro-batch must carry the routes of its trained tokens' prefixes."""


def _read_checkpoint(path: Path, model: Any) -> dict[str, torch.Tensor]:
    """The checkpoint's weights as a full state dict of ``model``'s names (FSDP's loader takes every key: a
    tied ``lm_head.weight`` the file leaves out is the embedding's tensor)."""
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"{path} holds no *.safetensors checkpoint", parameter="weights_path", value=str(path))
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    emb_name = next(n for n, p in model.named_parameters() if p is model.get_input_embeddings().weight)
    if getattr(model.config, "tie_word_embeddings", False) and "lm_head.weight" not in state:
        state["lm_head.weight"] = state[emb_name]
    return state


def out_of_memory_message(
    mb: MicroBatch, what: str, device: torch.device, checkpointing: bool, exc: BaseException
) -> str:
    """What ran out, on what, and the settings that make the micro-batch fit, most effective first."""
    lengths = (mb.cu_seqlens[1:] - mb.cu_seqlens[:-1]).tolist()
    longest = max(lengths) if lengths else mb.num_tokens
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    hints = [] if checkpointing else ["train.gradient_checkpointing = true (keeps one layer's activations, not all)"]
    hints.append(f"a lower train.micro_batch_tokens (a segment is never split: its longest, {longest}, is the floor)")
    hints.append("a lower model.max_context_tokens, or the trainer sharded over more GPUs (torchrun: FSDP2)")
    return (f"{what} ran out of memory on {device} with a micro-batch of {mb.num_tokens} tokens in {len(lengths)} "
            f"segment(s), the longest {longest} ({first}); the step was not applied. To fit it: " + "; ".join(hints))


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
        # Data parallel (FSDP2) whenever a process group exists: torchrun started this process as one rank.
        self.world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self.rank = dist.get_rank() if self.world > 1 else 0
        if self.world > 1 and self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(
                f"device {settings.device!r} asked for but CUDA is not available",
                parameter="device",
                value=settings.device,
            )
        self.model, self.config, _ = load_model(self.model_dir, self.device, "float32")
        self._invariant = settings.true_on_policy
        if self._invariant:
            if settings.routing_replay or self.world > 1:
                raise ConfigError("train.true_on_policy runs one trainer process without routing replay",
                                  parameter="true_on_policy", value=True)
            reason = true_on_policy.unsupported_reason(self.model, self.device, self.compute_dtype)
            if reason is not None:
                raise ConfigError(f"train.true_on_policy cannot train {self.model_dir}: {reason}",
                                  parameter="true_on_policy", value=True)
            true_on_policy.install(self.model, self.compute_dtype)
            self._varlen = False
        else:
            self._varlen = self._choose_attention(self.model)
        self.model.train()  # gradient checkpointing only acts in train mode
        if self.world > 1:
            self._shard()
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
            if self._invariant:
                true_on_policy.install(self.reference, self.compute_dtype)
            elif self._varlen:
                varlen_attention.install(self.reference)
        # One replayer per model that scores micro-batches (the reference routes like the policy did).
        self._replays: dict[int, RouteReplay] = {}
        if settings.routing_replay:
            for m in (self.model, self.reference):
                if m is None:
                    continue
                try:
                    self._replays[id(m)] = RouteReplay(m)
                except ValueError as exc:
                    raise ConfigError(f"{self.model_dir}: {exc}", parameter="rollout.use_rollout_routing_replay",
                                      value=True) from None
        self.optimizer, self.scheduler = make_optimizer(
            [p for p in self.model.parameters() if p.requires_grad], settings)
        self._version = 0
        self._chunked = settings.logprob_chunk_tokens > 0 and self._probe_chunking()

    def _choose_attention(self, model: Any) -> bool:
        """Switch ``model`` to varlen attention when ``packed_attention`` asks for it and it can run; whether it
        did. ``varlen`` where it cannot run is a ConfigError naming the reason."""
        mode = self.settings.packed_attention
        if mode == "sdpa":
            return False
        reason = varlen_attention.unsupported_reason(model, self.device, self.compute_dtype)
        if reason is not None:
            if mode == "varlen":
                raise ConfigError(f"packed_attention 'varlen' cannot run here: {reason} (use 'auto' or 'sdpa')",
                                  parameter="packed_attention", value=mode)
            return False
        varlen_attention.install(model)
        _log.info("torch backend: packed micro-batches attend through varlen flash attention")
        return True

    def _segments(self, mb: MicroBatch) -> dict[str, Any]:
        """The forward's keyword arguments that carry ``mb``'s segment boundaries to varlen attention ({} on
        the SDPA path, which reads them from the position restarts)."""
        if not (self._varlen or self._invariant):
            return {}
        if int(mb.cu_seqlens[-1]) != mb.num_tokens:
            raise ValueError(f"micro-batch segments end at {int(mb.cu_seqlens[-1])}, not at its {mb.num_tokens} "
                             "tokens: varlen attention would leave the rest uncomputed")
        return varlen_attention.packed_kwargs(mb.cu_seqlens, self.device)

    def _shard(self) -> None:
        """FSDP2 over this host's ranks: each decoder layer is one unit (all-gathered for its forward and
        backward, resharded after), the root holds embeddings, final norm and head. Gradients are
        reduce-scattered as the mean over ranks; ``train_step`` scales each rank's loss by the world size so
        that the result is the step's full gradient (a sum over micro-batches wherever they ran). Done with the
        loss rather than ``set_gradient_divide_factor(1.0)``: gloo has no PREMUL_SUM for that."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(self.device.type, (self.world,))
        for layer in getattr(self.model.get_decoder(), "layers", []):
            fully_shard(layer, mesh=mesh)
        fully_shard(self.model, mesh=mesh)

    def _my_share(self, n: int) -> list[int | None]:
        """Indices of ``n`` micro-batches this rank runs, round-robin, padded with None to the same count on
        every rank: a sharded forward is a collective, so every rank must run as many as the others."""
        per_rank = -(-n // self.world)
        return [i if i < n else None for i in range(self.rank, per_rank * self.world, self.world)]

    # ------------------------------------------------------------------------------------ forward

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps taken, as AdamW counts them (``train.audit``)."""
        from lego_rl.train.audit import adam_steps

        return adam_steps(self.optimizer)

    def local_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """This rank's shard of every trained parameter (the local part of FSDP2's DTensors)."""
        for name, p in self.model.named_parameters():
            if p.requires_grad:
                yield name, p.to_local() if hasattr(p, "to_local") else p

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype of the forward's matmuls and attention: bf16 under CUDA autocast, else fp32."""
        return torch.bfloat16 if self.device.type == "cuda" and self.settings.precision == "bf16" else torch.float32

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.compute_dtype == torch.bfloat16 and not self._invariant:  # true_on_policy casts explicitly
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

    def _hidden_states(self, model: Any, ids: torch.Tensor, positions: torch.Tensor,
                       segments: dict[str, Any] | None = None) -> torch.Tensor:
        """[T, H] the decoder's last hidden state (what ``lm_head`` consumes), from the whole model's forward
        with ``logits_to_keep`` empty: no ``[T, V]`` logits are built, and wrappers that hook the top-level
        module (FSDP) see an ordinary forward."""
        captured: list[torch.Tensor] = []
        handle = model.get_decoder().register_forward_hook(lambda _m, _a, out: captured.append(out[0]))
        try:
            model(input_ids=ids.unsqueeze(0), position_ids=positions.unsqueeze(0), use_cache=False,
                  logits_to_keep=torch.zeros(0, dtype=torch.long, device=ids.device), **(segments or {}))
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
                hidden = self._hidden_states(model, ids, pos, self._segments(mb))[:-1]  # [T-1, H] i predicts i+1
                head = model.get_output_embeddings()
                chunk = self.settings.logprob_chunk_tokens
            else:
                # The unchunked path: the model's own full logits [T-1, V], scored in one piece.
                hidden = model(input_ids=ids.unsqueeze(0), position_ids=pos.unsqueeze(0), use_cache=False,
                               **self._segments(mb)).logits[0, :-1]  # [T-1, V]
                head = torch.nn.Identity()
                chunk = max(1, hidden.shape[0])
            out = head_logprobs(head, hidden, ids[1:], temperature=temperature, top_p=top_p, top_k=top_k,
                                with_entropy=with_entropy, nucleus_ids=nuc_ids, nucleus_valid=nuc_valid,
                                chunk=chunk, checkpoint_chunks=self._chunked,
                                log_softmax=true_on_policy.log_softmax if self._invariant else None)
        starts = segment_starts(mb).to(self.device)  # [T] a segment's first token has no prediction
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

    @contextlib.contextmanager
    def _replaying(self, mb: MicroBatch, *models: Any) -> Iterator[None]:
        """Replay ``mb``'s routes in ``models``' forwards (and backward recomputation) inside the block; a no-op
        without ``routing_replay``. Refuses a micro-batch whose routes are missing, short or not this model's."""
        replays = [self._replays[id(m)] for m in models if m is not None and id(m) in self._replays]
        if not replays:
            yield
            return
        experts, valid = replays[0].check(mb)  # [T, L, K], [T]
        experts, valid = experts.to(self.device), valid.to(self.device)
        for r in replays:
            r.set(experts, valid)
        try:
            yield
        finally:
            for r in replays:
                r.clear()

    def _token_logprobs(
        self, model: Any, mb: MicroBatch, temperature: float, with_entropy: bool, top_p: float = 1.0,
        top_k: int = -1,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``([T] logprob of each token given its segment's prefix, 0 at segment starts; [T] entropy or
        None)``, on the backend's device. Carries the gradient when called with grad enabled."""
        with self._replaying(mb, model):
            out = self._score(model, mb, temperature, with_entropy, top_p, top_k)
        return out.logprobs, out.entropy

    def compute_logprobs(
        self, micro_batches: Sequence[MicroBatch], *, temperature: float, top_p: float = 1.0, top_k: int = -1
    ) -> list[torch.Tensor]:
        if self.world > 1:
            return self._compute_logprobs_sharded(micro_batches, temperature=temperature, top_p=top_p, top_k=top_k)
        out = []
        with torch.no_grad():
            for mb in micro_batches:
                with self._memory_guard(mb, "scoring"):
                    lp, _ = self._token_logprobs(self.model, mb, temperature, with_entropy=False, top_p=top_p,
                                                 top_k=top_k)
                out.append(lp.cpu())  # [T]
        return out

    def _compute_logprobs_sharded(
        self, micro_batches: Sequence[MicroBatch], *, temperature: float, top_p: float, top_k: int
    ) -> list[torch.Tensor]:
        """Each rank scores its share (a padding slot re-scores micro-batch 0 and drops it); every rank gets
        every result."""
        mine: dict[int, torch.Tensor] = {}
        with torch.no_grad():
            for i in self._my_share(len(micro_batches)):
                mb = micro_batches[0 if i is None else i]
                with self._memory_guard(mb, "scoring"):
                    lp, _ = self._token_logprobs(self.model, mb, temperature, with_entropy=False, top_p=top_p,
                                                 top_k=top_k)
                if i is not None:
                    mine[i] = lp.cpu()  # [T]
        gathered: list[dict[int, torch.Tensor]] = [{} for _ in range(self.world)]
        dist.all_gather_object(gathered, mine)
        merged = {i: lp for part in gathered for i, lp in part.items()}
        return [merged[i] for i in range(len(micro_batches))]

    @contextlib.contextmanager
    def _memory_guard(self, mb: MicroBatch, what: str) -> Iterator[None]:
        """An allocator failure on ``mb`` becomes TrainerOutOfMemory naming the micro-batch and what shrinks it;
        the partial gradients are dropped so the caller's memory comes back and no half step is applied."""
        try:
            yield
        except torch.OutOfMemoryError as exc:
            self.optimizer.zero_grad(set_to_none=True)
            raise TrainerOutOfMemory(
                out_of_memory_message(mb, what, self.device, self.settings.gradient_checkpointing, exc)
            ) from exc

    # ------------------------------------------------------------------------------------ training

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
        check_step(step, old_logprobs)
        totals = StepTotals.of(step, old_logprobs, loss_fn, functools.partial(
            self.compute_logprobs, temperature=temperature, top_p=top_p, top_k=top_k))
        dev = self.device
        self.optimizer.zero_grad(set_to_none=True)
        metrics: dict[str, float] = {}
        loss_sum = 0.0
        for slot in self._my_share(len(step.micro_batches)):
            i = 0 if slot is None else slot  # a padding slot reruns micro-batch 0 with its loss zeroed
            mb = step.micro_batches[i]
            # Routes stay set through backward: checkpointed layers re-run their routers there.
            with self._memory_guard(mb, "training"), self._replaying(mb, self.model):
                scored = self._score(self.model, mb, temperature, with_entropy=True, top_p=top_p, top_k=top_k)
                ref = None
                if self.reference is not None:
                    with torch.no_grad():
                        ref, _ = self._token_logprobs(self.reference, mb, temperature, with_entropy=False,
                                                      top_p=top_p, top_k=top_k)  # [T]
                out = loss_fn(totals.loss_inputs(
                    i, mb, dev, logprobs=scored.logprobs, old_logprobs=old_logprobs[i], entropy=scored.entropy,
                    ref_logprobs=ref, nucleus_candidate_logprobs=scored.candidate_logprobs, nucleus=True))
                # Gradients add up over micro-batches (the token weights carry 1/(N_r R)); FSDP averages over
                # ranks, so each rank's share is scaled by the world size to keep the sum.
                scale = 0.0 if slot is None else float(self.world)
                (out.loss * scale).backward()
            if slot is None:
                continue
            loss_sum += float(out.loss.detach())
            add_metrics(metrics, out.metrics)
        if self.world > 1:
            parts: list[tuple[float, dict[str, float]]] = [(0.0, {}) for _ in range(self.world)]
            dist.all_gather_object(parts, (loss_sum, metrics))
            loss_sum, metrics = sum_parts(parts)
        params = [p for p in self.model.parameters() if p.requires_grad]
        max_norm = self.settings.max_grad_norm if self.settings.max_grad_norm is not None else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        check_grad_norm(grad_norm, self._version, self.optimizer)
        lr = apply_update(self.optimizer, self.scheduler)
        self._version += 1
        return StepResult(metrics=step_metrics(metrics, step, loss=loss_sum, grad_norm=grad_norm, lr=lr),
                          weight_version=self._version)

    # ------------------------------------------------------------------------------------ weights

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Parameters by their HF names (tied weights once, under the embedding's name), detached views:
        copy them before the next ``train_step`` if they must outlive it."""
        for name, p in self.model.named_parameters():
            # Sharded (FSDP2): every rank must walk this together, each all-gather is a collective.
            yield name, (p.full_tensor() if hasattr(p, "full_tensor") else p).detach()

    def save_checkpoint(self, path: Path, *, extra_state: dict[str, Any]) -> None:
        extra_json = extra_state_json(extra_state)
        model_state: dict[str, Any] | None = None
        if self.world > 1:
            # Sharded: gather full tensors to rank 0 (CPU), which writes the same files a single process does;
            # the optimizer state is keyed by parameter name there, so any world size can resume from it.
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                get_model_state_dict,
                get_optimizer_state_dict,
            )

            opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
            self.model.reshard()  # the root stays unsharded after a forward; state dicts work on the shards
            model_state = get_model_state_dict(self.model, options=opts)
            optimizer_state: dict[str, Any] = {"by_name": get_optimizer_state_dict(self.model, self.optimizer,
                                                                                  options=opts)}
        else:
            optimizer_state = self.optimizer.state_dict()
        state = trainer_state(optimizer_state, self.scheduler, self._version)

        def fill(tmp: Path) -> None:
            self.model.save_pretrained(str(tmp), safe_serialization=True, state_dict=model_state)
            copy_side_files(self.model_dir, tmp, _MODEL_SIDE_FILES)
            write_new(tmp / TRAINER_STATE, lambda fh: torch.save(state, fh), what="trainer state")
            write_new(tmp / EXTRA_STATE, extra_json, what="extra state")

        if self.rank == 0:
            publish_checkpoint(Path(path), fill, info={"weight_version": self._version, "backend": "torch",
                                                       "world_size": self.world})
        if self.world > 1:
            dist.barrier()  # no rank reads the checkpoint before rank 0 has published it

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        path = Path(path)
        read_marker(path)
        state = torch.load(path / TRAINER_STATE, map_location="cpu", weights_only=True)
        by_name = isinstance(state["optimizer"], dict) and "by_name" in state["optimizer"]
        if self.world > 1 or by_name:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
                set_optimizer_state_dict,
            )

            if not by_name:
                raise ValueError(f"checkpoint {path} was written by one process (optimizer state by position); "
                                 f"resume it with one process, not {self.world}")
            opts = StateDictOptions(full_state_dict=True)
            if self.world > 1:
                self.model.reshard()  # the root stays unsharded after a forward; loading writes the shards
                full: dict[str, Any] = _read_checkpoint(path, self.model)
                set_model_state_dict(self.model, full, options=opts)
            else:
                load_checkpoint_into(self.model, path)
            set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"]["by_name"], options=opts)
        else:
            load_checkpoint_into(self.model, path)
            self.optimizer.load_state_dict(state["optimizer"])
        self._version, extra = restore_trainer_state(path, state, self.scheduler)
        rebase_optimizer(self.optimizer, self.scheduler, self.settings)  # the config's lr, not the saved one
        return extra
