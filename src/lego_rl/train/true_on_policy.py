"""``train.true_on_policy``: the torch trainer's forward through the engine's batch-invariant ops.

The embedded engine in this mode decodes on ``StaticDecoder(invariant=True)``, whose every matmul, norm,
attention and log-softmax is a ``serving.batch_invariant`` op. ``install`` makes a Hugging Face model compute
the same function with the same ops, so a sampled token's logprob is bit-identical on both sides:

* every ``nn.Linear`` computes ``batch_invariant.linear(x, w)`` in the compute dtype (bf16 on CUDA: the casts
  torch's autocast would make, made explicitly; autocast itself is off, since it would also move the fp32
  policy ops such as ``sum`` and ``softmax`` that HF code runs outside these modules);
* every ``*RMSNorm`` module computes ``batch_invariant.rms_norm`` (HF's arithmetic, one fixed reduction order);
* attention is the implementation ``NAME`` in transformers' registry: ``attention_packed`` over the micro-batch's
  segments (``varlen_attention.packed_kwargs``), backward through varlen flash attention on CUDA;
* the head's log-softmax is ``batch_invariant.log_softmax`` (``head_logprobs``' ``log_softmax``).

What stays HF's is elementwise (embedding lookup, RoPE, SiLU, residual adds), which no batch can change.
``unsupported_reason`` says which models the engine side cannot mirror (``StaticDecoder``'s families).
"""

from __future__ import annotations

from typing import Any

import torch

from lego_rl.serving import batch_invariant as bi
from lego_rl.serving.static_decode import unsupported_reason as engine_reason
from lego_rl.train import varlen_attention

NAME = "lego_invariant"
"""The attention implementation's name in transformers' registry."""


def unsupported_reason(model: Any, device: torch.device, compute_dtype: torch.dtype) -> str | None:
    """Why ``model`` cannot train bit-identically to the engine, or None."""
    reason = engine_reason(model, model.config)
    if reason is not None:
        return f"the engine's invariant path cannot run it: {reason}"
    if device.type == "cuda" and compute_dtype != torch.bfloat16:
        return f"on CUDA the invariant kernels compute in bf16, not {compute_dtype} (train.precision = \"bf16\")"
    if not hasattr(model, "set_attn_implementation"):
        return "this transformers version has no set_attn_implementation"
    return None


def _linear_forward(module: torch.nn.Linear, dtype: torch.dtype) -> Any:
    def forward(x: torch.Tensor) -> torch.Tensor:
        bias = None if module.bias is None else module.bias.to(dtype)
        return bi.linear(x.to(dtype), module.weight.to(dtype), bias)

    return forward


def _norm_forward(module: torch.nn.Module) -> Any:
    eps = float(getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6)))

    def forward(x: torch.Tensor) -> torch.Tensor:
        weight: torch.Tensor = getattr(module, "weight")  # noqa: B009 (looked up per call: a load may replace it)
        return bi.rms_norm(x, weight, eps)

    return forward


def _attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
               **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention contract (``varlen_attention._attention``'s): ``query`` [B, Hq, T, D],
    ``key``/``value`` [B, Hkv, T, D] → [B, T, Hq, D]. B is 1 for a packed row (``cu_seq_lens_q``)."""
    if dropout:
        raise ValueError(f"{NAME} runs without dropout (the trainer turns it off)")
    b, hq, t, d = query.shape
    hkv = key.shape[1]
    dtype: torch.dtype = getattr(module, "lego_invariant_dtype")  # noqa: B009 (set by install)
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        bounds, longest = list(range(0, (b + 1) * t, t)), t
    elif b != 1:
        raise ValueError(f"packed segment boundaries need a batch of one row, got {b}")
    else:
        bounds, longest = [int(c) for c in cu.tolist()], int(kwargs["max_length_q"])
    q = query.transpose(1, 2).reshape(b * t, hq, d).to(dtype)  # [B*T, Hq, D]
    k = key.transpose(1, 2).reshape(b * t, hkv, d).to(dtype)  # [B*T, Hkv, D]
    v = value.transpose(1, 2).reshape(b * t, hkv, d).to(dtype)  # [B*T, Hkv, D]
    scale = float(scaling if scaling is not None else d ** -0.5)
    reference = None
    if bi.uses_kernels(q):
        cu_dev = torch.tensor(bounds, dtype=torch.int32, device=q.device)  # [S+1]

        def reference(qq: torch.Tensor, kk: torch.Tensor, vv: torch.Tensor) -> torch.Tensor:
            return varlen_attention.causal_varlen(qq, kk, vv, cu_dev, longest, scale)

    out = bi.attention_packed(q, k, v, bounds, scale, reference)  # [B*T, Hq, D]
    return out.view(b, t, hq, d), None


def install(model: Any, compute_dtype: torch.dtype) -> None:
    """Switch ``model``'s linears, RMSNorms and attention to the batch-invariant ops (see module docstring)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.forward = _linear_forward(module, compute_dtype)  # type: ignore[method-assign]
        elif type(module).__name__.endswith("RMSNorm") and isinstance(getattr(module, "weight", None),
                                                                       torch.nn.Parameter):
            module.forward = _norm_forward(module)  # type: ignore[method-assign]
        elif hasattr(module, "o_proj"):
            module.lego_invariant_dtype = compute_dtype  # the attention function casts to it
    AttentionInterface.register(NAME, _attention)
    AttentionMaskInterface.register(NAME, varlen_attention.no_mask)
    model.set_attn_implementation(NAME)


def log_softmax(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``head_logprobs``' log-softmax in this mode: the sampler's (``batch_invariant.log_softmax``)."""
    return bi.log_softmax(logits, temperature)
