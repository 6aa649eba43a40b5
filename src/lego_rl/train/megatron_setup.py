"""A Megatron rank's setup: its settings, its place in the TP × PP × DP (× EP) grid, its models and their names.

``MegatronRank.create`` checks the model against the parallel sizes, joins the process groups, builds the policy
(and the KL reference) as megatron-core ``GPTModel`` stages and fills them from the Hugging Face checkpoint the
engine serves. Every other Megatron module (``megatron_step``, ``megatron_weights``, ``megatron_checkpoint``)
works on the ``MegatronRank`` this returns; ``megatron_backend`` holds it with the optimizer.

Parameters are known by their *global* Megatron names (``megatron_convert.mcore_names``): a pipeline stage numbers
its layers from 0 and an expert-parallel rank its experts from 0, so ``global_params`` maps them back.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from pydantic import Field

from lego_rl.errors import ConfigError
from lego_rl.train.backend import OptimizerSettings
from lego_rl.train.megatron_convert import (
    Qwen3Shape,
    check_ep,
    check_pp,
    check_sp,
    check_tp,
    expert_rank_of,
    full_shape,
    hf_to_mcore,
    mcore_names,
    padded_vocab,
    pipeline_stage_of,
    shard,
)

if TYPE_CHECKING:
    from lego_rl.train.megatron_model import ParallelLayout
    from lego_rl.train.pipeline import Stage

MEGATRON_EXTRA_HINT = "install the megatron extra: pip install 'lego-rl[megatron]' (megatron-core)"


def require_megatron() -> None:
    """A ``ConfigError`` naming the extra when megatron-core is not importable."""
    try:
        import megatron.core  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"train.backend = \"megatron\" needs megatron-core, which is not installed ({exc}); "
                          f"{MEGATRON_EXTRA_HINT}", parameter="train.backend", value="megatron") from None


class MegatronTrainSettings(OptimizerSettings):
    """What the Megatron backend needs; ``compose.train_session`` projects ``train.*`` onto it once (gradient
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


@dataclass
class MegatronRank:
    """What one Megatron rank holds and where it sits (see the module docstring). Built by ``create``."""

    mm: Any
    """``lego_rl.train.megatron_model``, imported once megatron-core is known to be there."""
    settings: MegatronTrainSettings
    model_dir: Path
    shape: Qwen3Shape
    device: torch.device
    layout: ParallelLayout
    stage: Stage
    pp_ranks: list[int]
    """Global ranks of this rank's pipeline group, by stage."""
    vocab_rows: int
    tied_copy: bool
    """This stage holds ``output_layer.weight`` as a copy of the first stage's tied embedding."""
    stage_names: list[str]
    """Every parameter of this stage by global name, other expert-parallel ranks' experts included."""
    names: list[str]
    """The parameters this rank holds, by global name, in ``params``' order."""
    recompute: bool = False
    model: Any = None
    reference: Any = None
    params: list[Any] = field(default_factory=list)
    """This stage's parameters, this rank's shards, in ``names``' order."""
    full_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Full (TP-gathered) shape of every parameter of every stage."""

    @classmethod
    def create(cls, model_dir: Path, settings: MegatronTrainSettings) -> MegatronRank:
        """Check, place, build and load (see the module docstring); every rank calls it with the same values."""
        require_megatron()
        from lego_rl.train import megatron_model as mm

        model_dir = Path(model_dir)
        shape = _read_shape(model_dir, settings)
        device = pick_device(settings.device)
        layout = mm.init_parallel(settings.tensor_parallel, settings.pipeline_parallel, settings.data_parallel,
                                  device, ep=settings.expert_parallel)
        stage = mm.pipeline_stage(layout)
        rank = cls(mm=mm, settings=settings, model_dir=model_dir, shape=shape, device=device, layout=layout,
                   stage=stage, pp_ranks=_pipeline_ranks(layout),
                   vocab_rows=padded_vocab(shape.vocab, settings.tensor_parallel),
                   tied_copy=shape.tied and layout.pp > 1 and stage.last, stage_names=[], names=[])
        rank._name_parameters()
        rank.recompute = _recompute(settings.gradient_checkpointing, device)
        rank._load_models()
        return rank

    def _name_parameters(self) -> None:
        self.stage_names = [n for n in mcore_names(self.shape)
                            if pipeline_stage_of(n, self.shape.num_layers, self.layout.pp) == self.layout.pp_rank]
        self.names = [n for n in self.stage_names if self.expert(n) in (None, self.layout.ep_rank)]
        if self.tied_copy:
            self.names.append("output_layer.weight")

    def _load_models(self) -> None:
        self.model = self.build(recompute=self.recompute)
        self.load_hf(self.model, self.model_dir)
        self.model.train()
        if self.settings.reference_model:
            self.reference = self.build(recompute=False)
            self.load_hf(self.reference, self.model_dir)
            self.reference.requires_grad_(False)
        named = self.global_params(self.model)
        self.params = [named[n] for n in self.names]
        self.full_shapes = self._gather_full_shapes()

    # ------------------------------------------------------------------------------------ names

    def expert(self, name: str) -> int | None:
        """The expert-parallel rank holding parameter ``name``; None for one every rank holds."""
        return expert_rank_of(name, self.shape.num_experts, self.layout.ep)

    def local_twin(self, name: str) -> str:
        """The name of the expert parameter this rank holds at the same local place as global expert ``name``'s
        on its own rank (same layer and projection, hence the same shape)."""
        per_rank = self.shape.num_experts // self.layout.ep
        head, tail = name.split(".mlp.experts.local_experts.")
        index, rest = tail.split(".", 1)
        return f"{head}.mlp.experts.local_experts.{self.layout.ep_rank * per_rank + int(index) % per_rank}.{rest}"

    def global_params(self, model: Any) -> dict[str, Any]:
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

    # ------------------------------------------------------------------------------------ models

    def build(self, *, recompute: bool) -> Any:
        """This stage of the model as a megatron-core ``GPTModel``, its parameters checked against the mapping."""
        model = self.mm.build_gpt(self.shape, vocab_rows=self.vocab_rows, tp=self.layout.tp, device=self.device,
                                  recompute=recompute, routing_replay=self.settings.routing_replay,
                                  pp=self.layout.pp, pp_rank=self.layout.pp_rank, ep=self.layout.ep,
                                  sequence_parallel=self.settings.sequence_parallel)
        have = set(self.global_params(model))
        want = set(self.names)
        if have != want:  # a megatron-core whose local spec names parameters differently than the mapping
            raise RuntimeError(f"megatron-core's GPTModel parameters do not match the Qwen3 mapping: only in the "
                               f"model {sorted(have - want)[:4]}, only in the mapping {sorted(want - have)[:4]}")
        return model

    def load_hf(self, model: Any, path: Path) -> None:
        """Fill ``model``'s shards (this pipeline stage's parameters) from the HF safetensors in ``path``."""
        params = self.global_params(model)
        get = hf_reader(path)
        with torch.no_grad():
            for name, full in hf_to_mcore(get, self.shape, self.vocab_rows, names=self.names):
                local = shard(name, full, self.layout.tp_rank, self.layout.tp)
                p = params[name]
                if tuple(local.shape) != tuple(p.shape):
                    raise ConfigError(f"{path}: {name} would be {tuple(local.shape)} on TP rank "
                                      f"{self.layout.tp_rank}, the model has {tuple(p.shape)} (config.json and "
                                      "weights disagree)", parameter="model.checkpoint", value=str(path))
                p.copy_(local)

    def _gather_full_shapes(self) -> dict[str, tuple[int, ...]]:
        """Full (TP-gathered) shape of every parameter of every stage: rank 0 receives other stages' tensors
        into buffers of these shapes. A collective over the pipeline group, once, before any pipeline message:
        with NCCL the group's first collective must involve all of its ranks (``pipeline.Stage.group``)."""
        mine = {n: full_shape(n, p.shape, self.layout.tp) for n, p in zip(self.names, self.params, strict=True)}
        for name in self.stage_names:  # other expert-parallel ranks' experts: shaped like this rank's
            if name not in mine:
                mine[name] = mine[self.local_twin(name)]
        if self.layout.pp == 1:
            return mine
        from megatron.core import parallel_state as ps

        parts: list[Any] = [None] * self.layout.pp
        dist.all_gather_object(parts, mine, group=ps.get_pipeline_model_parallel_group())
        merged: dict[str, tuple[int, ...]] = {}
        for part in parts:
            merged.update(part)
        return merged


