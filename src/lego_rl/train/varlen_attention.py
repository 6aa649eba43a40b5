"""Attention over packed segments without a ``[T, T]`` mask: torch's variable-length flash attention (CUDA).

A packed micro-batch is one row of ``T`` tokens holding many segments. Handed to SDPA, transformers turns the
position-id restarts into a dense block-diagonal mask, and the kernel then computes all ``T²`` scores and masks
most of them away: at 16k tokens of ~300-token segments that is as many FLOPs as the rest of a 0.6B model, and
the mask alone is ``T²`` elements (4 G at 64k). ``torch.nn.attention.varlen.varlen_attn`` takes the segments'
``cu_seqlens`` instead and computes each segment's causal attention alone: the cost follows ``Σ len²``.

How it plugs in: the function below is registered with transformers' attention interface under
:data:`NAME` (and a mask function that builds no mask), the model is switched to it, and every forward passes
the micro-batch's boundaries as the flash keyword arguments transformers forwards to each attention layer
(:func:`packed_kwargs`). A forward without them (one unpacked sequence) is one segment.

Only where the kernel exists: CUDA, bf16/fp16 compute (the trainer's autocast), and a model whose layers all
attend fully. :func:`unsupported_reason` says why not otherwise, so that ``packed_attention = "auto"`` takes the
SDPA path there: an fp32 trainer (``precision = "fp32"``: autocast off) attends through SDPA's block-diagonal
mask, whose kernels take fp32; an explicit ``"varlen"`` is refused (``KERNEL_DTYPES``).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

NAME = "lego_varlen"
"""The attention implementation's name in transformers' registry."""

KERNEL_DTYPES = (torch.bfloat16, torch.float16)
"""The compute dtypes torch's varlen kernel (flash attention) takes: there is no fp32 flash attention."""


@functools.cache
def _kernel() -> Any | None:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # torch < 2.10
        return None
    return varlen_attn


@functools.cache
def _kernel_params() -> frozenset[str]:
    """The keyword arguments this torch's ``varlen_attn`` takes (they changed between 2.10 and 2.13); looked up
    once, not in every layer's forward."""
    kernel = _kernel()
    return frozenset(inspect.signature(kernel).parameters) if kernel is not None else frozenset()


def dtype_reason(compute_dtype: torch.dtype) -> str | None:
    """Why attention computed in ``compute_dtype`` cannot use the varlen kernel, or None when it can (no torch
    or device needed: ``lego validate`` asks it too)."""
    if compute_dtype in KERNEL_DTYPES:
        return None
    return (f"the forward computes in {str(compute_dtype).removeprefix('torch.')} and the varlen kernel is flash "
            "attention, which takes bf16 or fp16 only")


def unsupported_reason(model: Any, device: torch.device, compute_dtype: torch.dtype = torch.bfloat16) -> str | None:
    """Why ``model`` on ``device``, attending in ``compute_dtype`` (the autocast dtype, or the weights' dtype
    when autocast is off), cannot use varlen attention, or None when it can."""
    if device.type != "cuda":
        return f"device {device} is not CUDA (the kernel is flash attention)"
    reason = dtype_reason(compute_dtype)
    if reason is not None:
        return reason
    kernel = _kernel()
    if kernel is None:
        return f"torch {torch.__version__} has no torch.nn.attention.varlen"
    params = _kernel_params()
    if "window_size" not in params and "is_causal" not in params:
        return f"torch {torch.__version__}'s varlen_attn takes neither window_size nor is_causal"
    config = model.config
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        return f"layer types {sorted(set(layer_types))}: only full attention is supported"
    if getattr(config, "use_sliding_window", False):
        return "the model uses sliding-window attention"
    if not hasattr(model, "set_attn_implementation"):
        return "this transformers version has no set_attn_implementation"
    return None


