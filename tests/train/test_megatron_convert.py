"""HF Qwen3 ↔ Megatron weight layout: bit-identical round trips, TP sharding, precise refusals (no megatron)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lego_rl.errors import ConfigError
from lego_rl.serving.tiny_model import ensure_tiny_model
from lego_rl.train.megatron_convert import (
    Qwen3Shape,
    check_pp,
    check_tp,
    full_shape,
    hf_to_mcore,
    mcore_names,
    mcore_to_hf,
    padded_vocab,
    pipeline_stage_of,
    shard,
    unshard,
)


@pytest.fixture(scope="module")
def tiny_model() -> Path:
    return ensure_tiny_model()


def hf_state(tiny_model: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(tiny_model / "model.safetensors"))


def untied_state(shape: Qwen3Shape, seed: int) -> dict[str, torch.Tensor]:
    """A random HF state of an untied Qwen3 with the given shape (every tensor distinct)."""
    g = torch.Generator().manual_seed(seed)
    h, d = shape.hidden, shape.head_dim
    state = {"model.embed_tokens.weight": torch.randn(shape.vocab, h, generator=g),
             "lm_head.weight": torch.randn(shape.vocab, h, generator=g),
             "model.norm.weight": torch.randn(h, generator=g)}
    for i in range(shape.num_layers):
        p = f"model.layers.{i}."
        for name, dims in (("self_attn.q_proj.weight", (shape.heads * d, h)),
                           ("self_attn.k_proj.weight", (shape.kv_heads * d, h)),
                           ("self_attn.v_proj.weight", (shape.kv_heads * d, h)),
                           ("self_attn.o_proj.weight", (h, shape.heads * d)),
                           ("self_attn.q_norm.weight", (d,)), ("self_attn.k_norm.weight", (d,)),
                           ("input_layernorm.weight", (h,)), ("post_attention_layernorm.weight", (h,)),
                           ("mlp.gate_proj.weight", (shape.ffn, h)), ("mlp.up_proj.weight", (shape.ffn, h)),
                           ("mlp.down_proj.weight", (h, shape.ffn))):
            state[p + name] = torch.randn(*dims, generator=g)
    return state


def round_trip(state: dict[str, torch.Tensor], shape: Qwen3Shape, tp: int) -> dict[str, torch.Tensor]:
    """HF → Megatron (sharded over ``tp`` ranks) → gathered → HF."""
    rows = padded_vocab(shape.vocab, tp)
    out: dict[str, torch.Tensor] = {}
    for name, full in hf_to_mcore(state.__getitem__, shape, rows):
        shards = [shard(name, full, r, tp).clone() for r in range(tp)]
        out.update(mcore_to_hf(name, unshard(name, shards), shape))
    return out


def test_tiny_model_round_trip_is_bit_identical(tiny_model: Path) -> None:
    shape = Qwen3Shape.from_hf_config(json.loads((tiny_model / "config.json").read_text()))
    state = hf_state(tiny_model)
    assert shape.tied and "lm_head.weight" not in state
    for tp in (1, 2):
        back = round_trip(state, shape, tp)
        assert back.keys() == state.keys()
        for name, t in state.items():
            assert back[name].dtype == t.dtype and torch.equal(back[name], t), (tp, name)


def test_untied_gqa_round_trip_through_four_tp_ranks() -> None:
    shape = Qwen3Shape(num_layers=2, hidden=64, heads=8, kv_heads=4, head_dim=16, ffn=96, vocab=301, tied=False,
                       rope_theta=1e6, norm_eps=1e-6, max_positions=4096)
    state = untied_state(shape, seed=3)
    back = round_trip(state, shape, tp=4)
    assert back.keys() == state.keys()
    assert all(torch.equal(back[n], t) for n, t in state.items())
    assert len(mcore_names(shape)) == 1 + 8 * 2 + 2  # embedding, 8 per layer, final norm, output layer


def test_pipeline_stages_split_the_layers_and_each_converts_alone() -> None:
    """Four layers on two stages: the embedding and layers 0-1 on the first, layers 2-3, the final norm and the
    output layer on the second. Converting each stage's names alone gives the same tensors as the whole model,
    and the second stage of a tied model takes its output layer from the embedding."""
    shape = Qwen3Shape(num_layers=4, hidden=16, heads=4, kv_heads=2, head_dim=4, ffn=24, vocab=50, tied=False,
                       rope_theta=1e4, norm_eps=1e-6, max_positions=64)
    names = mcore_names(shape)
    stages = [[n for n in names if pipeline_stage_of(n, shape.num_layers, 2) == s] for s in range(2)]
    assert stages[0][0] == "embedding.word_embeddings.weight" and stages[1][-2:] == [
        "decoder.final_layernorm.weight", "output_layer.weight"]
    assert {n.split(".")[2] for n in stages[0][1:]} == {"0", "1"}
    assert {n.split(".")[2] for n in stages[1][:-2]} == {"2", "3"}
    assert [pipeline_stage_of(f"decoder.layers.{i}.mlp.linear_fc2.weight", 4, 4) for i in range(4)] == [0, 1, 2, 3]
    state = untied_state(shape, seed=7)
    rows = padded_vocab(shape.vocab, 1)
    whole = dict(hf_to_mcore(state.__getitem__, shape, rows))
    parts = [dict(hf_to_mcore(state.__getitem__, shape, rows, names=stage)) for stage in stages]
    assert [list(p) for p in parts] == stages
    assert all(torch.equal(p[n], whole[n]) for p in parts for n in p)
    tied = Qwen3Shape(**{**shape.__dict__, "tied": True})
    (copy,) = hf_to_mcore(state.__getitem__, tied, rows, names=["output_layer.weight"])
    assert torch.equal(copy[1][: shape.vocab], state["model.embed_tokens.weight"])
    with pytest.raises(KeyError, match="'lm_head.weight' is not a parameter of the Megatron Qwen3 model"):
        pipeline_stage_of("lm_head.weight", 4, 2)
    with pytest.raises(ConfigError, match=r"pipeline_parallel = 3 does not divide the model's 4 layers") as exc:
        check_pp(shape, 3)
    assert exc.value.parameter == "train.pipeline_parallel"
    check_pp(shape, 4)


def test_full_shapes_from_a_tp_shard() -> None:
    """Rank 0 allocates other stages' tensors from these: the split dimension times TP, others as they are."""
    for name, local, full in (("embedding.word_embeddings.weight", (64, 16), (128, 16)),
                              ("decoder.layers.3.self_attention.linear_qkv.weight", (32, 16), (64, 16)),
                              ("decoder.layers.3.self_attention.linear_proj.weight", (16, 8), (16, 16)),
                              ("decoder.layers.3.mlp.linear_fc1.weight", (24, 16), (48, 16)),
                              ("decoder.layers.3.input_layernorm.weight", (16,), (16,))):
        assert full_shape(name, local, 2) == full, name
        assert full_shape(name, local, 1) == local


