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
  the ranks' micro-batches are padded into rounds of equal token counts (``_rounds``), which the dispatcher's
  equal-size collectives need. With ``routing_replay`` (R3) each router is handed the rollout's experts
  through megatron-core's own ``RouterReplay`` (``train.routing_replay`` builds and checks them).

Precision, packing and the logprob convention are ``megatron_model``'s (fp32 params, bf16 autocast on CUDA;
segments attend within themselves; the sampler's top-p/top-k convention).
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from pydantic import Field

from lego_rl.errors import ConfigError
from lego_rl.runstore.files import write_new
from lego_rl.serving.sampler import GREEDY_EPS
from lego_rl.train.backend import LossFn, LossInputs, OptimizerSettings, StepResult
from lego_rl.train.batching import MicroBatch, OptimizerStep
from lego_rl.train.checkpoint import EXTRA_STATE, publish_checkpoint, read_marker, rng_state, set_rng_state
from lego_rl.train.megatron_convert import (
    Qwen3Shape,
    Split,
    check_ep,
    check_pp,
    check_sp,
    check_tp,
    expert_rank_of,
    full_shape,
    hf_to_mcore,
    mcore_names,
    mcore_split,
    mcore_to_hf,
    padded_vocab,
    pipeline_stage_of,
    shard,
    unshard,
)

if TYPE_CHECKING:
    from lego_rl.train.megatron_model import ParallelLayout

MEGATRON_EXTRA_HINT = "install the megatron extra: pip install 'lego-rl[megatron]' (megatron-core)"

_MODEL_SIDE_FILES = (
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja",
)
"""Copied from the loaded model directory into every checkpoint, so a checkpoint is a servable model."""


_PER_HEAD_NORMS = ("self_attention.q_layernorm.weight", "self_attention.k_layernorm.weight")
"""Replicated parameters whose gradient is split across TP ranks (each rank normalises only its heads)."""


@functools.cache
def _fused_experts() -> bool:
    """Whether this transformers keeps a Qwen3-MoE layer's experts as stacked ``experts.gate_up_proj`` /
    ``experts.down_proj`` parameters (>= 5) rather than one module per expert: the names the engine's
    ``update_weights`` takes. Asked of a two-expert block built on the meta device (no memory)."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    cfg = Qwen3MoeConfig(hidden_size=8, moe_intermediate_size=4, num_experts=2, num_experts_per_tok=1)
    with torch.device("meta"):
        names = {n for n, _ in Qwen3MoeSparseMoeBlock(cfg).named_parameters()}
    return "experts.gate_up_proj" in names


def require_megatron() -> None:
    """A ``ConfigError`` naming the extra when megatron-core is not importable."""
    try:
        import megatron.core  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"train.backend = \"megatron\" needs megatron-core, which is not installed ({exc}); "
                          f"{MEGATRON_EXTRA_HINT}", parameter="train.backend", value="megatron") from None


class MegatronTrainSettings(OptimizerSettings):
    """What the Megatron backend needs; ``orchestrate`` projects ``train.*`` onto it once (gradient
    checkpointing: Megatron full recomputation, one layer per unit)."""

    gradient_checkpointing: bool | None = False  # type: ignore[assignment]
    """Full recomputation; None (what train.gradient_checkpointing's unset default maps to) = on wherever
    megatron-core can recompute: on CUDA (its recompute forks the CUDA RNG tracker), not on CPU."""
    tensor_parallel: int = Field(default=1, ge=1)
    """TP size (train.tensor_parallel): must divide the model's KV heads, heads and FFN width."""
    pipeline_parallel: int = Field(default=1, ge=1)
    """PP size (train.pipeline_parallel): must divide the model's layers."""
    data_parallel: int | None = Field(default=None, ge=1)
    """DP size (train.data_parallel); None = the trainer processes / (TP × PP)."""
    expert_parallel: int = Field(default=1, ge=1)
    """EP size (train.expert_parallel): MoE experts split over this many of the DP ranks; TP = 1."""
    sequence_parallel: bool = False
    """Split activations outside the TP regions along the sequence (train.sequence_parallel; TP > 1, one
    pipeline stage): less activation memory, and what lets a MoE model train under TP."""
    device: str | None = None
    """``cuda`` (this rank's ``LOCAL_RANK`` device) or ``cpu``; None = CUDA if available."""
    bf16: bool = True
    """bf16 autocast for the forward on CUDA (parameters and optimizer stay fp32); False = fp32 throughout
    (parity checks). CPU always runs fp32."""
    routing_replay: bool = False
    """R3: force the rollout's routed experts in every forward (``rollout.use_rollout_routing_replay``); MoE
    models only, and every micro-batch must carry the routes of its trained tokens' prefixes."""


def _segment_starts(mb: MicroBatch) -> torch.Tensor:
    """[T] bool, True at each segment's first token (it has no prediction)."""
    starts = torch.zeros(mb.num_tokens, dtype=torch.bool)  # [T]
    starts[mb.cu_seqlens[:-1].long()] = True
    return starts


def _rollout_sums(values: torch.Tensor, mb: MicroBatch, n_rollouts: int) -> torch.Tensor:
    """[R] detached sum over each rollout's trained tokens in ``mb`` of ``values`` [T]."""
    v = values.detach().float().cpu() * mb.loss_mask  # [T]
    return torch.zeros(n_rollouts).index_add(0, mb.rollout_slots, v)  # [R]


def _padded(mb: MicroBatch, length: int) -> MicroBatch:
    """``mb`` with one padding segment appended up to ``length`` tokens: token id 0, loss mask, token weight,
    advantage and logprobs 0, no route (R3 replays experts 0..k-1 there), its own ``cu_seqlens`` entry so it
    attends only to itself. Nothing of ``mb`` changes: its positions attend to what they did, and the padding's
    terms in every loss are weighted 0. ``mb`` cut to 0 tokens becomes a micro-batch of padding only."""
    extra = length - mb.num_tokens
    if extra <= 0:
        return mb

    def grow(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, t.new_zeros((extra, *t.shape[1:]))])  # [length, ...]

    def maybe(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else grow(t)

    return MicroBatch(
        input_ids=grow(mb.input_ids),  # [length]
        position_ids=torch.cat([mb.position_ids, torch.arange(extra, dtype=mb.position_ids.dtype)]),  # [length]
        cu_seqlens=torch.cat([mb.cu_seqlens, mb.cu_seqlens.new_tensor([length])]),  # [S+2]
        loss_mask=grow(mb.loss_mask), rollout_logprobs=grow(mb.rollout_logprobs), advantages=grow(mb.advantages),
        token_weights=grow(mb.token_weights), rollout_slots=grow(mb.rollout_slots),  # [length] each
        sample_indices=list(mb.sample_indices), nucleus_ids=maybe(mb.nucleus_ids),
        nucleus_probs=maybe(mb.nucleus_probs), nucleus_valid=maybe(mb.nucleus_valid),  # [length, K]
        routed_experts=maybe(mb.routed_experts), routes_valid=maybe(mb.routes_valid))  # [length, L, K], [length]


def _blank(like: MicroBatch, length: int) -> MicroBatch:
    """A micro-batch of ``length`` padding tokens (one segment), with ``like``'s optional fields."""
    cut = MicroBatch(
        input_ids=like.input_ids[:0], position_ids=like.position_ids[:0], cu_seqlens=like.cu_seqlens[:1],
        loss_mask=like.loss_mask[:0], rollout_logprobs=like.rollout_logprobs[:0], advantages=like.advantages[:0],
        token_weights=like.token_weights[:0], rollout_slots=like.rollout_slots[:0], sample_indices=[],
        **{name: None if getattr(like, name) is None else getattr(like, name)[:0] for name in (
            "nucleus_ids", "nucleus_probs", "nucleus_valid", "routed_experts", "routes_valid")})
    return _padded(cut, length)


def _hf_reader(path: Path) -> Any:
    """``get(name) -> Tensor`` over a directory's safetensors files (one or an index of shards)."""
    from safetensors import safe_open

    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted({path / f for f in json.loads(index.read_text())["weight_map"].values()})
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"{path} holds no *.safetensors weights", parameter="model.checkpoint", value=str(path))
    where: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():  # noqa: SIM118 - safe_open has keys(), no __iter__
                where[key] = f

    def get(name: str) -> torch.Tensor:
        if name not in where:
            raise ConfigError(f"{path}: tensor {name!r} is missing (is this a dense Qwen3 checkpoint?)",
                              parameter="model.checkpoint", value=str(path))
        with safe_open(str(where[name]), framework="pt") as fh:
            return fh.get_tensor(name).float()

    return get


