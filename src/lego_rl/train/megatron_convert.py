"""Hugging Face Qwen3 ↔ Megatron-core weight layout, and tensor-parallel sharding (pure torch, no megatron).

The Megatron backend builds a ``GPTModel`` with the local layer spec (RMSNorm, SwiGLU, qk-norm, RoPE) and
fills it from the HF checkpoint the engine serves; weight sync and checkpoints go the other way. Every
mapping here is a reshape, a concatenation or a slice, so HF → Megatron → HF is bit-identical
(``tests/train/test_megatron_convert.py``).

Layout differences, and why they exist on the Megatron side:

* **Fused QKV, grouped by key/value head.** ``linear_qkv.weight`` is ``[G * (Q/G + 2) * D, H]``: for each of
  the ``G`` query groups, its ``Q/G`` query heads, then its key head, then its value head. Splitting rows
  into ``tp`` equal chunks then hands each rank whole groups (one matmul per layer instead of three).
* **Fused gate/up.** ``linear_fc1.weight`` is ``[gate; up]`` (``[2F, H]``); a TP rank holds
  ``[gate_r; up_r]``, not a contiguous row range, so it has its own shard rule (``GATED``).
* **Padded vocabulary.** Embedding and output rows are padded to a multiple of ``128 * tp`` (the vocab is
  split by rows across TP ranks, and aligned shapes keep the GEMMs fast). Padding rows are zero and are
  masked out of every softmax by the backend; the HF side never sees them.
* **Tied embeddings** (``tie_word_embeddings``): no ``output_layer.weight``; HF exports only
  ``model.embed_tokens.weight``, as the torch backend's ``named_parameters`` does.
* **Qwen3-MoE** (every layer routed, no shared expert): HF ``mlp.gate`` is Megatron's ``mlp.router``; expert
  ``e``'s gate/up/down are ``mlp.experts.local_experts.{e}.linear_fc1`` (fused, like the dense MLP) and
  ``linear_fc2`` (the local spec's ``SequentialMLP``; ``shard`` would split experts by TP like the dense MLP,
  but MoE models train with TP = 1: ``check_tp``). Names here use
  global expert ids; with expert parallelism a rank holds ``expert_rank_of``'s share under local ids ``0..``,
  which the backend maps. Tested against megatron-core's own MoE ``GPTModel``.

Why not mbridge: it tracks Megatron-LM's main branch (its bridges import ``megatron.core`` modules and
TransformerConfig fields of a matching version) and pulls in Transformer Engine specs; the versions usable
here (0.16.1 on this machine's Python 3.11, 0.19.2 on the GPU machine's 3.12) and the local spec we must use
(no Transformer Engine on either machine) are not what it is written for. The dense Qwen3 mapping is ~150
lines of reshapes we can test bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

from lego_rl.errors import ConfigError

VOCAB_MULTIPLE = 128
"""Rows of the padded vocabulary per TP rank come in multiples of this (Megatron's usual choice)."""


class Split(Enum):
    """How a Megatron parameter is divided across tensor-parallel ranks."""

    REPLICATED = "replicated"
    ROWS = "rows"
    """Column-parallel linear or vocab-parallel embedding: dim 0 in ``tp`` contiguous chunks."""
    COLUMNS = "columns"
    """Row-parallel linear: dim 1 in ``tp`` contiguous chunks."""
    GATED = "gated"
    """``[gate; up]`` along dim 0: each half in ``tp`` chunks, rank r holds ``[gate_r; up_r]``."""


@dataclass(frozen=True)
class Qwen3Shape:
    """The dimensions of a dense Qwen3 model that the Megatron model and the mapping need."""

    num_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied: bool
    rope_theta: float
    norm_eps: float
    max_positions: int
    num_experts: int = 0
    """Routed experts per layer (Qwen3-MoE); 0 for a dense model."""
    moe_ffn: int = 0
    """Each expert's intermediate size (``moe_intermediate_size``)."""
    experts_per_token: int = 0
    norm_topk_prob: bool = False
    """Whether the top-k routing weights are renormalised to sum to 1 (HF's default is False)."""

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any], *, source: str = "config.json") -> Qwen3Shape:
        """From a ``config.json`` dict. Anything this mapping does not reproduce is a ``ConfigError`` naming
        the field (a silently different model would train something the engine does not serve)."""
        model_type = cfg.get("model_type")
        if model_type not in ("qwen3", "qwen3_moe"):
            raise ConfigError(
                f"{source}: model_type {model_type!r} is not supported by the Megatron backend's weight "
                "conversion ('qwen3' and 'qwen3_moe' only; use train.backend = \"torch\" for other models)",
                parameter="model.checkpoint", value=model_type)
        experts = 0
        if model_type == "qwen3_moe":
            experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
            if int(cfg.get("decoder_sparse_step", 1)) != 1 or cfg.get("mlp_only_layers"):
                raise ConfigError(f"{source}: Qwen3-MoE with dense layers (decoder_sparse_step "
                                  f"{cfg.get('decoder_sparse_step')}, mlp_only_layers {cfg.get('mlp_only_layers')}) "
                                  "is not supported: every layer must be routed", parameter="model.checkpoint",
                                  value=model_type)
        for key, ok in (("attention_bias", False), ("use_sliding_window", False)):
            if bool(cfg.get(key, ok)) != ok:
                raise ConfigError(f"{source}: {key} = {cfg.get(key)!r} is not supported by the Megatron backend",
                                  parameter="model.checkpoint", value=cfg.get(key))
        if cfg.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"{source}: hidden_act {cfg.get('hidden_act')!r} is not supported (SwiGLU only)",
                              parameter="model.checkpoint", value=cfg.get("hidden_act"))
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ConfigError(f"{source}: rope type {rope_type!r} is not supported (plain RoPE only)",
                              parameter="model.checkpoint", value=rope_type)
        theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        if heads % kv_heads:
            raise ConfigError(f"{source}: num_attention_heads {heads} is not a multiple of num_key_value_heads "
                              f"{kv_heads}", parameter="model.checkpoint", value=kv_heads)
        return cls(
            num_layers=int(cfg["num_hidden_layers"]), hidden=hidden, heads=heads, kv_heads=kv_heads,
            head_dim=int(cfg.get("head_dim") or hidden // heads), ffn=int(cfg["intermediate_size"]),
            vocab=int(cfg["vocab_size"]), tied=bool(cfg.get("tie_word_embeddings", False)),
            rope_theta=float(theta), norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_positions=int(cfg.get("max_position_embeddings", 32768)), num_experts=experts,
            moe_ffn=int(cfg.get("moe_intermediate_size") or 0) if experts else 0,
            experts_per_token=int(cfg.get("num_experts_per_tok") or 0) if experts else 0,
            norm_topk_prob=bool(cfg.get("norm_topk_prob", False)) if experts else False,
        )

    def num_params(self) -> int:
        """Parameters of the HF model (the tied head counted once): N in the 6·N·tokens FLOP estimate."""
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads) + 2 * self.head_dim
        mlp = (self.num_experts * (3 * self.hidden * self.moe_ffn + self.hidden) if self.num_experts
               else 3 * self.hidden * self.ffn)
        layer = attn + mlp + 2 * self.hidden
        head = 0 if self.tied else self.vocab * self.hidden
        return self.num_layers * layer + self.vocab * self.hidden + head + self.hidden


