"""The CUDA kernels of ``batch_invariant`` (Triton). Every launch parameter that shapes a reduction is a
constant here, never chosen from the problem's size: no autotuning, no split-K, one tile shape per kernel, so
one row's arithmetic is the same whatever else was launched with it (``batch_invariant``'s docstring)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton  # type: ignore[import-not-found,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,unused-ignore]

MM_BLOCK_M, MM_BLOCK_N, MM_BLOCK_K = 128, 128, 64
"""The matmul's one tile shape (the K-tile fixes each element's accumulation order)."""
MM_WARPS, MM_STAGES = 8, 3
ATTN_BLOCK_M, ATTN_BLOCK_N, ATTN_WARPS, ATTN_STAGES = 64, 64, 4, 2
"""Query rows per attention program (a decode row runs in the same tile, the others masked) and keys per block of
a query's reduction."""
SOFTMAX_BLOCK = 4096
"""Vocabulary entries per step of the row-wise log-softmax."""
_LOG2E = 1.4426950408889634


@triton.jit
def _matmul_kernel(x_ptr, w_ptr, y_ptr, M, N, K, sxm, sxk, swn, swk, sym, syn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        x = tl.load(x_ptr + rm[:, None] * sxm + kk[None, :] * sxk, mask=(rm[:, None] < M) & (kk[None, :] < K),
                    other=0.0)
        w = tl.load(w_ptr + rn[None, :] * swn + kk[:, None] * swk, mask=(rn[None, :] < N) & (kk[:, None] < K),
                    other=0.0)
        if IEEE:
            acc = tl.dot(x, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(x, w, acc)
    tl.store(y_ptr + rm[:, None] * sym + rn[None, :] * syn, acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x`` [M, K] @ ``w`` [N, K].T → [M, N] in ``x``'s dtype, fp32 accumulation in one fixed K order."""
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    grid = (triton.cdiv(m, MM_BLOCK_M), triton.cdiv(n, MM_BLOCK_N))
    _matmul_kernel[grid](x, w, y, m, n, k, x.stride(0), x.stride(1), w.stride(0), w.stride(1), y.stride(0),
                         y.stride(1), BLOCK_M=MM_BLOCK_M, BLOCK_N=MM_BLOCK_N, BLOCK_K=MM_BLOCK_K,
                         IEEE=x.dtype == torch.float32, num_warps=MM_WARPS, num_stages=MM_STAGES)
    return y


@triton.jit
def _rms_kernel(x_ptr, y_ptr, D, sx, sy, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * sx + cols, mask=cols < D, other=0.0).to(tl.float32)
    mean = tl.sum(x * x, axis=0) / D
    tl.store(y_ptr + row * sy + cols, x * (1.0 / tl.sqrt(mean + eps)), mask=cols < D)


def rms_normalise(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``x`` [R, D] fp32 → ``x / sqrt(mean(x²) + eps)`` per row, one program per row."""
    x = x.contiguous()
    r, d = x.shape
    y = torch.empty_like(x)
    if r:
        _rms_kernel[(r,)](x, y, d, x.stride(0), y.stride(0), eps, BLOCK=triton.next_power_of_2(d), num_warps=4)
    return y


@triton.jit
def _log_softmax_kernel(x_ptr, t_ptr, y_ptr, V, sx, sy, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    t = tl.load(t_ptr + row)
    cols = tl.arange(0, BLOCK)
    m = tl.full((BLOCK,), float("-inf"), tl.float32)
    s = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, V, BLOCK):
        x = tl.load(x_ptr + row * sx + start + cols, mask=start + cols < V, other=float("-inf")) / t
        m_new = tl.maximum(m, x)
        # Lanes that have seen only -inf keep s = 0 (no -inf - -inf).
        s = tl.where(m_new == float("-inf"), 0.0, s * tl.exp(m - m_new) + tl.exp(x - m_new))
        m = m_new
    top = tl.max(m, axis=0)
    total = tl.sum(tl.where(m == float("-inf"), 0.0, s * tl.exp(m - top)), axis=0)
    lse = top + tl.log(total)
    for start in range(0, V, BLOCK):
        x = tl.load(x_ptr + row * sx + start + cols, mask=start + cols < V, other=0.0) / t
        tl.store(y_ptr + row * sy + start + cols, x - lse, mask=start + cols < V)


def log_softmax(x: torch.Tensor, temps: torch.Tensor) -> torch.Tensor:
    """``log_softmax(x / temps[:, None])`` of ``x`` [N, V] fp32, one program per row."""
    x = x.contiguous()
    n, v = x.shape
    y = torch.empty_like(x)
    if n:
        _log_softmax_kernel[(n,)](x, temps.contiguous(), y, v, x.stride(0), y.stride(0), BLOCK=SOFTMAX_BLOCK,
                                  num_warps=8)
    return y


@triton.jit
def _attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, meta_ptr, kbase_ptr, sqt, sqh, skp, skh, svp, svh, sot, soh,
                      scale_log2, GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr):
    mb = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    q_start = tl.load(meta_ptr + s * 3)
    q_len = tl.load(meta_ptr + s * 3 + 1)
    pos0 = tl.load(meta_ptr + s * 3 + 2)
    if mb * BLOCK_M >= q_len:
        return
    kbase = tl.load(kbase_ptr + s)
    rows = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    live = rows < q_len
    qpos = pos0 + rows
    d = tl.arange(0, D)
    q = tl.load(q_ptr + (q_start + rows)[:, None].to(tl.int64) * sqt + h * sqh + d[None, :], mask=live[:, None],
                other=0.0)
    kvh = h // GROUP
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    n_keys = pos0 + tl.minimum(q_len, (mb + 1) * BLOCK_M)  # the block's last query sees keys 0..n_keys-1
    for start in range(0, n_keys, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        present = cols < n_keys
        k = tl.load(k_ptr + kbase + cols[None, :].to(tl.int64) * skp + kvh * skh + d[:, None],
                    mask=present[None, :], other=0.0)  # [D, BLOCK_N]
        scores = tl.dot(q, k) * scale_log2  # [BLOCK_M, BLOCK_N]
        scores = tl.where(cols[None, :] <= qpos[:, None], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        # A block wholly past a query's position leaves its row as it was: alpha 1, p 0.
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + kbase + cols[:, None].to(tl.int64) * svp + kvh * svh + d[None, :],
                    mask=present[:, None], other=0.0)  # [BLOCK_N, D]
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + (q_start + rows)[:, None].to(tl.int64) * sot + h * soh + d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=live[:, None])


_last: list[tuple[tuple[object, ...], tuple[torch.Tensor, torch.Tensor]]] = []


def _metadata(seqs: tuple[tuple[int, int, int, int], ...], base: tuple[int, ...], device: torch.device
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's per-sequence table on the device, kept for the next call: every layer of a forward attends
    over the same sequences, so one copy serves them all."""
    key = (seqs, base, device)
    last = _last[0] if _last else None  # one read: the engine's thread and the trainer's may both call
    if last is not None and last[0] == key:
        return last[1]
    meta = torch.tensor([[start, count, pos0] for _, start, count, pos0 in seqs], dtype=torch.int32)
    tables = (meta.to(device), torch.tensor(base, dtype=torch.int64).to(device))  # [S, 3], [S]
    _last[:] = [(key, tables)]
    return tables


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: Sequence[tuple[int, int, int, int]],
              scale: float, *, cached: bool) -> torch.Tensor:
    """``batch_invariant.attention_cached`` (``cached``: ``k``/``v`` [S, Hkv, L, D], ``seqs`` name slots) and
    ``attention_packed`` (``k``/``v`` [T, Hkv, D], ``seqs`` name the first token) in one kernel."""
    n, hq, d = q.shape
    hkv = k.shape[-3] if cached else k.shape[1]
    out = torch.zeros_like(q)
    if not seqs:
        return out
    if cached:
        if k.stride() != v.stride():
            raise ValueError("the K and V caches need one layout")
        kp, kh, base = k.stride(2), k.stride(1), [slot * k.stride(0) for slot, _, _, _ in seqs]
    else:
        k, v = k.contiguous(), v.contiguous()
        kp, kh, base = k.stride(0), k.stride(1), [first * k.stride(0) for first, _, _, _ in seqs]
    q = q.contiguous()
    meta, kbase = _metadata(tuple(seqs), tuple(base), q.device)  # [S, 3], [S]
    longest = max(count for _, _, count, _ in seqs)
    grid = (triton.cdiv(longest, ATTN_BLOCK_M), hq, len(seqs))
    _attention_kernel[grid](q, k, v, out, meta, kbase, q.stride(0), q.stride(1), kp, kh, kp, kh, out.stride(0),
                            out.stride(1), scale * _LOG2E, GROUP=hq // hkv, D=d, BLOCK_M=ATTN_BLOCK_M,
                            BLOCK_N=ATTN_BLOCK_N, num_warps=ATTN_WARPS, num_stages=ATTN_STAGES)
    return out