class MegatronBackend:
    """A Qwen3-architecture policy held by megatron-core (see the module docstring)."""

    def __init__(self, model_dir: Path, settings: MegatronTrainSettings) -> None:
        require_megatron()
        from lego_rl.train import megatron_model as mm

        self._mm = mm
        self.settings = settings
        self.model_dir = Path(model_dir)
        cfg_path = self.model_dir / "config.json"
        if not cfg_path.is_file():
            raise ConfigError(f"{self.model_dir} is not a model directory (no config.json)",
                              parameter="model.checkpoint", value=str(self.model_dir))
        self.shape = Qwen3Shape.from_hf_config(json.loads(cfg_path.read_text()), source=str(cfg_path))
        if settings.routing_replay and not self.shape.num_experts:
            raise ConfigError(f"{cfg_path}: routing replay needs a mixture-of-experts model; this one is dense",
                              parameter="rollout.use_rollout_routing_replay", value=True)
        check_tp(self.shape, settings.tensor_parallel, sequence_parallel=settings.sequence_parallel)
        check_pp(self.shape, settings.pipeline_parallel)
        check_ep(self.shape, settings.expert_parallel, settings.tensor_parallel)
        check_sp(settings.sequence_parallel, settings.pipeline_parallel)
        self.device = self._pick_device(settings.device)
        self.layout: ParallelLayout = mm.init_parallel(settings.tensor_parallel, settings.pipeline_parallel,
                                                       settings.data_parallel, self.device,
                                                       ep=settings.expert_parallel)
        self.stage = mm.pipeline_stage(self.layout)
        self._pp_ranks = self._pipeline_ranks()
        self.vocab_rows = padded_vocab(self.shape.vocab, settings.tensor_parallel)
        self._tied_copy = self.shape.tied and self.layout.pp > 1 and self.stage.last
        """This stage holds ``output_layer.weight`` as a copy of the first stage's tied embedding."""
        self._stage_names = [n for n in mcore_names(self.shape)
                             if pipeline_stage_of(n, self.shape.num_layers, self.layout.pp) == self.layout.pp_rank]
        """Every parameter of this stage by global name, other expert-parallel ranks' experts included."""
        self._names = [n for n in self._stage_names
                       if expert_rank_of(n, self.shape.num_experts, self.layout.ep) in (None, self.layout.ep_rank)]
        if self._tied_copy:
            self._names.append("output_layer.weight")
        recompute = settings.gradient_checkpointing
        if recompute is None:
            recompute = self.device.type == "cuda"
        elif recompute and self.device.type != "cuda":
            raise ConfigError(f"train.gradient_checkpointing = true with the Megatron backend needs CUDA "
                              f"(megatron-core recomputes under its CUDA RNG tracker); this trainer runs on "
                              f"{self.device}: leave the key unset", parameter="train.gradient_checkpointing",
                              value=True)
        self.recompute = recompute
        self.model = self._build(recompute=recompute)
        self._load_hf(self.model, self.model_dir)
        self.model.train()
        self.reference: Any = None
        if settings.reference_model:
            self.reference = self._build(recompute=False)
            self._load_hf(self.reference, self.model_dir)
            self.reference.requires_grad_(False)
        named = self._global_params(self.model)
        self._params = [named[n] for n in self._names]  # this stage's parameters, this rank's shards
        self._full_shapes = self._gather_full_shapes()
        decay = [p for p in self._params if p.dim() >= 2]
        no_decay = [p for p in self._params if p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=settings.lr, betas=settings.adam_betas, eps=settings.adam_eps,
            fused=self.device.type == "cuda",  # one kernel over all shards instead of a launch per tensor
        )
        warmup = settings.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0)
        self._version = 0

    # ------------------------------------------------------------------------------------ setup

    @staticmethod
    def _pick_device(name: str | None) -> torch.device:
        import os

        if name is None:
            name = "cuda" if torch.cuda.is_available() else "cpu"
        device = torch.device(name)
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise ConfigError(f"device {name!r} asked for but CUDA is not available", parameter="device",
                                  value=name)
            if device.index is None:  # one GPU per rank: torchrun's LOCAL_RANK names it
                device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        return device

    def _pipeline_ranks(self) -> list[int]:
        """Global ranks of this rank's pipeline group, by stage."""
        if self.layout.pp == 1:
            return [self.layout.rank]
        from megatron.core import parallel_state as ps

        return dist.get_process_group_ranks(ps.get_pipeline_model_parallel_group())

    def _global_params(self, model: Any) -> dict[str, Any]:
        """``model``'s parameters by their global Megatron names: a stage numbers its layers from 0, and each
        layer's ``layer_number`` (1-based) is its place in the whole model; an expert-parallel rank numbers its
        experts from 0, and local expert ``l`` is global expert ``ep_rank·E/EP + l``."""
        out: dict[str, Any] = {}
        per_rank = self.shape.num_experts // self.layout.ep
        for name, p in model.named_parameters():
            parts = name.split(".", 3)
            if parts[:2] == ["decoder", "layers"]:
                rest = parts[3]
                if self.layout.ep > 1 and rest.startswith("mlp.experts.local_experts."):
                    _, _, _, local, tail = rest.split(".", 4)
                    rest = f"mlp.experts.local_experts.{self.layout.ep_rank * per_rank + int(local)}.{tail}"
                name = f"decoder.layers.{model.decoder.layers[int(parts[2])].layer_number - 1}.{rest}"
            out[name] = p
        return out

    def _gather_full_shapes(self) -> dict[str, tuple[int, ...]]:
        """Full (TP-gathered) shape of every parameter of every stage: rank 0 receives other stages' tensors
        into buffers of these shapes. A collective over the pipeline group, once, before any pipeline message:
        with NCCL the group's first collective must involve all of its ranks (``pipeline.Stage.group``)."""
        mine = {n: full_shape(n, p.shape, self.layout.tp) for n, p in zip(self._names, self._params, strict=True)}
        for name in self._stage_names:  # other expert-parallel ranks' experts: shaped like this rank's
            if name not in mine:
                mine[name] = mine[self._local_twin(name)]
        if self.layout.pp == 1:
            return mine
        from megatron.core import parallel_state as ps

        parts: list[Any] = [None] * self.layout.pp
        dist.all_gather_object(parts, mine, group=ps.get_pipeline_model_parallel_group())
        merged: dict[str, tuple[int, ...]] = {}
        for part in parts:
            merged.update(part)
        return merged

    def _build(self, *, recompute: bool) -> Any:
        model = self._mm.build_gpt(self.shape, vocab_rows=self.vocab_rows, tp=self.layout.tp, device=self.device,
                                   recompute=recompute, routing_replay=self.settings.routing_replay,
                                   pp=self.layout.pp, pp_rank=self.layout.pp_rank, ep=self.layout.ep,
                                   sequence_parallel=self.settings.sequence_parallel)
        have = set(self._global_params(model))
        want = set(self._names)
        if have != want:  # a megatron-core whose local spec names parameters differently than the mapping
            raise RuntimeError(f"megatron-core's GPTModel parameters do not match the Qwen3 mapping: only in the "
                               f"model {sorted(have - want)[:4]}, only in the mapping {sorted(want - have)[:4]}")
        return model

    def _load_hf(self, model: Any, path: Path) -> None:
        """Fill ``model``'s shards (this pipeline stage's parameters) from the HF safetensors in ``path``."""
        params = self._global_params(model)
        get = _hf_reader(path)
        with torch.no_grad():
            for name, full in hf_to_mcore(get, self.shape, self.vocab_rows, names=self._names):
                local = shard(name, full, self.layout.tp_rank, self.layout.tp)
                p = params[name]
                if tuple(local.shape) != tuple(p.shape):
                    raise ConfigError(f"{path}: {name} would be {tuple(local.shape)} on TP rank "
                                      f"{self.layout.tp_rank}, the model has {tuple(p.shape)} (config.json and "
                                      "weights disagree)", parameter="model.checkpoint", value=str(path))
                p.copy_(local)

    # ------------------------------------------------------------------------------------ forward

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def rank(self) -> int:
        """This process's rank in the default process group (``train.distributed`` drives ranks > 0)."""
        return self.layout.rank

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps taken, as AdamW counts them (``train.audit``)."""
        from lego_rl.train.audit import adam_steps

        return adam_steps(self.optimizer)

    def local_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """This rank's TP shard of every trained parameter, by Megatron name."""
        yield from zip(self._names, self._params, strict=True)

    @contextlib.contextmanager
    def _replaying(self, model: Any, mb: MicroBatch) -> Iterator[None]:
        """Hand ``mb``'s routes to every router of ``model`` inside the block (forward, and the recomputed
        forward of backward); a no-op without ``routing_replay``. megatron-core replays every row, so a position
        without a route (one no trained token depends on: ``check_routes``) gets experts 0..k-1."""
        if not self.settings.routing_replay:
            yield
            return
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        from lego_rl.train.routing_replay import check_routes

        k = self.shape.experts_per_token
        experts, valid = check_routes(mb, layers=self.shape.num_layers, k=k,
                                      num_experts=self.shape.num_experts)  # [T, L, K], [T]
        fallback = torch.arange(k).expand(experts.shape[0], k)  # [T, K]
        replays = [layer.mlp.router.router_replay for layer in model.decoder.layers]
        numbers = [layer.layer_number - 1 for layer in model.decoder.layers]  # global: a stage's layers
        for layer, replay in zip(numbers, replays, strict=True):
            chosen = torch.where(valid[:, None], experts[:, layer].long(), fallback)  # [T, K]
            replay.set_target_indices(chosen.to(self.device))
            replay.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
        try:
            yield
        finally:
            for replay in replays:
                replay.clear_indices()
                replay.clear_router_replay_action()

    def _token_logprobs(self, logits: torch.Tensor, mb: MicroBatch, temperature: float, with_entropy: bool,
                        top_p: float = 1.0, top_k: int = -1) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``([T] logprob of each token given its segment's prefix, 0 at segment starts; [T] entropy or
        None)`` from the last stage's ``logits`` [T, V/tp], on the backend's device, identical on every TP
        rank. Carries the gradient under grad mode."""
        greedy = temperature < GREEDY_EPS
        temp = 1.0 if greedy else temperature
        targets = mb.input_ids[1:].to(self.device)  # [T-1] position i predicts token i+1
        picked, ent = self._mm.vocab_parallel_logprobs(
            logits[:-1], targets, vocab=self.shape.vocab, temperature=temp, top_p=1.0 if greedy else top_p,
            top_k=-1 if greedy else top_k, with_entropy=with_entropy)  # [T-1], [T-1] or None
        starts = _segment_starts(mb).to(self.device)  # [T]
        lp = torch.where(starts, 0.0, torch.cat([picked.new_zeros(1), picked]))  # [T] aligned with input_ids
        entropy = None
        if ent is not None:
            entropy = torch.where(starts, 0.0, torch.cat([ent.new_zeros(1), ent]))  # [T]
        return lp, entropy

    def _expert(self, name: str) -> int | None:
        """The expert-parallel rank holding parameter ``name``; None for one every rank holds."""
        return expert_rank_of(name, self.shape.num_experts, self.layout.ep)

    def _local_twin(self, name: str) -> str:
        """The name of the expert parameter this rank holds at the same local place as global expert ``name``'s
        on its own rank (same layer and projection, hence the same shape)."""
        per_rank = self.shape.num_experts // self.layout.ep
        head, tail = name.split(".mlp.experts.local_experts.")
        index, rest = tail.split(".", 1)
        return f"{head}.mlp.experts.local_experts.{self.layout.ep_rank * per_rank + int(index) % per_rank}.{rest}"

    def _mine(self, n: int) -> list[int]:
        """Indices of the micro-batches this data-parallel rank runs."""
        return list(range(self.layout.dp_rank, n, self.layout.dp))

    def _rounds(self, micro_batches: Sequence[MicroBatch]) -> list[tuple[int | None, MicroBatch]]:
        """This rank's micro-batches as ``(index in micro_batches, what runs)``, one per forward.

        Without expert parallelism that is ``_mine``'s, unchanged. With it, megatron-core's all-gather
        dispatcher gathers the tokens of every rank of an expert-parallel group with equal-size collectives, in
        forward and backward: every DP rank must run the same number of forwards, round ``j`` with the same token
        count. Round ``j`` is micro-batches ``j·dp .. j·dp + dp - 1`` (one per DP rank); each is padded to the
        longest of them (``_padded``), and a rank with none that round runs padding only (index None). Every
        rank knows every micro-batch (SPMD), so this needs no communication."""
        mine = self._mine(len(micro_batches))
        if self.layout.ep == 1:
            return [(i, micro_batches[i]) for i in mine]
        dp, n = self.layout.dp, len(micro_batches)
        out: list[tuple[int | None, MicroBatch]] = []
        for j in range(-(-n // dp)):
            length = max(mb.num_tokens for mb in micro_batches[j * dp:(j + 1) * dp])
            i = j * dp + self.layout.dp_rank
            out.append((i, _padded(micro_batches[i], length)) if i < n else (None, _blank(micro_batches[0], length)))
        return out

    def _share_over_dp(self, n: int, local: dict[int, torch.Tensor]) -> list[torch.Tensor]:
        """Every micro-batch's CPU tensor on every rank, from each DP rank's share."""
        if self.layout.dp == 1:
            return [local[i] for i in range(n)]
        from megatron.core import parallel_state as ps

        parts: list[Any] = [None] * self.layout.dp
        dist.all_gather_object(parts, local, group=ps.get_data_parallel_group_gloo())
        merged: dict[int, torch.Tensor] = {}
        for part in parts:
            merged.update(part)
        return [merged[i] for i in range(n)]

    def _stage_forward(self, model: Any, mb: MicroBatch, hidden: torch.Tensor | None) -> torch.Tensor:
        """This stage's forward of ``mb``: [T, V/tp] logits on the last stage, [T, 1, H] hidden states
        elsewhere (the caller wraps it in ``_replaying``)."""
        return self._mm.stage_forward(model, mb.input_ids, mb.cu_seqlens, self.device, bf16=self.settings.bf16,
                                      hidden=hidden)

    def _wire(self, mbs: Sequence[MicroBatch]) -> dict[str, Any]:
        """The pipeline messages' shape per micro-batch, dtype and device (``pipeline``'s keywords). fp32: the
        residual stream stays fp32 under bf16 autocast (fp32 parameters), so a stage boundary rounds nothing."""
        return {"shape": lambda j: (mbs[j].num_tokens, 1, self.shape.hidden), "dtype": torch.float32,
                "device": self.device}

    def _pipeline_logprobs(self, model: Any, mbs: Sequence[MicroBatch], temperature: float, top_p: float,
                           top_k: int) -> list[torch.Tensor]:
        """[T] logprobs of each of ``mbs`` through every stage of ``model``, on the last stage (empty list
        elsewhere). Call under ``no_grad`` and the CPU shim."""
        from lego_rl.train import pipeline

        def forward(j: int, hidden: torch.Tensor | None) -> torch.Tensor:
            with self._replaying(model, mbs[j]):
                out = self._stage_forward(model, mbs[j], hidden)  # [T, V/tp] or [T, 1, H]
                if not self.stage.last:
                    return out
                lp, _ = self._token_logprobs(out, mbs[j], temperature, False, top_p, top_k)  # [T]
                return lp

        return pipeline.forward_only(self.stage, len(mbs), forward, **self._wire(mbs))

    def _from_last_stage(self, mbs: Sequence[MicroBatch], values: list[torch.Tensor]) -> list[torch.Tensor]:
        """Per micro-batch [T] CPU tensors held by the last stage, on every stage (one broadcast over the
        pipeline group: every stage knows the lengths)."""
        if self.layout.pp == 1:
            return [v.cpu() for v in values]
        sizes = [mb.num_tokens for mb in mbs]
        if not sizes:
            return []
        if self.stage.last:
            flat = torch.cat(values).float().contiguous()  # [ΣT]
        else:
            flat = torch.empty(sum(sizes), device=self.device)  # [ΣT]
        from megatron.core import parallel_state as ps

        dist.broadcast(flat, src=self._pp_ranks[-1], group=ps.get_pipeline_model_parallel_group())
        return [t.cpu() for t in flat.split(sizes)]

    def _from_last_stage_object(self, value: Any) -> Any:
        """A small Python value of the last stage's, on every stage of the pipeline."""
        if self.layout.pp == 1:
            return value
        from megatron.core import parallel_state as ps

        box = [value if self.stage.last else None]
        dist.broadcast_object_list(box, src=self._pp_ranks[-1], group=ps.get_pipeline_model_parallel_group())
        return box[0]

    def compute_logprobs(self, micro_batches: Sequence[MicroBatch], *, temperature: float, top_p: float = 1.0,
                         top_k: int = -1) -> list[torch.Tensor]:
        rounds = self._rounds(micro_batches)
        mbs = [mb for _, mb in rounds]
        with torch.no_grad(), self._mm.cpu_device_shim(self.device):
            lps = self._pipeline_logprobs(self.model, mbs, temperature, top_p, top_k)  # [T] each, last stage
            # Padding is appended after a micro-batch's own tokens: its first num_tokens logprobs are its own.
            local = {i: lp[:micro_batches[i].num_tokens]
                     for (i, _), lp in zip(rounds, self._from_last_stage(mbs, lps), strict=True) if i is not None}
        return self._share_over_dp(len(micro_batches), local)

    # ------------------------------------------------------------------------------------ training

    @staticmethod
    def _check_step(step: OptimizerStep, old_logprobs: Sequence[torch.Tensor]) -> None:
        if not step.micro_batches:
            raise ValueError(f"optimizer step over rollouts {step.rollout_ids} has no micro-batches")
        if len(old_logprobs) != len(step.micro_batches):
            raise ValueError(f"{len(old_logprobs)} old_logprobs tensors for {len(step.micro_batches)} micro-batches")
        for i, (mb, old) in enumerate(zip(step.micro_batches, old_logprobs, strict=True)):
            if tuple(old.shape) != (mb.num_tokens,):
                raise ValueError(f"old_logprobs[{i}] has shape {tuple(old.shape)} but micro-batch {i} has "
                                 f"{mb.num_tokens} tokens")

    def _log_ratio_elsewhere(self, step: OptimizerStep, old_logprobs: Sequence[torch.Tensor], temperature: float,
                             top_p: float, top_k: int) -> list[torch.Tensor]:
        """Per micro-batch ``[R]``: sum of ``current - old`` over its rollouts' tokens in the *other*
        micro-batches (GSPO's sequence ratio); zeros where no rollout spans several micro-batches."""
        r = len(step.rollout_ids)
        spans: dict[int, set[int]] = {}
        for i, mb in enumerate(step.micro_batches):
            for slot in mb.rollout_slots[mb.loss_mask > 0].unique().tolist():
                spans.setdefault(slot, set()).add(i)
        shared = sorted({i for members in spans.values() if len(members) > 1 for i in members})
        sums = [torch.zeros(r) for _ in step.micro_batches]  # [R] each
        if shared:
            current = self.compute_logprobs([step.micro_batches[i] for i in shared], temperature=temperature,
                                            top_p=top_p, top_k=top_k)
            for i, lp in zip(shared, current, strict=True):
                sums[i] = _rollout_sums(lp - old_logprobs[i], step.micro_batches[i], r)  # [R]
        total = torch.stack(sums).sum(0)  # [R]
        return [total - s for s in sums]  # [R] each

    def _reduce_grads(self) -> float:
        """Sum gradients over DP ranks (and a tied embedding's two pipeline copies), then return the global
        gradient 2-norm over the TP shards and pipeline stages."""
        from megatron.core import parallel_state as ps

        for p in self._params:
            if p.grad is None:  # a DP rank without micro-batches still joins the all-reduce
                p.grad = torch.zeros_like(p)
        if self.shape.tied and self.layout.pp > 1 and (self.stage.first or self.stage.last):
            # The embedding (first stage) and its copy as the output layer (last stage) are one HF tensor: both
            # take the sum of the two gradients, so the two copies stay equal step after step.
            tied = self._params[self._names.index(
                "embedding.word_embeddings.weight" if self.stage.first else "output_layer.weight")]
            dist.all_reduce(tied.grad, group=ps.get_embedding_group())
        if self.layout.dp > 1:
            # An expert's gradient already holds every token of its expert-parallel group (the dispatcher
            # gathered them): it is summed over the expert-data-parallel ranks only (DP / EP of them), which
            # hold the same experts; everything else over all DP ranks.
            dp_group = ps.get_data_parallel_group()
            for name, p in zip(self._names, self._params, strict=True):
                if self.layout.ep == 1 or self._expert(name) is None:
                    dist.all_reduce(p.grad, group=dp_group)
                elif self.layout.dp > self.layout.ep:
                    dist.all_reduce(p.grad, group=ps.get_expert_data_parallel_group())
        if self.layout.tp > 1:
            # qk-norm weights are replicated but each TP rank applies them to its own heads only: a rank's
            # gradient is its heads' share, and the true gradient is the sum over ranks.
            tp_group = ps.get_tensor_model_parallel_group()
            summed = _PER_HEAD_NORMS + (self._mm.SEQUENCE_PARALLEL_GRADS if self.settings.sequence_parallel else ())
            for name, p in zip(self._names, self._params, strict=True):
                if name.endswith(summed):
                    dist.all_reduce(p.grad, group=tp_group)
        sharded = torch.zeros((), device=self.device)
        replicated = torch.zeros((), device=self.device)
        experts = torch.zeros((), device=self.device)
        for name, p in zip(self._names, self._params, strict=True):
            if self._tied_copy and name == "output_layer.weight":
                continue  # the first stage's embedding counts this gradient
            sq = p.grad.detach().float().pow(2).sum()  # []
            if self.layout.ep > 1 and self._expert(name) is not None:
                experts += sq  # this rank's experts only (TP = 1 under EP)
            elif mcore_split(name) is Split.REPLICATED:
                replicated += sq  # the same on every TP rank: counted once
            else:
                sharded += sq
        if self.layout.tp > 1:
            dist.all_reduce(sharded, group=ps.get_tensor_model_parallel_group())
        if self.layout.ep > 1:  # each expert-parallel rank holds other experts
            dist.all_reduce(experts, group=ps.get_expert_model_parallel_group())
        total = sharded + replicated + experts  # [] this stage's squared norm
        if self.layout.pp > 1:
            dist.all_reduce(total, group=ps.get_pipeline_model_parallel_group())
        return float(total.sqrt())

    def train_step(self, step: OptimizerStep, loss_fn: LossFn, *, old_logprobs: Sequence[torch.Tensor],
                   temperature: float, top_p: float = 1.0, top_k: int = -1) -> StepResult:
        with self._mm.cpu_device_shim(self.device):  # megatron's TP mappings allocate on the "current" device
            return self._train_step(step, loss_fn, old_logprobs=old_logprobs, temperature=temperature,
                                    top_p=top_p, top_k=top_k)

    def _train_step(self, step: OptimizerStep, loss_fn: LossFn, *, old_logprobs: Sequence[torch.Tensor],
                    temperature: float, top_p: float, top_k: int) -> StepResult:
        self._check_step(step, old_logprobs)
        r = len(step.rollout_ids)
        counts = torch.tensor(step.rollout_token_counts, dtype=torch.float32)  # [R]
        is_sums = [_rollout_sums(old - mb.rollout_logprobs, mb, r)
                   for mb, old in zip(step.micro_batches, old_logprobs, strict=True)]  # [R] each
        is_total = torch.stack(is_sums).sum(0)  # [R]
        if getattr(loss_fn, "needs_rollout_log_ratio", True):
            elsewhere = self._log_ratio_elsewhere(step, old_logprobs, temperature, top_p, top_k)
        else:
            elsewhere = [torch.zeros(r) for _ in step.micro_batches]
        from lego_rl.train import pipeline

        dev = self.device
        rounds = self._rounds(step.micro_batches)
        mbs = [mb for _, mb in rounds]
        refs: list[torch.Tensor] = []
        if self.reference is not None:
            with torch.no_grad():
                refs = self._pipeline_logprobs(self.reference, mbs, temperature, top_p, top_k)  # [T] each, last stage
        self.optimizer.zero_grad(set_to_none=True)
        metrics: dict[str, float] = {}
        loss_sum = 0.0

        def forward(j: int, hidden: torch.Tensor | None) -> torch.Tensor:
            nonlocal loss_sum
            i, mb = rounds[j]
            with self._replaying(self.model, mb):
                out = self._stage_forward(self.model, mb, hidden)  # [T, V/tp] or [T, 1, H]
                if not self.stage.last:
                    return out
                lp, entropy = self._token_logprobs(out, mb, temperature, True, top_p, top_k)  # [T], [T]
                if i is None:  # padding only (expert parallelism): its backward runs the dispatcher's collectives
                    return lp.sum() * 0.0
                old = old_logprobs[i].to(dev)  # [T_i]
                old = torch.cat([old, old.new_zeros(mb.num_tokens - old.numel())])  # [T] padded like mb
                res = loss_fn(LossInputs(
                    logprobs=lp, old_logprobs=old, rollout_logprobs=mb.rollout_logprobs.to(dev),
                    advantages=mb.advantages.to(dev), loss_mask=mb.loss_mask.to(dev),
                    token_weights=mb.token_weights.to(dev), rollout_slots=mb.rollout_slots.to(dev),
                    rollout_token_counts=counts.to(dev), rollout_log_ratio_elsewhere=elsewhere[i].to(dev),
                    rollout_is_log_ratio_elsewhere=(is_total - is_sums[i]).to(dev),
                    ref_logprobs=refs[j] if refs else None, entropy=entropy,
                ))
            loss_sum += float(res.loss.detach())
            for key, value in res.metrics.items():
                metrics[key] = metrics.get(key, 0.0) + value
            # Summed, not averaged, over micro-batches: the token weights carry 1/(N_r R).
            return res.loss

        # Routes are set again around each backward: recomputed layers re-run their routers there.
        pipeline.one_forward_one_backward(self.stage, len(mbs), forward, **self._wire(mbs),
                                          backward_context=lambda j: self._replaying(self.model, mbs[j]))
        loss_sum, metrics = self._from_last_stage_object((loss_sum, metrics))
        grad_norm = self._reduce_grads()
        if self.layout.dp > 1:  # the loss's partial sums were taken over this rank's micro-batches only
            from megatron.core import parallel_state as ps

            keys = sorted(metrics)
            summed = torch.tensor([loss_sum] + [metrics[k] for k in keys], dtype=torch.float64)  # [1+M]
            gathered: list[Any] = [None] * self.layout.dp
            dist.all_gather_object(gathered, (keys, summed), group=ps.get_data_parallel_group_gloo())
            totals: dict[str, float] = {}
            loss_sum = 0.0
            for part_keys, part in gathered:
                loss_sum += float(part[0])
                for k, v in zip(part_keys, part[1:].tolist(), strict=True):
                    totals[k] = totals.get(k, 0.0) + v
            metrics = totals
        if not torch.isfinite(torch.tensor(grad_norm)):
            self.optimizer.zero_grad(set_to_none=True)
            raise FloatingPointError(f"gradient norm is {grad_norm} at weight version {self._version}; the step "
                                     "was not applied (check the batch's logprobs and advantages)")
        if self.settings.max_grad_norm is not None:
            coef = min(1.0, self.settings.max_grad_norm / (grad_norm + 1e-6))  # torch's clip_grad_norm_ rule
            if coef < 1.0:
                for p in self._params:
                    p.grad.mul_(coef)
        lr = float(self.scheduler.get_last_lr()[0])
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._version += 1
        metrics.update(loss=loss_sum, grad_norm=grad_norm, lr=lr,
                       tokens=float(sum(int(mb.loss_mask.sum()) for mb in step.micro_batches)))
        return StepResult(metrics=metrics, weight_version=self._version)

    # ------------------------------------------------------------------------------------ weights

    def _full_mcore(self, name: str, p: torch.Tensor) -> torch.Tensor:
        """The full Megatron tensor of parameter ``name`` (gathered over TP ranks; every rank gets it)."""
        local = p.detach()
        if self.layout.tp == 1 or mcore_split(name) is Split.REPLICATED:
            return local
        from megatron.core import parallel_state as ps

        parts = [torch.empty_like(local) for _ in range(self.layout.tp)]
        dist.all_gather(parts, local.contiguous(), group=ps.get_tensor_model_parallel_group())
        return unshard(name, parts)

    def _gather_experts(self, name: str) -> dict[str, torch.Tensor]:
        """Every expert parameter of ``name``'s layer, from every expert-parallel rank, by global name (an
        all-gather per local expert parameter over the expert-parallel group: every rank holds the same count
        and shapes)."""
        from megatron.core import parallel_state as ps

        layer = name.split(".mlp.experts.local_experts.")[0]
        per_rank = self.shape.num_experts // self.layout.ep
        out: dict[str, torch.Tensor] = {}
        for own, p in zip(self._names, self._params, strict=True):
            if not own.startswith(layer + ".mlp.experts.local_experts."):
                continue
            local = p.detach().contiguous()
            parts = [torch.empty_like(local) for _ in range(self.layout.ep)]
            dist.all_gather(parts, local, group=ps.get_expert_model_parallel_group())
            head, tail = own.split(".mlp.experts.local_experts.")
            index, rest = tail.split(".", 1)
            offset = int(index) - self.layout.ep_rank * per_rank  # this expert's local index
            for rank, t in enumerate(parts):
                out[f"{head}.mlp.experts.local_experts.{rank * per_rank + offset}.{rest}"] = t
        return out

    def _checkpoint_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Parameters by their HF checkpoint names (one tensor per expert projection), full tensors on the
        backend's device. A collective over TP ranks and, with PP, point-to-point from each later stage to
        rank 0: every rank must iterate to the end. Rank 0 gets every tensor of the model; another rank gets
        those of its own stage."""
        mine = dict(zip(self._names, self._params, strict=True))
        gathered: dict[str, torch.Tensor] = {}

        def own_full(name: str) -> torch.Tensor:
            """The full tensor of a parameter of this stage; an expert's gathered from its expert-parallel rank
            (every rank of the stage reaches a layer's first expert at once: one global order)."""
            if self._expert(name) is None or self.layout.ep == 1:
                return self._full_mcore(name, mine[name])
            if name not in gathered:
                gathered.update(self._gather_experts(name))
            return gathered.pop(name)

        if self.layout.pp == 1:
            for name in self._stage_names:
                yield from mcore_to_hf(name, own_full(name), self.shape)
            return
        sender = self.layout.tp_rank == 0 and self.layout.dp_rank == 0  # in rank 0's pipeline group
        for name in mcore_names(self.shape):  # one global order on every rank: sends and receives pair up
            owner = pipeline_stage_of(name, self.shape.num_layers, self.layout.pp)
            full: torch.Tensor | None = None
            if owner == self.layout.pp_rank:
                full = own_full(name)
                if owner > 0 and sender:
                    dist.send(full.contiguous(), dst=0)
            elif self.layout.rank == 0:
                full = torch.empty(self._full_shapes[name], device=self.device)
                dist.recv(full, src=self._pp_ranks[owner])
            if full is not None:
                yield from mcore_to_hf(name, full, self.shape)

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Parameters in the engine's layout: the HF model's own parameter names, as the torch backend exports
        them. For Qwen3-MoE under transformers >= 5 a layer's experts are two stacked parameters,
        ``mlp.experts.gate_up_proj`` ``[E, 2F, H]`` and ``mlp.experts.down_proj`` ``[E, H, F]`` (the
        checkpoint's per-expert tensors are what ``save_checkpoint`` writes). A collective over TP ranks (and the
        pipeline: with PP > 1 rank 0 yields every tensor, another rank only its own stage's, and every rank must
        iterate to the end). With TP 1 some are detached views: copy them before the next ``train_step`` if they
        must outlive it."""
        if not (self.shape.num_experts and _fused_experts()):
            yield from self._checkpoint_tensors()
            return
        pending: dict[str, list[torch.Tensor]] = {}
        for name, t in self._checkpoint_tensors():
            parts = name.split(".")
            if ".mlp.experts." not in name:
                yield name, t
                continue
            layer, proj = parts[2], parts[6]  # model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight
            key = "down_proj" if proj == "down_proj" else "gate_up_proj"
            pending.setdefault(f"{layer}.{key}", []).append(t)
            if proj == "down_proj" and len(pending[f"{layer}.down_proj"]) == self.shape.num_experts:
                gate_up = pending.pop(f"{layer}.gate_up_proj")  # per expert: gate [F, H], then up [F, H]
                yield (f"model.layers.{layer}.mlp.experts.gate_up_proj",
                       torch.stack([torch.cat(gate_up[2 * e:2 * e + 2]) for e in range(self.shape.num_experts)]))
                yield (f"model.layers.{layer}.mlp.experts.down_proj",
                       torch.stack(pending.pop(f"{layer}.down_proj")))  # [E, H, F]
        if pending:
            raise RuntimeError(f"experts left unexported: {sorted(pending)[:3]}")

    def _shard_file(self) -> str:
        ep = f"ep{self.layout.ep_rank}." if self.layout.ep > 1 else ""  # experts' optimizer state differs
        if self.layout.pp == 1:
            return f"trainer_state.{ep}tp{self.layout.tp_rank}.pt"
        return f"trainer_state.pp{self.layout.pp_rank}.{ep}tp{self.layout.tp_rank}.pt"

    def save_checkpoint(self, path: Path, *, extra_state: dict[str, Any]) -> None:
        """HF weights (rank 0, gathered from every TP rank and stage), one optimizer/RNG shard per TP rank and
        stage (DP rank 0 of each), published by rank 0 once every shard is on disk. Every rank must call it."""
        try:
            extra_json = json.dumps(extra_state, indent=2, sort_keys=True) + "\n"
        except TypeError as exc:
            raise ValueError(f"extra_state must be JSON-serialisable (the loop's cursor and step): {exc}") from exc
        path = Path(path)
        if path.exists():  # checked on every rank before any collective, so all ranks raise alike
            raise FileExistsError(f"checkpoint {path} already exists; it is never overwritten (save under a new "
                                  "name or move it away)")
        hf: dict[str, torch.Tensor] = {}
        for name, t in self._checkpoint_tensors():  # a collective: every rank gathers, rank 0 keeps
            if self.layout.rank == 0:
                hf[name] = t.detach().to("cpu", copy=True).contiguous()
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                 "weight_version": self._version, "rng": rng_state()}
        # One shard per (EP, TP, PP) rank: DP ranks below EP are the expert-parallel ranks 0..EP-1 (their
        # expert-data-parallel rank is 0); the dense part of their state is the same on every DP rank.
        writes_shard = self.layout.dp_rank < self.layout.ep

        def write_shard(tmp: Path) -> None:
            if writes_shard:
                write_new(tmp / self._shard_file(), lambda fh: torch.save(state, fh), what="trainer state shard")

        def fill(tmp: Path) -> None:
            from safetensors.torch import save_file

            self._broadcast_path(tmp)
            save_file(hf, str(tmp / "model.safetensors"), metadata={"format": "pt"})
            for name in _MODEL_SIDE_FILES:
                if (self.model_dir / name).is_file():
                    shutil.copy2(self.model_dir / name, tmp / name)
            write_new(tmp / EXTRA_STATE, extra_json, what="extra state")
            write_shard(tmp)
            self._barrier()

        if self.layout.rank == 0:
            publish_checkpoint(path, fill, info={"weight_version": self._version, "backend": "megatron",
                                                 "tensor_parallel": self.layout.tp,
                                                 "pipeline_parallel": self.layout.pp,
                                                 "expert_parallel": self.layout.ep})
        else:
            write_shard(self._broadcast_path(None))
            self._barrier()
        self._barrier()  # nobody returns before the checkpoint is in place

    def _broadcast_path(self, tmp: Path | None) -> Path:
        if self.layout.world == 1:
            assert tmp is not None
            return tmp
        box: list[Any] = [str(tmp) if tmp is not None else None]
        dist.broadcast_object_list(box, src=0)
        return Path(box[0])

    def _barrier(self) -> None:
        if self.layout.world > 1:
            dist.barrier()

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        path = Path(path)
        info = read_marker(path)
        if info.get("backend") != "megatron" or info.get("tensor_parallel") != self.layout.tp:
            raise ConfigError(f"checkpoint {path} was written by backend {info.get('backend')!r} with tensor "
                              f"parallel {info.get('tensor_parallel')}; this trainer is 'megatron' with "
                              f"{self.layout.tp} (its optimizer shards would not fit)",
                              parameter="train.tensor_parallel", value=self.layout.tp)
        written_pp = info.get("pipeline_parallel", 1)  # checkpoints from before pipeline parallelism: 1
        if written_pp != self.layout.pp:
            raise ConfigError(f"checkpoint {path} was written with pipeline parallel {written_pp}; this trainer "
                              f"runs {self.layout.pp} stages (its optimizer shards hold other stages' layers)",
                              parameter="train.pipeline_parallel", value=self.layout.pp)
        written_ep = info.get("expert_parallel", 1)  # checkpoints from before expert parallelism: 1
        if written_ep != self.layout.ep:
            raise ConfigError(f"checkpoint {path} was written with expert parallel {written_ep}; this trainer "
                              f"runs {self.layout.ep} (its optimizer shards hold other ranks' experts)",
                              parameter="train.expert_parallel", value=self.layout.ep)
        self._load_hf(self.model, path)
        state = torch.load(path / self._shard_file(), map_location="cpu", weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self._version = int(state["weight_version"])
        set_rng_state(state["rng"])
        extra: dict[str, Any] = json.loads((path / EXTRA_STATE).read_text())
        return extra
