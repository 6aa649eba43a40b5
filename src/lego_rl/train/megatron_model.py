"""The Megatron-core pieces of the Megatron backend: process groups, the GPT model, packed attention and
vocab-parallel logprobs. Importing this module imports megatron-core (the ``megatron`` extra).

* **Model.** ``GPTModel`` with the local layer spec (no Transformer Engine exists on our machines) whose core
  attention is replaced by ``PackedCausalAttention``: the spec's ``DotProductAttention`` refuses packed
  sequences and materialises ``[heads, T, T]`` scores. Micro-batches arrive packed (``cu_seqlens``), so the
  model runs in Megatron's ``thd`` layout: RoPE restarts at every segment (``PackedSeqParams``) and attention
  is causal within each segment only. Each segment goes through ``scaled_dot_product_attention``, which picks
  FlashAttention for bf16 on CUDA and the math kernel in fp32 on CPU; GQA heads are not repeated in memory.
* **Precision.** fp32 parameters (the optimizer's master copy is the parameter itself), bf16 autocast on CUDA,
  fp32 on CPU, logits in fp32 before any softmax: the torch backend's recipe, so the two agree step for step.
* **Vocab-parallel logprobs.** Logits stay split by vocabulary across TP ranks; the log-softmax needs only two
  all-reduces of ``[T]`` vectors (max, sum of exponentials) and one for the picked logit. Top-p/top-k
  truncation needs the sorted full distribution, so then the rows are all-gathered (differentiably) and go
  through ``serving.logprobs.sampler_logprobs``, the function the engine's convention is defined by.
* **Pipeline stages.** ``build_gpt(pp=, pp_rank=)`` builds one stage (megatron-core's ``pre_process`` /
  ``post_process``); ``stage_forward`` runs it on the previous stage's hidden states. The schedule that moves
  them between stages is ``lego_rl.train.pipeline``'s.
* **CPU.** megatron-core asks ``torch.cuda.current_device()`` where to put RoPE's frequency table and the
  buffers of its TP gathers, even for CPU tensors; ``cpu_device_shim`` answers ``"cpu"`` while a CPU model is
  built, run or trained (tests and CPU-only machines).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from megatron.core import parallel_state as ps
from megatron.core import tensor_parallel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.moe import moe_utils as _moe_utils
from megatron.core.transformer.transformer_config import TransformerConfig

from lego_rl.errors import ConfigError
from lego_rl.serving.logprobs import sampler_logprobs
from lego_rl.train.distributed import check_rendezvous
from lego_rl.train.megatron_convert import Qwen3Shape, check_pp, check_sp
from lego_rl.train.pipeline import Stage

if not hasattr(_moe_utils, "te_general_gemm"):
    # megatron-core 0.16 tests ``te_general_gemm is not None`` in the MoE router's linear but binds the name only
    # when Transformer Engine imports (0.19 binds it to None otherwise); without TE every router raised NameError.
    _moe_utils.te_general_gemm = None


@contextlib.contextmanager
def cpu_device_shim(device: torch.device) -> Iterator[None]:
    """While a CPU model is built or run, ``torch.cuda.current_device()`` answers ``"cpu"`` (megatron-core
    moves RoPE's table to it unconditionally). A no-op on CUDA."""
    if device.type != "cpu":
        yield
        return
    with (mock.patch.object(torch.cuda, "current_device", lambda: "cpu"),
          mock.patch.object(tensor_parallel, "get_cuda_rng_tracker", lambda: _NO_RNG_FORK)):
        yield


_MODEL_PARALLEL_RNG = "model-parallel-rng"


class _NoRngFork:
    """Megatron-core's CUDA RNG tracker on CPU: sequence-parallel regions fork its stream around dropout, which
    is 0 in this model, so there is no stream to switch to (and no CUDA generator to read)."""

    def fork(self, name: str = _MODEL_PARALLEL_RNG) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


_NO_RNG_FORK = _NoRngFork()


@dataclass(frozen=True)
class ParallelLayout:
    """This process's place in the TP × PP × DP grid (megatron-core's rank order: TP fastest, then DP, then PP,
    so global rank 0 is TP rank 0 of DP rank 0 on the first pipeline stage). Expert parallelism is carved out
    of DP: the ``ep`` consecutive DP ranks of an expert-parallel group hold different experts (``ep_rank``)."""

    tp: int
    dp: int
    tp_rank: int
    dp_rank: int
    rank: int
    pp: int = 1
    pp_rank: int = 0
    ep: int = 1
    ep_rank: int = 0

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_parallel(tp: int, pp: int, dp: int | None, device: torch.device, ep: int = 1) -> ParallelLayout:
    """Join (or, alone, create) the process group and Megatron's TP/DP/EP groups; check the sizes multiply up
    and that ``ep`` divides DP (megatron-core takes the expert-parallel ranks from the data-parallel ones).

    Under ``torchrun`` (or Ray) the launcher has set ``RANK``/``WORLD_SIZE``; a plain ``lego train`` is one
    process, so there ``tp * pp * dp`` must be 1.
    """
    if not dist.is_initialized():
        if int(os.environ.get("WORLD_SIZE", "1")) == 1:
            port = _free_port()
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                    init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                                    timeout=datetime.timedelta(minutes=30))
        else:
            check_rendezvous()  # torchrun --master-port 0 would hang every rank silently
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                    timeout=datetime.timedelta(minutes=30))
    world = dist.get_world_size()
    if dp is None:
        if world % (tp * pp):
            sizes = (f"train.tensor_parallel = {tp}" if pp == 1 else
                     f"train.tensor_parallel × train.pipeline_parallel = {tp}×{pp}")
            raise ConfigError(
                f"{sizes} needs a multiple of {tp * pp} trainer processes, but {world} "
                f"{'is' if world == 1 else 'are'} running; launch them with torchrun --nproc-per-node (one per GPU)",
                parameter="train.tensor_parallel" if pp == 1 else "train.pipeline_parallel", value=tp * pp)
        dp = world // (tp * pp)
    if tp * pp * dp != world:
        raise ConfigError(
            f"train.tensor_parallel ({tp}) × train.pipeline_parallel ({pp}) × train.data_parallel ({dp}) = "
            f"{tp * pp * dp} trainer processes, but {world} {'is' if world == 1 else 'are'} running; launch "
            f"that many (torchrun --nproc-per-node) or set the sizes to multiply to {world}",
            parameter="train.data_parallel", value=dp)
    if dp % ep:
        raise ConfigError(f"train.expert_parallel = {ep} does not divide the data-parallel size {dp}: the "
                          "expert-parallel ranks are carved out of the data-parallel ones; choose a divisor of it",
                          parameter="train.expert_parallel", value=ep)
    if ps.model_parallel_is_initialized():
        if ps.get_tensor_model_parallel_world_size() != tp:
            raise ConfigError(f"Megatron is already initialised with tensor parallel size "
                              f"{ps.get_tensor_model_parallel_world_size()} in this process, not {tp}",
                              parameter="train.tensor_parallel", value=tp)
        if ps.get_pipeline_model_parallel_world_size() != pp:
            raise ConfigError(f"Megatron is already initialised with pipeline parallel size "
                              f"{ps.get_pipeline_model_parallel_world_size()} in this process, not {pp}",
                              parameter="train.pipeline_parallel", value=pp)
        if ps.get_expert_model_parallel_world_size() != ep:
            raise ConfigError(f"Megatron is already initialised with expert parallel size "
                              f"{ps.get_expert_model_parallel_world_size()} in this process, not {ep}",
                              parameter="train.expert_parallel", value=ep)
    else:
        ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                     expert_model_parallel_size=ep)
    if device.type == "cuda":
        # Sequence-parallel regions fork megatron-core's model-parallel RNG stream around their dropout (which is
        # 0 here): the stream must exist. ``add`` restores the CUDA generator, so sampling elsewhere is unmoved.
        tracker = tensor_parallel.get_cuda_rng_tracker()
        if _MODEL_PARALLEL_RNG not in tracker.get_states():
            tracker.add(_MODEL_PARALLEL_RNG, 2718 + ps.get_tensor_model_parallel_rank())
    return ParallelLayout(tp=tp, dp=dp, tp_rank=ps.get_tensor_model_parallel_rank(),
                          dp_rank=ps.get_data_parallel_rank(), rank=dist.get_rank(), pp=pp,
                          pp_rank=ps.get_pipeline_model_parallel_rank(), ep=ep,
                          ep_rank=ps.get_expert_model_parallel_rank())


