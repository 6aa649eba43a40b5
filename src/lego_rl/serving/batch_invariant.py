"""Batch-invariant ops: a row's result never depends on which other rows were computed with it.

``train.true_on_policy`` asks the embedded engine and the torch trainer for bit-identical logprobs of every
sampled token. The engine computes a token in a decode step of a few rows, or inside a padded prefill; the
trainer computes the same token inside a packed micro-batch of thousands. Ordinary kernels choose their tiling,
split-K and reduction trees by shape (cuBLAS, SDPA's dispatcher, torch's reductions, CPU BLAS), so the same
row rounds differently in each. The ops here fix the reduction order of every row instead, and both sides
call them (the engine's ``StaticDecoder`` in invariant mode; the trainer through ``train.true_on_policy``):

* ``linear``: ``x @ w.T (+ b)``. Each output element is one dot product over ``K`` in one fixed order: on
  CUDA a Triton kernel with fixed tiles and no split-K (an element's value does not depend on ``M``, on ``N``
  or on where the element sits in its tile, so q/k/v fused into one matrix give what three matrices give); on
  CPU an elementwise product summed over ``K`` (one contiguous reduction per element, the same code for any
  row count). Its gradients are ordinary matmuls on both devices.
* ``rms_norm``: HF's RMSNorm (normalise in fp32, back to the input dtype, times the weight), the row's mean of
  squares in one fixed order (one Triton program per row; on CPU torch's contiguous row reduction).
* ``attention_packed`` / ``attention_cached``: causal attention in which query position ``p`` always reduces
  over key blocks ``[0, B), [B, 2B), ...`` up to its own, in that order, with online softmax (CUDA: one Triton
  kernel, fixed query and key tiles; CPU: each query block against its keys padded to whole blocks). A decode
  query, a query inside a prefill and a query inside a packed training row therefore see the same arithmetic:
  key blocks past a query's position only add exact zeros.
* ``log_softmax``: ``log_softmax(logits / T)`` per row (CUDA: one Triton program per row, the vocabulary in
  fixed chunks; CPU: torch's per-row kernel), with the temperature divided inside, so the sampler's per-row
  temperatures and the trainer's one temperature divide alike.

On CUDA the forward is these kernels and the backward (the trainer's gradient) is the ordinary differentiable
computation of the same function (``_ReferenceBackward``; matmul gradients as plain matmuls on both devices):
gradients need no bit-identity, logprobs do. On CPU the other ops are plain differentiable torch code. Both sides must run eagerly (no CUDA graphs are needed for
correctness, but ``torch.compile`` would fuse and reorder): the engine turns both off in this mode.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

KEY_BLOCK = 64
"""Keys per block of the attention reduction (both devices): a query's softmax runs over whole blocks."""
_CPU_ELEMENTS = 1 << 22
"""Largest ``rows × N × K`` product the CPU linear materialises at once (it runs in row chunks)."""


def uses_kernels(t: torch.Tensor) -> bool:
    """Whether ops on ``t`` run the Triton kernels (CUDA) rather than the CPU construction."""
    return t.is_cuda


def _cuda_kernels() -> Any:
    from lego_rl.serving import batch_invariant_triton  # Triton loads only where a CUDA op runs

    return batch_invariant_triton


class _ReferenceBackward(torch.autograd.Function):
    """Forward through ``fast`` (the invariant kernel), backward through ``reference`` (the same function as
    ordinary differentiable torch ops), recomputed from the saved inputs."""

    @staticmethod
    def forward(ctx: Any, fast: Callable[..., torch.Tensor], reference: Callable[..., torch.Tensor],
                *inputs: torch.Tensor) -> torch.Tensor:
        ctx.reference = reference
        ctx.save_for_backward(*inputs)
        return fast(*inputs)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        inputs = [t.detach().requires_grad_(need) for t, need in zip(ctx.saved_tensors, ctx.needs_input_grad[2:],
                                                                      strict=True)]
        wanted = [t for t in inputs if t.requires_grad]
        with torch.enable_grad():
            out = ctx.reference(*inputs)
        grads = iter(torch.autograd.grad(out, wanted, grad) if wanted else ())
        return (None, None, *(next(grads) if t.requires_grad else None for t in inputs))


