"""One decode step's attention for one layer in two Triton kernels, the new token's KV write included.

The eager decode step spends three kernels a layer here: two ``index_put`` writes of the new key and value
into the slot cache and a masked memory-efficient SDPA call, ~20 µs for one row on an H200 where the data
moved is a few hundred KiB (benchmarks/RESULTS.md: 28 × 13 µs attention + 28 × 7 µs writes of a 1.9 ms step). This
module does the three in two launches (flash-decoding): program ``(row, kv head, split)`` attends the head's ``G``
query heads over its share of positions ``0 .. pos`` with an online softmax in fp32 (the cache positions before
``pos`` read from the cache, the new one taken from registers; split 0 also stores the new key and value), and a
second kernel merges the ``SPLITS`` partial results of each query head.

Numerics: products and sums in fp32 without ``tl.dot`` (no TF32), so an fp32 decoder stays fp32; in bf16 the
inputs are the cache's bf16 values, accumulated in fp32 like the memory-efficient kernel (a different
summation order: kernel noise, as between that kernel and the trainer's flash attention).

Used by ``StaticDecoder`` on CUDA when Triton imports and the head shapes fit (``unsupported_reason``); the SDPA
path stays the fallback and the reference (``tests/serving/test_static_decode_gpu.py`` compares them).
"""

from __future__ import annotations

import functools
from typing import Any

import torch


def unsupported_reason(device: torch.device, n_heads: int, n_kv: int, head_dim: int) -> str | None:
    """Why the kernel cannot serve this decoder (None when it can)."""
    if device.type != "cuda":
        return f"device {device} is not CUDA"
    if _kernel() is None:
        return "triton is not installed"
    group = n_heads // n_kv
    if n_heads % n_kv or group & (group - 1):
        return f"{n_heads} query heads over {n_kv} KV heads is not a power-of-two group"
    if head_dim & (head_dim - 1) or head_dim < 16:
        return f"head_dim {head_dim} is not a power of two >= 16"
    return None


SPLITS = 16
"""Programs per (row, KV head): the positions ``0..pos`` are cut into this many equal ranges attended in parallel
and merged by a second kernel (flash-decoding), so one row's step is not one long sequential loop."""