def pipeline_stage(layout: ParallelLayout) -> Stage:
    """This rank's ``pipeline.Stage``: its neighbours are the ranks at the same TP and DP position one stage
    before and after (megatron-core's pipeline group, over which its messages travel; the backend's first
    collective on that group involves every stage, as NCCL wants before batched send/receive)."""
    group = ps.get_pipeline_model_parallel_group()
    ranks = dist.get_process_group_ranks(group)  # global ranks, stage order
    s = layout.pp_rank
    return Stage(rank=s, size=layout.pp, prev=ranks[s - 1] if s > 0 else None,
                 next=ranks[s + 1] if s + 1 < layout.pp else None, group=group)


_KERNELS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
"""SDPA kernels in order of preference. cuDNN attention is left out on purpose: it rebuilds its graph whenever
the shape changes, and packed segments change shape every call (the engine side measured ~17 ms of CPU per
call from it); FlashAttention is also what the engine decodes with, so both sides run the same kernel."""


class PackedCausalAttention(MegatronModule):
    """Core attention over packed segments (Megatron's ``thd`` layout): causal inside each segment, nothing
    across. Takes the constructor and call arguments of Megatron's ``DotProductAttention``."""

    def __init__(self, config: TransformerConfig, layer_number: int, attn_mask_type: Any, attention_type: str,
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 **_unused: Any) -> None:
        super().__init__(config=config)
        self.softmax_scale = softmax_scale  # None: SDPA's 1/sqrt(head_dim), Qwen3's scaling

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, attn_mask_type: Any = None,
                attention_bias: torch.Tensor | None = None,
                packed_seq_params: PackedSeqParams | None = None, **_unused: Any) -> torch.Tensor:
        """``query`` [T, Hq, D], ``key``/``value`` [T, Hkv, D] (thd) → [T, Hq*D]."""
        if packed_seq_params is None or packed_seq_params.qkv_format != "thd":
            raise ValueError("PackedCausalAttention runs on packed (thd) sequences only; pass packed_seq_params")
        bounds = packed_seq_params.cu_seqlens_q.tolist()
        if query.is_cuda and torch.is_autocast_enabled("cuda"):
            # Norms and RoPE may hand back fp32 under autocast; FlashAttention takes bf16 only.
            half = torch.get_autocast_dtype("cuda")
            query, key, value = query.to(half), key.to(half), value.to(half)
        out = torch.empty_like(query)  # [T, Hq, D]
        for start, end in zip(bounds[:-1], bounds[1:], strict=True):
            # 4-D: the fused kernels refuse 3-D inputs and SDPA would fall back to the [H, L, L] math kernel.
            q = query[start:end].transpose(0, 1).unsqueeze(0)  # [1, Hq, L, D]
            k = key[start:end].transpose(0, 1).unsqueeze(0)  # [1, Hkv, L, D]
            v = value[start:end].transpose(0, 1).unsqueeze(0)  # [1, Hkv, L, D]
            with sdpa_kernel(_KERNELS):
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale,
                                                   enable_gqa=q.shape[1] != k.shape[1])  # [1, Hq, L, D]
            out[start:end] = o[0].transpose(0, 1)  # [L, Hq, D]
        return out.reshape(out.shape[0], -1)  # [T, Hq*D]