def test_qkv_groups_and_gated_fc1_shard_as_megatron_splits_them() -> None:
    """TP rank r must hold whole query groups [q heads of g, k_g, v_g] and [gate_r; up_r]."""
    shape = Qwen3Shape(num_layers=1, hidden=8, heads=4, kv_heads=2, head_dim=2, ffn=6, vocab=10, tied=True,
                       rope_theta=1e4, norm_eps=1e-6, max_positions=64)
    state = untied_state(shape, seed=0)
    mc = dict(hf_to_mcore(state.__getitem__, shape, padded_vocab(shape.vocab, 2)))
    qkv1 = shard("decoder.layers.0.self_attention.linear_qkv.weight",
                 mc["decoder.layers.0.self_attention.linear_qkv.weight"], 1, 2)  # group 1 of 2
    q, k, v = (state[f"model.layers.0.self_attn.{x}_proj.weight"] for x in "qkv")
    assert torch.equal(qkv1, torch.cat([q[4:8], k[2:4], v[2:4]]))  # heads 2-3, kv head 1 (head_dim 2)
    fc1 = shard("decoder.layers.0.mlp.linear_fc1.weight", mc["decoder.layers.0.mlp.linear_fc1.weight"], 0, 2)
    gate, up = state["model.layers.0.mlp.gate_proj.weight"], state["model.layers.0.mlp.up_proj.weight"]
    assert torch.equal(fc1, torch.cat([gate[:3], up[:3]]))
    emb = mc["embedding.word_embeddings.weight"]
    assert emb.shape[0] == 256 and torch.equal(emb[:10], state["model.embed_tokens.weight"])
    assert not emb[10:].any()  # padding rows are zero