def _read_shape(model_dir: Path, settings: MegatronTrainSettings) -> Qwen3Shape:
    """The model's shape from its ``config.json``, checked against the parallel sizes and routing replay."""
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        raise ConfigError(f"{model_dir} is not a model directory (no config.json)",
                          parameter="model.checkpoint", value=str(model_dir))
    shape = Qwen3Shape.from_hf_config(json.loads(cfg_path.read_text()), source=str(cfg_path))
    if settings.routing_replay and not shape.num_experts:
        raise ConfigError(f"{cfg_path}: routing replay needs a mixture-of-experts model; this one is dense",
                          parameter="rollout.use_rollout_routing_replay", value=True)
    check_tp(shape, settings.tensor_parallel, sequence_parallel=settings.sequence_parallel)
    check_pp(shape, settings.pipeline_parallel)
    check_ep(shape, settings.expert_parallel, settings.tensor_parallel)
    check_sp(settings.sequence_parallel, settings.pipeline_parallel)
    return shape


def pick_device(name: str | None) -> torch.device:
    """The device ``name`` names (None: CUDA if there is one), one GPU per rank under torchrun."""
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


def _recompute(asked: bool | None, device: torch.device) -> bool:
    """Whether layers recompute in backward: None = on CUDA only; True off CUDA is refused."""
    if asked is None:
        return device.type == "cuda"
    if asked and device.type != "cuda":
        raise ConfigError(f"train.gradient_checkpointing = true with the Megatron backend needs CUDA "
                          f"(megatron-core recomputes under its CUDA RNG tracker); this trainer runs on "
                          f"{device}: leave the key unset", parameter="train.gradient_checkpointing",
                          value=True)
    return asked


def _pipeline_ranks(layout: ParallelLayout) -> list[int]:
    """Global ranks of this rank's pipeline group, by stage."""
    if layout.pp == 1:
        return [layout.rank]
    from megatron.core import parallel_state as ps

    return dist.get_process_group_ranks(ps.get_pipeline_model_parallel_group())


def hf_reader(path: Path) -> Any:
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