def _moe_config(shape: Qwen3Shape, routing_replay: bool, ep: int = 1) -> dict[str, Any]:
    """TransformerConfig fields of a Qwen3-MoE layer: every layer routed, top-k over a softmax, no shared
    expert, no auxiliary loss (RL fine-tuning does not rebalance experts), ``ep`` expert-parallel ranks (each
    holds ``num_experts / ep`` of them; the all-gather dispatcher gathers every rank's tokens, so the ranks of
    an expert-parallel group must run their forwards in step with equal token counts)."""
    if not shape.num_experts:
        return {}
    return dict(
        num_moe_experts=shape.num_experts, moe_router_topk=shape.experts_per_token,
        moe_ffn_hidden_size=shape.moe_ffn, moe_token_dispatcher_type="allgather",
        moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0, moe_z_loss_coeff=None,
        moe_input_jitter_eps=None,  # jitter would make old and new logprobs two different functions
        # Qwen3-MoE's router: softmax over all experts, then top-k; renormalised or not per norm_topk_prob.
        # Megatron's top-k-then-softmax is exactly the renormalised form; pre-softmax is the plain one.
        moe_router_pre_softmax=not shape.norm_topk_prob, moe_router_score_function="softmax",
        moe_enable_routing_replay=routing_replay, moe_router_dtype="fp32", expert_model_parallel_size=ep,
    )