def test_unsupported_configs_are_refused_by_field(tiny_model: Path) -> None:
    cfg = json.loads((tiny_model / "config.json").read_text())
    with pytest.raises(ConfigError, match="model_type 'llama'"):
        Qwen3Shape.from_hf_config({**cfg, "model_type": "llama"})
    with pytest.raises(ConfigError, match="attention_bias"):
        Qwen3Shape.from_hf_config({**cfg, "attention_bias": True})
    with pytest.raises(ConfigError, match="rope type 'yarn'"):
        Qwen3Shape.from_hf_config({**cfg, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}})
    shape = Qwen3Shape.from_hf_config(cfg)
    check_tp(shape, 2)
    with pytest.raises(ConfigError, match=r"tensor_parallel = 4 does not divide the model's num_key_value_heads \(2\)"):
        check_tp(shape, 4)


def test_num_params_matches_the_hf_model(tiny_model: Path) -> None:
    shape = Qwen3Shape.from_hf_config(json.loads((tiny_model / "config.json").read_text()))
    assert shape.num_params() == sum(t.numel() for t in hf_state(tiny_model).values())


def test_qwen3_moe_round_trip_is_bit_identical() -> None:
    moe = ensure_tiny_model(moe=True)
    cfg = json.loads((moe / "config.json").read_text())
    shape = Qwen3Shape.from_hf_config(cfg)
    assert (shape.num_experts, shape.moe_ffn, shape.experts_per_token) == (8, 128, 2)
    state = hf_state(moe)
    assert shape.num_params() == sum(t.numel() for t in state.values())
    for tp in (1, 2):
        back = round_trip(state, shape, tp)
        assert back.keys() == state.keys()
        assert all(torch.equal(back[n], t) for n, t in state.items()), tp
    with pytest.raises(ConfigError, match="every layer must be routed"):
        Qwen3Shape.from_hf_config({**cfg, "mlp_only_layers": [0]})


def test_names_and_shapes_are_megatron_cores_own(tiny_model: Path) -> None:
    """The mapping's names and per-rank shapes against a GPTModel megatron-core builds itself (dense and MoE)."""
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (the `megatron` extra)")
    import torch.nn.functional as F
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    from lego_rl.train.megatron_model import cpu_device_shim, init_parallel

    init_parallel(1, 1, None, torch.device("cpu"))
    for model in (tiny_model, ensure_tiny_model(moe=True)):
        shape = Qwen3Shape.from_hf_config(json.loads((model / "config.json").read_text()))
        moe = dict(num_moe_experts=shape.num_experts, moe_router_topk=shape.experts_per_token,
                   moe_ffn_hidden_size=shape.moe_ffn, moe_token_dispatcher_type="allgather",
                   moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0) if shape.num_experts else {}
        config = TransformerConfig(
            num_layers=shape.num_layers, hidden_size=shape.hidden, num_attention_heads=shape.heads,
            num_query_groups=shape.kv_heads, kv_channels=shape.head_dim, ffn_hidden_size=shape.ffn,
            normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
            qk_layernorm=True, use_cpu_initialization=True, perform_initialization=False,
            bias_activation_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
            gradient_accumulation_fusion=False, bias_dropout_fusion=False, apply_rope_fusion=False, **moe)
        spec = get_gpt_layer_local_spec(num_experts=shape.num_experts or None, qk_layernorm=True,
                                        normalization="RMSNorm")
        rows = padded_vocab(shape.vocab, 1)
        with cpu_device_shim(torch.device("cpu")):
            gpt = GPTModel(config, spec, vocab_size=rows, max_sequence_length=4096, position_embedding_type="rope",
                           share_embeddings_and_output_weights=shape.tied)
        theirs = {n: tuple(p.shape) for n, p in gpt.named_parameters()}
        ours = {n: tuple(t.shape) for n, t in hf_to_mcore(hf_state(model).__getitem__, shape, rows)}
        assert ours == theirs, model.name