def padded_vocab(vocab: int, tp: int) -> int:
    """The Megatron vocabulary size: ``vocab`` rounded up to a multiple of ``VOCAB_MULTIPLE * tp``."""
    step = VOCAB_MULTIPLE * tp
    return -(-vocab // step) * step


def check_tp(shape: Qwen3Shape, tp: int, *, sequence_parallel: bool = False) -> None:
    """Tensor parallelism splits query groups and the FFN width evenly; say which does not divide. A MoE model
    trains under TP > 1 only with sequence parallelism: megatron-core's MoE layer raises in training mode
    otherwise."""
    if shape.num_experts and tp > 1 and not sequence_parallel:
        raise ConfigError(f"train.tensor_parallel = {tp} with a mixture-of-experts model: megatron-core trains MoE "
                          "layers under tensor parallelism only with sequence parallelism; set "
                          "train.sequence_parallel = true (or train.tensor_parallel = 1 and split the experts with "
                          "train.expert_parallel)", parameter="train.tensor_parallel", value=tp)
    for what, n in (("num_key_value_heads", shape.kv_heads), ("num_attention_heads", shape.heads),
                    ("intermediate_size", shape.ffn), ("moe_intermediate_size", shape.moe_ffn)):
        if n % tp:
            raise ConfigError(f"train.tensor_parallel = {tp} does not divide the model's {what} ({n}); choose a "
                              "divisor of it", parameter="train.tensor_parallel", value=tp)


def check_pp(shape: Qwen3Shape, pp: int) -> None:
    """Pipeline stages hold equal runs of layers: ``pp`` must divide the layer count."""
    if shape.num_layers % pp:
        raise ConfigError(f"train.pipeline_parallel = {pp} does not divide the model's {shape.num_layers} layers "
                          "(num_hidden_layers); every stage holds the same number of layers",
                          parameter="train.pipeline_parallel", value=pp)


_LAYER_NORMS = {
    "input_layernorm.weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
}
"""Megatron layer suffix → HF layer suffix for the replicated norm weights."""


def mcore_split(name: str) -> Split:
    """How the Megatron parameter ``name`` is divided across TP ranks (same rule for its gradient)."""
    if name.endswith(("word_embeddings.weight", "output_layer.weight", "linear_qkv.weight")):
        return Split.ROWS
    if name.endswith("linear_fc1.weight"):
        return Split.GATED
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return Split.COLUMNS
    return Split.REPLICATED


def mcore_names(shape: Qwen3Shape) -> list[str]:
    """Every parameter of the whole Megatron model (global layer numbers), in model order; a pipeline stage
    holds those ``pipeline_stage_of`` assigns to it."""
    names = ["embedding.word_embeddings.weight"]
    for i in range(shape.num_layers):
        p = f"decoder.layers.{i}."
        names += [p + "input_layernorm.weight", p + "self_attention.linear_qkv.weight",
                  p + "self_attention.q_layernorm.weight", p + "self_attention.k_layernorm.weight",
                  p + "self_attention.linear_proj.weight", p + "pre_mlp_layernorm.weight"]
        if shape.num_experts:
            names.append(p + "mlp.router.weight")
            for e in range(shape.num_experts):
                names += [p + f"mlp.experts.local_experts.{e}.linear_fc1.weight",
                          p + f"mlp.experts.local_experts.{e}.linear_fc2.weight"]
        else:
            names += [p + "mlp.linear_fc1.weight", p + "mlp.linear_fc2.weight"]
    names.append("decoder.final_layernorm.weight")
    if not shape.tied:
        names.append("output_layer.weight")
    return names


def expert_of(name: str) -> int | None:
    """The global expert id of a routed expert's Megatron parameter
    (``decoder.layers.{i}.mlp.experts.local_experts.{e}.*``, global numbering), None for any other parameter."""
    parts = name.split(".")
    if parts[3:6] == ["mlp", "experts", "local_experts"] and len(parts) > 6 and parts[6].isdigit():
        return int(parts[6])
    return None


def expert_rank_of(name: str, num_experts: int, ep: int) -> int | None:
    """The expert-parallel rank (of ``ep``, each holding ``num_experts / ep`` consecutive experts, megatron-core's
    split) that holds parameter ``name``; None for a parameter every expert-parallel rank holds."""
    e = expert_of(name)
    return None if e is None else e // (num_experts // ep)


def check_sp(sequence_parallel: bool, pp: int) -> None:
    """Sequence parallelism runs with one pipeline stage: the pipeline schedule sends whole-sequence
    activations between stages."""
    if sequence_parallel and pp > 1:
        raise ConfigError(f"train.sequence_parallel with train.pipeline_parallel = {pp} is not built (the pipeline "
                          "schedule sends whole-sequence activations); use one or the other",
                          parameter="train.sequence_parallel", value=True)


def check_ep(shape: Qwen3Shape, ep: int, tp: int = 1) -> None:
    """Expert parallelism needs a MoE model whose experts split evenly over the ``ep`` ranks, and TP = 1 (EP
    combined with TP is not built)."""
    if ep == 1:
        return
    if tp > 1:
        raise ConfigError(f"train.expert_parallel = {ep} with train.tensor_parallel = {tp} is not built: split a "
                          "mixture-of-experts model by experts (TP = 1) or by TP with train.sequence_parallel",
                          parameter="train.expert_parallel", value=ep)
    if not shape.num_experts:
        raise ConfigError(f"train.expert_parallel = {ep} needs a mixture-of-experts model; this one is dense",
                          parameter="train.expert_parallel", value=ep)
    if shape.num_experts % ep:
        raise ConfigError(f"train.expert_parallel = {ep} does not divide the model's {shape.num_experts} experts "
                          "(num_experts); every rank holds the same number of them",
                          parameter="train.expert_parallel", value=ep)


def pipeline_stage_of(name: str, num_layers: int, pp: int) -> int:
    """The pipeline stage (of ``pp``, each holding ``num_layers / pp`` consecutive layers) that holds the
    Megatron parameter ``name`` (global layer numbering): the embedding is on the first, the final norm and
    output layer on the last."""
    if name.startswith("embedding."):
        return 0
    if name.startswith(("decoder.final_layernorm.", "output_layer.")):
        return pp - 1
    parts = name.split(".")
    if parts[:2] != ["decoder", "layers"] or len(parts) < 3 or not parts[2].isdigit():
        raise KeyError(f"{name!r} is not a parameter of the Megatron Qwen3 model")
    return int(parts[2]) // (num_layers // pp)


def full_shape(name: str, local: Sequence[int], tp: int) -> tuple[int, ...]:
    """The shape of the full Megatron tensor ``name`` whose TP shard has shape ``local``."""
    split = mcore_split(name)
    out = list(local)
    if split in (Split.ROWS, Split.GATED):
        out[0] *= tp
    elif split is Split.COLUMNS:
        out[1] *= tp
    return tuple(out)


def _hf_mlp(suffix: str) -> str:
    """HF prefix (inside a layer) of the MLP a Megatron ``linear_fc1``/``linear_fc2`` suffix belongs to:
    ``mlp.`` for the dense MLP, ``mlp.experts.{e}.`` for routed expert ``e``."""
    if suffix.startswith("mlp.experts.local_experts."):
        return f"mlp.experts.{suffix.split('.')[3]}."
    if suffix.startswith("mlp.linear_fc"):
        return "mlp."
    raise KeyError(f"{suffix!r} is not an MLP weight of the Megatron Qwen3 model")


def _pad_rows(w: torch.Tensor, rows: int) -> torch.Tensor:
    """[rows, H]: ``w`` [V, H] with zero rows appended."""
    return torch.cat([w, w.new_zeros(rows - w.shape[0], w.shape[1])])  # [rows, H]


def hf_to_mcore(get: Callable[[str], torch.Tensor], shape: Qwen3Shape, vocab_rows: int,
                names: Iterable[str] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Full (unsharded) Megatron tensors, in ``mcore_names`` order (or that of ``names``: one pipeline stage's
    parameters), from HF tensors fetched by name. ``output_layer.weight`` of a tied model (the last pipeline
    stage's copy of the embedding) comes from ``model.embed_tokens.weight``."""
    g, d, h = shape.kv_heads, shape.head_dim, shape.hidden
    qpg = shape.heads // g
    for name in mcore_names(shape) if names is None else names:
        if name == "embedding.word_embeddings.weight":
            yield name, _pad_rows(get("model.embed_tokens.weight"), vocab_rows)  # [Vp, H]
        elif name == "output_layer.weight":
            src = "model.embed_tokens.weight" if shape.tied else "lm_head.weight"
            yield name, _pad_rows(get(src), vocab_rows)  # [Vp, H]
        elif name == "decoder.final_layernorm.weight":
            yield name, get("model.norm.weight")  # [H]
        else:
            _, _, idx, suffix = name.split(".", 3)
            hf = f"model.layers.{idx}."
            if suffix in _LAYER_NORMS:
                yield name, get(hf + _LAYER_NORMS[suffix])
            elif suffix == "self_attention.linear_qkv.weight":
                q = get(hf + "self_attn.q_proj.weight").reshape(g, qpg * d, h)  # [G, Q/G*D, H]
                k = get(hf + "self_attn.k_proj.weight").reshape(g, d, h)  # [G, D, H]
                v = get(hf + "self_attn.v_proj.weight").reshape(g, d, h)  # [G, D, H]
                yield name, torch.cat([q, k, v], dim=1).reshape(g * (qpg + 2) * d, h)  # [G*(Q/G+2)*D, H]
            elif suffix == "self_attention.linear_proj.weight":
                yield name, get(hf + "self_attn.o_proj.weight")  # [H, Q*D]
            elif suffix == "mlp.router.weight":
                yield name, get(hf + "mlp.gate.weight")  # [E, H]
            elif suffix.endswith("linear_fc1.weight"):
                src = hf + _hf_mlp(suffix)
                gate = get(src + "gate_proj.weight")  # [F, H]
                yield name, torch.cat([gate, get(src + "up_proj.weight")])  # [2F, H]
            elif suffix.endswith("linear_fc2.weight"):
                yield name, get(hf + _hf_mlp(suffix) + "down_proj.weight")  # [H, F]
            else:  # pragma: no cover - mcore_names and this function list the same suffixes
                raise AssertionError(f"no HF source for {name}")


def mcore_to_hf(name: str, full: torch.Tensor, shape: Qwen3Shape) -> list[tuple[str, torch.Tensor]]:
    """The HF tensors one full Megatron tensor becomes (QKV → three, fc1 → two, others → one)."""
    g, d, h = shape.kv_heads, shape.head_dim, shape.hidden
    qpg = shape.heads // g
    if name == "embedding.word_embeddings.weight":
        return [("model.embed_tokens.weight", full[: shape.vocab])]  # [V, H]
    if name == "output_layer.weight":
        return [("lm_head.weight", full[: shape.vocab])]  # [V, H]
    if name == "decoder.final_layernorm.weight":
        return [("model.norm.weight", full)]
    parts = name.split(".", 3)
    if len(parts) != 4 or parts[:2] != ["decoder", "layers"]:
        raise KeyError(f"{name!r} is not a parameter of the Megatron Qwen3 model")
    hf = f"model.layers.{parts[2]}."
    suffix = parts[3]
    if suffix in _LAYER_NORMS:
        return [(hf + _LAYER_NORMS[suffix], full)]
    if suffix == "self_attention.linear_qkv.weight":
        grouped = full.reshape(g, (qpg + 2) * d, h)  # [G, (Q/G+2)*D, H]
        q, k, v = grouped.split([qpg * d, d, d], dim=1)  # [G, Q/G*D, H], [G, D, H], [G, D, H]
        return [(hf + "self_attn.q_proj.weight", q.reshape(g * qpg * d, h)),  # [Q*D, H]
                (hf + "self_attn.k_proj.weight", k.reshape(g * d, h)),  # [G*D, H]
                (hf + "self_attn.v_proj.weight", v.reshape(g * d, h))]  # [G*D, H]
    if suffix == "self_attention.linear_proj.weight":
        return [(hf + "self_attn.o_proj.weight", full)]
    if suffix == "mlp.router.weight":
        return [(hf + "mlp.gate.weight", full)]  # [E, H]
    if suffix.endswith("linear_fc1.weight"):
        gate, up = full.chunk(2)  # [F, H] each
        src = hf + _hf_mlp(suffix)
        return [(src + "gate_proj.weight", gate), (src + "up_proj.weight", up)]
    if suffix.endswith("linear_fc2.weight"):
        return [(hf + _hf_mlp(suffix) + "down_proj.weight", full)]
    raise KeyError(f"{name!r} is not a parameter of the Megatron Qwen3 model")


def shard(name: str, full: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    """TP rank ``rank``'s slice of the full Megatron tensor ``full`` (a view where the layout allows)."""
    split = mcore_split(name)
    if split is Split.REPLICATED or tp == 1:
        return full
    if split is Split.ROWS:
        return full.chunk(tp, dim=0)[rank]  # [rows/tp, ...]
    if split is Split.COLUMNS:
        return full.chunk(tp, dim=1)[rank]  # [H, cols/tp]
    gate, up = full.chunk(2)  # [F, H] each
    return torch.cat([gate.chunk(tp)[rank], up.chunk(tp)[rank]])  # [2F/tp, H]


def unshard(name: str, shards: list[torch.Tensor]) -> torch.Tensor:
    """The full Megatron tensor from every TP rank's slice, in rank order (inverse of ``shard``)."""
    split = mcore_split(name)
    if split is Split.REPLICATED or len(shards) == 1:
        return shards[0]
    if split is Split.ROWS:
        return torch.cat(shards, dim=0)
    if split is Split.COLUMNS:
        return torch.cat(shards, dim=1)
    halves = [s.chunk(2) for s in shards]  # ([F/tp, H], [F/tp, H]) per rank
    return torch.cat([gate for gate, _ in halves] + [up for _, up in halves])  # [2F, H]