def _route_outside_autocast(model: GPTModel) -> None:
    """Run every MoE router's gating linear with autocast off, in fp32 (``moe_router_dtype``).

    megatron-core's ``RouterGatingLinearFunction`` is a custom autograd function written for bf16 *parameters*,
    not autocast: under autocast its forward ``mm`` comes out bf16 while its backward multiplies that bf16
    gradient by the fp32 weight, and backward fails (measured on the H200 with 0.19.2, and on CPU autocast with
    0.16). fp32 router logits are also what keeps near-tie expert choices stable."""
    for layer in model.decoder.layers:
        router = getattr(layer.mlp, "router", None)
        if router is None:
            continue
        gating = router.gating

        def fp32_gating(inp: torch.Tensor, _gating: Any = gating) -> torch.Tensor:
            with torch.autocast(inp.device.type, enabled=False):
                return _gating(inp.float())  # [T, E] fp32 logits

        router.gating = fp32_gating


class SequenceParallelRMSNorm:
    """The norm of a sequence-parallel model: ``torch.nn.RMSNorm``, as megatron-core's ``WrappedTorchNorm`` builds
    it, without that class's refusal of sequence parallelism (it only asserts; the arithmetic is per position).
    Under sequence parallelism a norm outside the TP regions sees only this rank's ``T / tp`` positions, so its
    weight's gradient is a partial sum: the backend sums it over the TP group (``SEQUENCE_PARALLEL_GRADS``)."""

    def __new__(cls, config: TransformerConfig, hidden_size: int, eps: float = 1e-5,  # type: ignore[misc]
                **_: Any) -> torch.nn.RMSNorm:
        return torch.nn.RMSNorm(normalized_shape=hidden_size, eps=eps)


SEQUENCE_PARALLEL_GRADS = ("input_layernorm.weight", "pre_mlp_layernorm.weight", "final_layernorm.weight",
                           "mlp.router.weight")
"""Name suffixes of the parameters replicated over TP that see only this rank's share of the sequence under
sequence parallelism (the norms before attention and MLP, the final norm, a MoE router): their gradients are
summed over the TP group. The q/k norms run inside attention, on the whole sequence and this rank's heads."""


def _sequence_parallel_block(spec: Any, layers: int) -> Any:
    """The decoder block spec of a sequence-parallel model: ``spec``'s layers with ``SequenceParallelRMSNorm``
    for every norm (megatron-core's torch norm refuses sequence parallelism, and without Transformer Engine or
    Apex it is the only one), ``layers`` of them."""
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    sub = spec.submodules
    sub.input_layernorm = sub.pre_mlp_layernorm = SequenceParallelRMSNorm
    attention = sub.self_attention.submodules
    attention.q_layernorm = attention.k_layernorm = SequenceParallelRMSNorm
    return TransformerBlockSubmodules(layer_specs=[spec] * layers, layer_norm=SequenceParallelRMSNorm)