def packed_kwargs(cu_seqlens: torch.Tensor, device: torch.device) -> dict[str, Any]:
    """The keyword arguments a forward over one packed row passes so that every attention layer sees the
    segment boundaries (``cu_seqlens`` ``[S+1]`` int32, 0 … T)."""
    cu = cu_seqlens.to(device=device, dtype=torch.int32)  # [S+1]
    longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max()) if cu_seqlens.numel() > 1 else 0
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}


def _attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
               **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: ``query`` ``[B, Hq, T, D]``, ``key``/``value`` ``[B, Hkv, T, D]``
    in, ``[B, T, Hq, D]`` out. ``B`` is 1 for a packed row; a batch of unpacked rows (no ``cu_seq_lens_q``) is
    laid end to end as B segments of T."""
    if dropout:
        raise ValueError("varlen attention runs without dropout (the trainer turns it off)")
    if kwargs.get("sliding_window") is not None:
        raise ValueError(f"{NAME} does not implement sliding-window attention")
    b, hq, t, d = query.shape
    hkv = key.shape[1]
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        cu = torch.arange(0, (b + 1) * t, t, dtype=torch.int32, device=query.device)  # [B+1]
        longest = t
    else:
        if b != 1:
            raise ValueError(f"packed segment boundaries need a batch of one row, got {b}")
        longest = int(kwargs["max_length_q"])
    if torch.is_autocast_enabled(query.device.type):
        # Not an autocast op: cast as autocast casts SDPA's inputs (the q/k norms hand back fp32 under autocast).
        dt = torch.get_autocast_dtype(query.device.type)
        query, key, value = query.to(dt), key.to(dt), value.to(dt)
    if query.dtype not in KERNEL_DTYPES:
        # The backend picks SDPA for an fp32 forward (unsupported_reason); only a model switched here and then
        # run without autocast gets this far.
        raise ValueError(f"{NAME} needs bf16 or fp16 inputs (flash attention), got {query.dtype}: an fp32 "
                         "forward attends through SDPA (packed_attention 'auto' or 'sdpa')")
    q = query.transpose(1, 2).reshape(b * t, hq, d)  # [B*T, Hq, D]
    k = key.transpose(1, 2).reshape(b * t, hkv, d)  # [B*T, Hkv, D]
    v = value.transpose(1, 2).reshape(b * t, hkv, d)  # [B*T, Hkv, D]
    out = causal_varlen(q, k, v, cu, longest, scaling)  # [B*T, Hq, D]
    return out.view(b, t, hq, d), None


def causal_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, longest: int,
                  scale: float | None) -> torch.Tensor:
    """Causal attention within each segment ``cu`` [S+1] (int32, on the device) of ``q`` [T, Hq, D] and
    ``k``/``v`` [T, Hkv, D] through torch's varlen kernel: [T, Hq, D] (differentiable)."""
    hq, hkv = q.shape[1], k.shape[1]
    kernel = _kernel()
    assert kernel is not None  # unsupported_reason was checked before the model was switched
    params = _kernel_params()
    extra: dict[str, Any] = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    if hq != hkv:
        if "enable_gqa" in params:
            extra["enable_gqa"] = True
        else:  # torch 2.11's wrapper wants equal head counts: each kv head serves hq/hkv query heads
            k = k.repeat_interleave(hq // hkv, dim=1)  # [T, Hq, D]
            v = v.repeat_interleave(hq // hkv, dim=1)  # [T, Hq, D]
    return kernel(q, k, v, cu, cu, longest, longest, scale=scale, **extra)  # type: ignore[no-any-return]


def no_mask(*args: Any, **kwargs: Any) -> None:
    """Segments come as ``cu_seqlens``: no mask is built (transformers' mask-interface contract)."""
    return None


def install(model: Any) -> None:
    """Register the implementation with transformers (idempotent) and switch ``model`` to it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, _attention)
    AttentionMaskInterface.register(NAME, no_mask)
    model.set_attn_implementation(NAME)
