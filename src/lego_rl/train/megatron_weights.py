"""A Megatron rank's weights as full Hugging Face tensors: for checkpoints and for weight sync.

Every TP shard is gathered, every expert from its expert-parallel rank, and with PP > 1 each later stage sends
its tensors to rank 0. These are collectives: every rank must iterate the generators to the end.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import torch
import torch.distributed as dist

from lego_rl.train.megatron_convert import Split, mcore_names, mcore_split, mcore_to_hf, pipeline_stage_of, unshard
from lego_rl.train.megatron_setup import MegatronRank

_EXPERTS = ".mlp.experts.local_experts."


@functools.cache
def fused_experts() -> bool:
    """Whether this transformers keeps a Qwen3-MoE layer's experts as stacked ``experts.gate_up_proj`` /
    ``experts.down_proj`` parameters (>= 5) rather than one module per expert: the names the engine's
    ``update_weights`` takes. Asked of a two-expert block built on the meta device (no memory)."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    cfg = Qwen3MoeConfig(hidden_size=8, moe_intermediate_size=4, num_experts=2, num_experts_per_tok=1)
    with torch.device("meta"):
        names = {n for n, _ in Qwen3MoeSparseMoeBlock(cfg).named_parameters()}
    return "experts.gate_up_proj" in names


def full_mcore(r: MegatronRank, name: str, p: torch.Tensor) -> torch.Tensor:
    """The full Megatron tensor of parameter ``name`` (gathered over TP ranks; every rank gets it)."""
    local = p.detach()
    if r.layout.tp == 1 or mcore_split(name) is Split.REPLICATED:
        return local
    from megatron.core import parallel_state as ps

    parts = [torch.empty_like(local) for _ in range(r.layout.tp)]
    dist.all_gather(parts, local.contiguous(), group=ps.get_tensor_model_parallel_group())
    return unshard(name, parts)


def gather_experts(r: MegatronRank, name: str) -> dict[str, torch.Tensor]:
    """Every expert parameter of ``name``'s layer, from every expert-parallel rank, by global name (an
    all-gather per local expert parameter over the expert-parallel group: every rank holds the same count
    and shapes)."""
    from megatron.core import parallel_state as ps

    layer = name.split(_EXPERTS)[0]
    per_rank = r.shape.num_experts // r.layout.ep
    out: dict[str, torch.Tensor] = {}
    for own, p in zip(r.names, r.params, strict=True):
        if not own.startswith(layer + _EXPERTS):
            continue
        local = p.detach().contiguous()
        parts = [torch.empty_like(local) for _ in range(r.layout.ep)]
        dist.all_gather(parts, local, group=ps.get_expert_model_parallel_group())
        head, tail = own.split(_EXPERTS)
        index, rest = tail.split(".", 1)
        offset = int(index) - r.layout.ep_rank * per_rank  # this expert's local index
        for rank, t in enumerate(parts):
            out[f"{head}{_EXPERTS}{rank * per_rank + offset}.{rest}"] = t
    return out


def checkpoint_tensors(r: MegatronRank) -> Iterator[tuple[str, torch.Tensor]]:
    """Parameters by their HF checkpoint names (one tensor per expert projection), full tensors on the rank's
    device. A collective over TP ranks and, with PP, point-to-point from each later stage to rank 0: every rank
    must iterate to the end. Rank 0 gets every tensor of the model; another rank gets those of its own stage."""
    mine = dict(zip(r.names, r.params, strict=True))
    gathered: dict[str, torch.Tensor] = {}

    def own_full(name: str) -> torch.Tensor:
        """The full tensor of a parameter of this stage; an expert's gathered from its expert-parallel rank
        (every rank of the stage reaches a layer's first expert at once: one global order)."""
        if r.expert(name) is None or r.layout.ep == 1:
            return full_mcore(r, name, mine[name])
        if name not in gathered:
            gathered.update(gather_experts(r, name))
        return gathered.pop(name)

    if r.layout.pp == 1:
        for name in r.stage_names:
            yield from mcore_to_hf(name, own_full(name), r.shape)
        return
    sender = r.layout.tp_rank == 0 and r.layout.dp_rank == 0  # in rank 0's pipeline group
    for name in mcore_names(r.shape):  # one global order on every rank: sends and receives pair up
        owner = pipeline_stage_of(name, r.shape.num_layers, r.layout.pp)
        full: torch.Tensor | None = None
        if owner == r.layout.pp_rank:
            full = own_full(name)
            if owner > 0 and sender:
                dist.send(full.contiguous(), dst=0)
        elif r.layout.rank == 0:
            full = torch.empty(r.full_shapes[name], device=r.device)
            dist.recv(full, src=r.pp_ranks[owner])
        if full is not None:
            yield from mcore_to_hf(name, full, r.shape)


def export_weights(r: MegatronRank) -> Iterator[tuple[str, torch.Tensor]]:
    """Parameters in the engine's layout: the HF model's own parameter names, as the torch backend exports
    them. For Qwen3-MoE under transformers >= 5 a layer's experts are two stacked parameters,
    ``mlp.experts.gate_up_proj`` ``[E, 2F, H]`` and ``mlp.experts.down_proj`` ``[E, H, F]`` (the checkpoint's
    per-expert tensors are what a checkpoint holds). A collective over TP ranks (and the pipeline: with PP > 1
    rank 0 yields every tensor, another rank only its own stage's, and every rank must iterate to the end). With
    TP 1 some are detached views: copy them before the next step if they must outlive it."""
    if not (r.shape.num_experts and fused_experts()):
        yield from checkpoint_tensors(r)
        return
    experts = r.shape.num_experts
    pending: dict[str, list[torch.Tensor]] = {}
    for name, t in checkpoint_tensors(r):
        parts = name.split(".")
        if ".mlp.experts." not in name:
            yield name, t
            continue
        layer, proj = parts[2], parts[6]  # model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight
        key = "down_proj" if proj == "down_proj" else "gate_up_proj"
        pending.setdefault(f"{layer}.{key}", []).append(t)
        if proj == "down_proj" and len(pending[f"{layer}.down_proj"]) == experts:
            gate_up = pending.pop(f"{layer}.gate_up_proj")  # per expert: gate [F, H], then up [F, H]
            yield (f"model.layers.{layer}.mlp.experts.gate_up_proj",
                   torch.stack([torch.cat(gate_up[2 * e:2 * e + 2]) for e in range(experts)]))
            yield (f"model.layers.{layer}.mlp.experts.down_proj",
                   torch.stack(pending.pop(f"{layer}.down_proj")))  # [E, H, F]
    if pending:
        raise RuntimeError(f"experts left unexported: {sorted(pending)[:3]}")