@functools.cache
def _kernel() -> Any | None:
    """``(partial, combine)`` Triton kernels, or None without Triton."""
    try:
        import triton  # type: ignore[import-not-found,unused-ignore]
        import triton.language as tl  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None

    @triton.jit
    def partial_kernel(q_ptr, kn_ptr, vn_ptr, k_ptr, v_ptr, pos_ptr, acc_ptr, ml_ptr,
                       sq_row, sk_row, sv_row, sc_row, sc_head, scale,
                       G: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, NS: tl.constexpr):
        row = tl.program_id(0)
        h = tl.program_id(1)
        split = tl.program_id(2)
        p = tl.load(pos_ptr + row)
        offs_d = tl.arange(0, D)  # [D]
        offs_g = tl.arange(0, G)  # [G]
        q = tl.load(q_ptr + row * sq_row + (h * G + offs_g)[:, None] * D + offs_d[None, :]).to(tl.float32)  # [G, D]
        kn = tl.load(kn_ptr + row * sk_row + h * D + offs_d)  # [D] compute dtype
        vn = tl.load(vn_ptr + row * sv_row + h * D + offs_d)  # [D]
        base = row * sc_row + h * sc_head
        if split == 0:  # nobody reads position p from the cache in this step: it is taken from kn/vn below
            tl.store(k_ptr + base + p * D + offs_d, kn)
            tl.store(v_ptr + base + p * D + offs_d, vn)
        # This split's range of positions 0..p, in whole blocks.
        per = tl.cdiv(tl.cdiv(p + 1, NS), BLOCK_N) * BLOCK_N
        lo = split * per
        hi = tl.minimum(lo + per, p + 1)
        # Online softmax; a finite floor instead of -inf keeps exp(m_old - m_new) defined on an all-masked block.
        m = tl.full([G], -1.0e30, tl.float32)
        den = tl.zeros([G], tl.float32)
        acc = tl.zeros([G, D], tl.float32)
        for start in range(lo, hi, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)  # [N]
            cached = offs_n < p  # [N]
            now = (offs_n == p)[:, None]  # [N, 1] the new position: its key and value from registers
            kb = tl.load(k_ptr + base + offs_n[:, None] * D + offs_d[None, :], mask=cached[:, None], other=0.0)
            kb = tl.where(now, kn[None, :], kb).to(tl.float32)  # [N, D]
            s = tl.sum(q[:, None, :] * kb[None, :, :], axis=2) * scale  # [G, N]
            s = tl.where((offs_n < hi)[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))  # [G]
            alpha = tl.exp(m - m_new)  # [G]
            e = tl.exp(s - m_new[:, None])  # [G, N]
            vb = tl.load(v_ptr + base + offs_n[:, None] * D + offs_d[None, :], mask=cached[:, None], other=0.0)
            vb = tl.where(now, vn[None, :], vb).to(tl.float32)  # [N, D]
            den = den * alpha + tl.sum(e, axis=1)
            acc = acc * alpha[:, None] + tl.sum(e[:, :, None] * vb[None, :, :], axis=1)  # [G, D]
            m = m_new
        heads = h * G + offs_g  # [G] this program's query heads
        hq = tl.num_programs(1) * G
        # Partials: acc [b, Hq, NS, D], (m, den) [b, Hq, NS, 2]; an empty split leaves (floor, 0) and zeros.
        tl.store(acc_ptr + ((row * hq + heads[:, None]) * NS + split) * D + offs_d[None, :], acc)
        ml = ((row * hq + heads) * NS + split) * 2
        tl.store(ml_ptr + ml, m)
        tl.store(ml_ptr + ml + 1, den)

    @triton.jit
    def combine_kernel(acc_ptr, ml_ptr, out_ptr, so_row, D: tl.constexpr, NS: tl.constexpr):
        row = tl.program_id(0)
        head = tl.program_id(1)
        hq = tl.num_programs(1)
        offs_s = tl.arange(0, NS)  # [NS]
        offs_d = tl.arange(0, D)  # [D]
        ml = ((row * hq + head) * NS + offs_s) * 2
        m = tl.load(ml_ptr + ml)  # [NS]
        den = tl.load(ml_ptr + ml + 1)  # [NS]
        acc = tl.load(acc_ptr + ((row * hq + head) * NS + offs_s)[:, None] * D + offs_d[None, :])  # [NS, D]
        w = tl.exp(m - tl.max(m, axis=0))  # [NS] an empty split weighs 0
        out = tl.sum(w[:, None] * acc, axis=0) / tl.sum(w * den, axis=0)  # [D]
        tl.store(out_ptr + row * so_row + head * D + offs_d, out.to(out_ptr.dtype.element_ty))

    return partial_kernel, combine_kernel


def decode_attention(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, pos: torch.Tensor, scale: float) -> torch.Tensor:
    """Write ``k_new``/``v_new`` ``[b, Hkv, D]`` at ``pos`` ``[b]`` of slots ``0..b-1`` of ``k_cache``/``v_cache``
    ``[S, Hkv, Lmax, D]`` and attend ``q`` ``[b, Hq, D]`` over each row's positions ``0..pos``:
    ``[b, Hq, D]`` in ``q``'s dtype. Row and head strides may be any (views of a fused q/k/v output); the last
    dimension must be contiguous and heads ``D`` apart."""
    kernel = _kernel()
    assert kernel is not None
    b, hq, d = q.shape
    hkv = k_new.shape[1]
    # Row strides may be any; within a row, heads D apart and a contiguous last dim (a copy otherwise).
    q, k_new, v_new = (t if t.stride(2) == 1 and t.stride(1) == d else t.contiguous() for t in (q, k_new, v_new))
    if k_cache.stride(3) != 1 or k_cache.stride(2) != d or k_cache.stride() != v_cache.stride():
        raise ValueError(f"decode_attention needs [S, Hkv, Lmax, D] contiguous caches, got {k_cache.stride()}")
    out = torch.empty(b, hq, d, dtype=q.dtype, device=q.device)  # [b, Hq, D]
    acc = torch.empty(b, hq, SPLITS, d, dtype=torch.float32, device=q.device)  # [b, Hq, NS, D]
    ml = torch.empty(b, hq, SPLITS, 2, dtype=torch.float32, device=q.device)  # [b, Hq, NS, (m, den)]
    group = hq // hkv
    partial, combine = kernel
    partial[(b, hkv, SPLITS)](q, k_new, v_new, k_cache, v_cache, pos, acc, ml, q.stride(0), k_new.stride(0),
                              v_new.stride(0), k_cache.stride(0), k_cache.stride(1), scale, G=group, D=d,
                              BLOCK_N=max(16, 64 // group), NS=SPLITS, num_warps=4)
    combine[(b, hq)](acc, ml, out, out.stride(0), D=d, NS=SPLITS, num_warps=4)
    return out