def build_gpt(shape: Qwen3Shape, *, vocab_rows: int, tp: int, device: torch.device,
              recompute: bool, routing_replay: bool = False, pp: int = 1, pp_rank: int = 0,
              ep: int = 1, sequence_parallel: bool = False) -> GPTModel:
    """A Megatron GPT with Qwen3's architecture, dense or MoE (weights uninitialised: the caller loads them).
    With ``routing_replay`` every MoE router gets megatron-core's ``RouterReplay`` (R3). With ``ep`` > 1 this
    rank's MoE layers hold experts ``[ep_rank·E/ep, (ep_rank+1)·E/ep)`` as ``local_experts.0..``.

    With ``pp`` > 1 it is stage ``pp_rank``'s part: ``num_layers / pp`` consecutive decoder layers, the
    embedding on the first stage, the final norm and output layer on the last. Tied embeddings are then two
    untied parameters, the embedding on the first stage and its copy as the output layer on the last: the
    backend loads both from the one HF tensor and sums their gradients (megatron-core's own tying set-up moves
    the copy with ``.cuda()``, which a CPU build cannot run).

    With ``sequence_parallel`` (TP > 1, one stage) the activations between the TP regions are split along the
    sequence: the embedding reduce-scatters, each norm and residual runs on ``T / tp`` positions, the linear
    layers all-gather and reduce-scatter instead of all-reducing; ``stage_forward`` pads ``T`` to a multiple of
    ``tp``. MoE layers need it to train under TP."""
    check_pp(shape, pp)
    check_sp(sequence_parallel, pp)
    sequence_parallel = sequence_parallel and tp > 1
    config = TransformerConfig(
        num_layers=shape.num_layers, hidden_size=shape.hidden, num_attention_heads=shape.heads,
        num_query_groups=shape.kv_heads, kv_channels=shape.head_dim, ffn_hidden_size=shape.ffn,
        normalization="RMSNorm", layernorm_epsilon=shape.norm_eps, gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False, add_qkv_bias=False, qk_layernorm=True,
        hidden_dropout=0.0, attention_dropout=0.0,  # old and new logprobs must be one deterministic function
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, sequence_parallel=sequence_parallel,
        pipeline_dtype=torch.float32,  # megatron-core insists when pp > 1; our schedule's wire is fp32 too
        params_dtype=torch.float32, use_cpu_initialization=device.type == "cpu", perform_initialization=False,
        bias_activation_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
        gradient_accumulation_fusion=False, bias_dropout_fusion=False, apply_rope_fusion=False,
        recompute_granularity="full" if recompute else None, recompute_method="uniform" if recompute else None,
        recompute_num_layers=1 if recompute else None, **_moe_config(shape, routing_replay, ep),
    )
    spec = get_gpt_layer_local_spec(num_experts=shape.num_experts or None, qk_layernorm=True,
                                    normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = PackedCausalAttention
    block = _sequence_parallel_block(spec, shape.num_layers) if sequence_parallel else spec
    with cpu_device_shim(device):
        model = GPTModel(config, block, vocab_size=vocab_rows, max_sequence_length=shape.max_positions,
                         pre_process=pp_rank == 0, post_process=pp_rank == pp - 1, parallel_output=True,
                         share_embeddings_and_output_weights=shape.tied and pp == 1,
                         position_embedding_type="rope",
                         rotary_percent=1.0, rotary_base=int(shape.rope_theta))
    _route_outside_autocast(model)
    return model.to(device)


def packed_logits(model: GPTModel, input_ids: torch.Tensor, cu_seqlens: torch.Tensor,
                  device: torch.device, *, bf16: bool = True) -> torch.Tensor:
    """[T, V/tp] logits of one packed micro-batch (``input_ids`` [T], ``cu_seqlens`` [S+1]); the
    forward runs under bf16 autocast on CUDA unless ``bf16`` is False (fp32 parity checks)."""
    return stage_forward(model, input_ids, cu_seqlens, device, bf16=bf16)


def stage_forward(model: GPTModel, input_ids: torch.Tensor, cu_seqlens: torch.Tensor, device: torch.device, *,
                  bf16: bool = True, hidden: torch.Tensor | None = None) -> torch.Tensor:
    """One pipeline stage's forward of a packed micro-batch: ``hidden`` [T, 1, H] is the previous stage's
    output (None on the first stage, which embeds ``input_ids``); returns [T, V/tp] logits on the last stage,
    the [T, 1, H] hidden states elsewhere. With one stage it is the whole model."""
    if not model.pre_process:
        if hidden is None:
            raise ValueError("a pipeline stage after the first needs the previous stage's hidden states")
        model.set_input_tensor(hidden)
    length = int(input_ids.shape[0])
    tp = model.config.tensor_model_parallel_size
    if model.config.sequence_parallel and length % tp:
        # The embedding scatters the sequence over the TP ranks in equal parts: pad with one segment of its own
        # (it attends only to itself), whose logits are cut off below.
        extra = tp - length % tp
        input_ids = torch.cat([input_ids, input_ids.new_zeros(extra)])  # [T'] T' = T rounded up to tp
        cu_seqlens = torch.cat([cu_seqlens, cu_seqlens.new_tensor([length + extra])])  # [S+2]
    ids = input_ids.to(device).unsqueeze(0)  # [1, T']
    cu = cu_seqlens.to(device=device, dtype=torch.int32)  # [S'+1]
    longest = int((cu[1:] - cu[:-1]).max())
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest,
                             max_seqlen_kv=longest)
    # RoPE positions come from cu_seqlens (restart per segment); position_ids feed no learned embedding here.
    positions = torch.zeros_like(ids)  # [1, T]
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" and bf16
                else contextlib.nullcontext())
    with cpu_device_shim(device), autocast:
        out = model(input_ids=ids, position_ids=positions, attention_mask=None, packed_seq_params=params)
    if not model.post_process:
        return out  # [T, 1, H] hidden states for the next stage
    return out[0][:length]  # [T, V/tp] bf16 under autocast: the logprob kernels upcast a chunk at a time