def _invariant(fast: Callable[..., torch.Tensor], reference: Callable[..., torch.Tensor],
               *inputs: torch.Tensor) -> torch.Tensor:
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
        return _ReferenceBackward.apply(fast, reference, *inputs)  # type: ignore[no-any-return]
    return fast(*inputs)


# -- linear --------------------------------------------------------------------------------------------


def _product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x`` [M, K] @ ``w`` [N, K].T, each element one reduction over K in one order (module docstring)."""
    if uses_kernels(x):
        return _cuda_kernels().matmul(x, w)  # type: ignore[no-any-return]
    rows = max(1, _CPU_ELEMENTS // max(1, w.shape[0] * x.shape[1]))
    parts = [(x[i:i + rows, None, :] * w[None]).sum(-1) for i in range(0, x.shape[0], rows)]  # [r, N] each
    return torch.cat(parts) if parts else x.new_zeros(0, w.shape[0])  # [M, N]


class _Linear(torch.autograd.Function):
    """The invariant product forward; the gradients as ordinary matmuls (no recomputation needed)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return _product(x, w)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        x, w = ctx.saved_tensors
        gx = grad @ w if ctx.needs_input_grad[0] else None  # [M, K]
        gw = grad.t() @ x if ctx.needs_input_grad[1] else None  # [N, K]
        return gx, gw


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` [..., K] @ ``w`` [N, K].T (+ ``b`` [N]) in ``x``'s dtype (fp32 accumulation), invariant per row."""
    if x.dtype != w.dtype:
        raise ValueError(f"batch_invariant.linear needs one dtype, got x {x.dtype} and w {w.dtype}")
    lead, k = x.shape[:-1], x.shape[-1]
    flat = x.reshape(-1, k)  # [M, K]
    out = _Linear.apply(flat, w) if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad) \
        else _product(flat, w)  # [M, N]
    if b is not None:
        out = (out.float() + b.float()).to(x.dtype)  # [M, N] the bias added to the rounded product, per element
    return out.reshape(*lead, w.shape[0])


# -- RMSNorm -------------------------------------------------------------------------------------------


def _rms_reference(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMSNorm, ``w * normalise(x in fp32).to(x.dtype)`` (type promotion as HF), over the last dim."""
    d = x.shape[-1]
    flat = x.float().reshape(-1, d)  # [R, D]
    if uses_kernels(x):
        kernels = _cuda_kernels()
        y = _invariant(lambda t: kernels.rms_normalise(t, eps), lambda t: _rms_reference(t, eps), flat)
    else:
        y = _rms_reference(flat, eps)  # [R, D] one contiguous reduction per row
    return w * y.reshape(x.shape).to(x.dtype)


# -- log-softmax ---------------------------------------------------------------------------------------


def log_softmax(logits: torch.Tensor, temperature: float | torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits / T)`` over the last dim of ``logits`` [N, V] (fp32), ``T`` one value or one per
    row [N]. The division is elementwise by a per-row tensor on both sides (a python scalar divisor may be
    turned into a multiplication by its reciprocal, which rounds differently)."""
    logits = logits.float()
    n = logits.shape[0]
    temps = (temperature.to(device=logits.device, dtype=torch.float32) if isinstance(temperature, torch.Tensor)
             else torch.full((n,), float(temperature), dtype=torch.float32, device=logits.device))  # [N]

    def reference(x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(x / temps.unsqueeze(1), dim=-1)  # [N, V]

    if uses_kernels(logits):
        kernels = _cuda_kernels()
        return _invariant(lambda x: kernels.log_softmax(x, temps), reference, logits)
    return reference(logits)


# -- attention -----------------------------------------------------------------------------------------


def _attend_cpu(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, pos0: int, scale: float) -> torch.Tensor:
    """One sequence's queries ``q`` [n, Hq, D] at positions ``pos0..`` against its keys/values [>= pos0 + n,
    Hkv, D]: each block of query positions ``[mB, (m+1)B)`` against keys padded with zeros to ``(m+1)B``, so a
    query's reductions have a length that depends on its position only."""
    n, hq, d = q.shape
    group = hq // keys.shape[1]
    outs = []
    first = pos0
    while first < pos0 + n:
        end = min((first // KEY_BLOCK + 1) * KEY_BLOCK, pos0 + n)  # this block's queries: first..end-1
        span = (first // KEY_BLOCK + 1) * KEY_BLOCK  # keys 0..span-1, whole blocks
        k = keys[:min(span, end)].repeat_interleave(group, dim=1)  # [<=span, Hq, D]
        v = values[:min(span, end)].repeat_interleave(group, dim=1)  # [<=span, Hq, D]
        if k.shape[0] < span:  # zero keys past the last one (masked below; exact zeros in every product)
            k = torch.cat([k, k.new_zeros(span - k.shape[0], hq, d)])
            v = torch.cat([v, v.new_zeros(span - v.shape[0], hq, d)])
        qb = q[first - pos0:end - pos0]  # [b, Hq, D]
        scores = (qb[:, :, None, :] * k.transpose(0, 1)[None]).sum(-1) * scale  # [b, Hq, span]
        positions = torch.arange(first, end, device=q.device)  # [b]
        seen = torch.arange(span, device=q.device)[None, :] <= positions[:, None]  # [b, span]
        scores = scores.masked_fill(~seen[:, None, :], float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(v.dtype)  # [b, Hq, span]
        outs.append((probs[:, :, None, :] * v.permute(1, 2, 0)[None]).sum(-1))  # [b, Hq, D]
        first = end
    return torch.cat(outs)  # [n, Hq, D]


def _cached_cpu(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seqs: Sequence[tuple[int, int, int, int]],
                scale: float) -> torch.Tensor:
    out = torch.zeros_like(q)
    for slot, start, count, pos0 in seqs:
        out[start:start + count] = _attend_cpu(q[start:start + count], k_cache[slot].transpose(0, 1),
                                               v_cache[slot].transpose(0, 1), pos0, scale)
    return out


def attention_cached(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     seqs: Sequence[tuple[int, int, int, int]], scale: float) -> torch.Tensor:
    """Causal attention of queries ``q`` [N, Hq, D] over KV caches ``k_cache``/``v_cache`` [S, Hkv, L, D]
    (the query's own key already written). ``seqs``: per sequence ``(slot, first query row, query count,
    position of its first query)``; query ``j`` of a sequence at position ``pos0 + j`` attends to its slot's
    positions ``0..pos0 + j``. Returns [N, Hq, D] in ``q``'s dtype; rows of ``q`` no sequence names are 0."""
    if uses_kernels(q):
        return _cuda_kernels().attention(q, k_cache, v_cache, seqs, scale, cached=True)  # type: ignore[no-any-return]
    return _cached_cpu(q, k_cache, v_cache, seqs, scale)


def attention_packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: Sequence[int],
                     scale: float, reference: Callable[..., torch.Tensor] | None = None) -> torch.Tensor:
    """Causal attention within each segment of a packed row: ``q`` [T, Hq, D], ``k``/``v`` [T, Hkv, D],
    segments ``cu_seqlens`` (0 … T). The same reduction per query as ``attention_cached``. ``reference``
    (CUDA, with gradients): the differentiable function of ``(q, k, v)`` whose backward is used."""
    seqs = [(start, start, end - start, 0) for start, end in zip(cu_seqlens[:-1], cu_seqlens[1:], strict=True)
            if end > start]
    if not uses_kernels(q):
        out = q.new_zeros(q.shape)
        for start, _, count, _ in seqs:
            out[start:start + count] = _attend_cpu(q[start:start + count], k[start:start + count],
                                                   v[start:start + count], 0, scale)
        return out
    kernels = _cuda_kernels()

    def fast(qq: torch.Tensor, kk: torch.Tensor, vv: torch.Tensor) -> torch.Tensor:
        return kernels.attention(qq, kk, vv, seqs, scale, cached=False)  # type: ignore[no-any-return]

    if reference is None:
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            raise ValueError("attention_packed with gradients on CUDA needs a reference function for the backward")
        return fast(q, k, v)
    return _invariant(fast, reference, q, k, v)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """HF's gated MLP activation (elementwise: batch-invariant as it is)."""
    return F.silu(gate) * up