LOGIT_ROWS = 2048
"""Positions whose fp32 softmax is formed at once (2048 × 151,936 fp32 ≈ 1.2 GB): the full ``[T, V]`` fp32
tensor is never materialised, forward or backward."""


def _tp() -> tuple[Any, int, int]:
    group = ps.get_tensor_model_parallel_group()
    return group, ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()


class _VocabParallelLogprob(torch.autograd.Function):
    """``log softmax(logits * inv_temp)[target]`` over a vocabulary split across TP ranks, in row chunks.

    Saves only the logits (in their own dtype: bf16 under autocast) and one fp32 log-normaliser per row; the
    backward recomputes each chunk's softmax (``d/dx_j = inv_temp * ([j = t] - p_j)``, this rank's columns
    only). Entropy (no gradient) comes from the same pass when asked for.
    """

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, vocab: int, inv_temp: float,
                with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
        group, size, rank = _tp()
        n, rows = logits.shape
        start = rank * rows
        padding = (torch.arange(rows, device=logits.device) + start) >= vocab  # [V/tp]
        local = (targets >= start) & (targets < start + rows)  # [N]
        idx = (targets - start).clamp(0, rows - 1)  # [N]
        log_norm = torch.empty(n, device=logits.device)  # [N]
        picked = torch.empty(n, device=logits.device)  # [N]
        entropy = torch.zeros(n if with_entropy else 0, device=logits.device)  # [N] or [0]
        for a in range(0, n, LOGIT_ROWS):
            x = (logits[a:a + LOGIT_ROWS].float() * inv_temp).masked_fill_(padding, float("-inf"))  # [n, V/tp]
            peak = x.amax(dim=-1)  # [n]
            if size > 1:
                dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=group)
            x.sub_(peak.unsqueeze(-1))  # [n, V/tp] shifted, ≤ 0
            e = x.exp()  # [n, V/tp] 0 on padding
            sums = torch.stack([e.sum(-1),  # [n] Σ exp
                                torch.where(local[a:a + LOGIT_ROWS],
                                            x.gather(-1, idx[a:a + LOGIT_ROWS, None]).squeeze(-1), 0.0)])  # [2, n]
            if with_entropy:
                sums = torch.cat([sums, (e * x.masked_fill_(padding, 0.0)).sum(-1)[None]])  # [3, n] + Σ e·x
            if size > 1:
                dist.all_reduce(sums, group=group)
            log_norm[a:a + LOGIT_ROWS] = peak + sums[0].log()
            picked[a:a + LOGIT_ROWS] = sums[1] + peak
            if with_entropy:
                entropy[a:a + LOGIT_ROWS] = sums[0].log() - sums[2] / sums[0]  # H = log Z - E[x]
        ctx.save_for_backward(logits, targets, log_norm)
        ctx.vocab, ctx.inv_temp = vocab, inv_temp
        ctx.mark_non_differentiable(entropy)
        return picked - log_norm, entropy

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _grad_entropy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        logits, targets, log_norm = ctx.saved_tensors
        _, _, rank = _tp()
        n, rows = logits.shape
        start = rank * rows
        padding = (torch.arange(rows, device=logits.device) + start) >= ctx.vocab  # [V/tp]
        local = (targets >= start) & (targets < start + rows)  # [N]
        idx = (targets - start).clamp(0, rows - 1)  # [N]
        out = torch.empty_like(logits)  # [N, V/tp]
        for a in range(0, n, LOGIT_ROWS):
            x = (logits[a:a + LOGIT_ROWS].float() * ctx.inv_temp).masked_fill_(padding, float("-inf"))  # [n, V/tp]
            g = grad[a:a + LOGIT_ROWS].float()  # [n]
            d = (x - log_norm[a:a + LOGIT_ROWS, None]).exp_().mul_(-g[:, None])  # [n, V/tp] -g·p
            hit = local[a:a + LOGIT_ROWS]  # [n]
            d[hit, idx[a:a + LOGIT_ROWS][hit]] += g[hit]  # + g at the target column, where it lives here
            out[a:a + LOGIT_ROWS] = d.mul_(ctx.inv_temp)
        return out, None, None, None, None


def vocab_parallel_logprobs(logits: torch.Tensor, targets: torch.Tensor, *, vocab: int, temperature: float = 1.0,
                            top_p: float = 1.0, top_k: int = -1, with_entropy: bool = False
                            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``([N] log-probability of targets, [N] entropy or None)`` under ``softmax(logits / temperature)``,
    where ``logits`` [N, V/tp] is this TP rank's vocabulary slice (any float dtype) and padding columns (global
    id ≥ ``vocab``) are excluded. With top-p/top-k the logprob is the sampler's truncated, renormalised one
    (``sampler_logprobs``, on all-gathered fp32 rows); the entropy is always the untruncated distribution's.
    Differentiable in ``logits``."""
    truncated = top_p < 1.0 or top_k > 0
    lp = ent = None
    if with_entropy or not truncated:
        lp, ent = _VocabParallelLogprob.apply(logits, targets, vocab, 1.0 / temperature, with_entropy)
    if truncated:
        tp_group, _, _ = _tp()
        full = gather_from_tensor_model_parallel_region(logits, group=tp_group)[:, :vocab]  # [N, V]
        lp = sampler_logprobs(full.float() / temperature, targets, temperature=1.0, top_p=top_p,
                              top_k=top_k)  # [N]
    assert lp is not None
    return lp, (ent if with_entropy else None)
