"""train.true_on_policy's CUDA code path on a CPU: the Triton kernels under Triton's interpreter.

No GPU needed: ``TRITON_INTERPRET=1`` runs ``serving/batch_invariant_triton.py``'s kernels with numpy. The
interpreter's ``tl.dot`` is numpy's ``matmul``, whose BLAS rounds an element differently by its place in the tile;
the GPU's MMA instructions are assumed not to, so ``tl.dot`` is replaced by a product whose every element adds
its K products in k order (``_dot``). Under that model this checks (1) each kernel against torch and its batch
invariance, and (2) with ``--e2e`` the engine and the trainer end to end on the tiny model through the CUDA path
(every ``batch_invariant.uses_kernels`` true, the backward's varlen flash attention stood in for by SDPA per
segment): ``support.true_on_policy.check_across_sync``'s three rounds, bit for bit. (2) takes ~15 min.

    pip install --target /tmp/triton triton==3.6.0   # CPU-only use; no GPU needed
    TRITON_INTERPRET=1 PYTHONPATH=/tmp/triton:src:tests python benchmarks/true_on_policy_interpreter.py [--e2e]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

import numpy as np
import torch


def _dot(self: Any, a: Any, b: Any, d: Any, input_precision: Any, max_num_imprecise_acc: Any) -> Any:
    from triton.runtime import interpreter

    prod = a.data[:, :, None].astype(np.float32) * b.data[None, :, :].astype(np.float32)  # [M, K, N]
    # numpy reduces a non-contiguous axis slice by slice: every element adds its products in k order.
    return interpreter.TensorHandle((prod.sum(axis=1, dtype=np.float32) + d.data).astype(d.data.dtype),
                                    d.dtype.scalar)


def _patch_interpreter() -> None:
    from triton.runtime import interpreter

    interpreter.InterpreterBuilder.create_dot = _dot
    # numpy 2.x refuses int() of a 1-element array, which Triton 3.6's interpreter does for loop bounds.
    original = interpreter._patch_lang_tensor

    def patch_tensor(tensor: Any, scope: Any) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    interpreter._patch_lang_tensor = patch_tensor


def kernels() -> None:
    from lego_rl.serving import batch_invariant_triton as k

    torch.manual_seed(0)
    x, w = torch.randn(150, 96), torch.randn(200, 96)
    y = k.matmul(x, w)
    print(f"matmul: max |Δ| vs torch {(y - x @ w.t()).abs().max().item():.2g}; one row alone "
          f"{torch.equal(k.matmul(x[7:9], w), y[7:9])}; a column slice {torch.equal(k.matmul(x[:3], w[130:190]), y[:3, 130:190])}")
    h = torch.randn(20, 100)
    r = k.rms_normalise(h, 1e-6)
    ref = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    print(f"rms: max |Δ| {(r - ref).abs().max().item():.2g}; one row alone {torch.equal(k.rms_normalise(h[3:4], 1e-6), r[3:4])}")
    logits, temps = torch.randn(5, 9000) * 3, torch.full((5,), 0.7)
    lp = k.log_softmax(logits, temps)
    print(f"log_softmax: max |Δ| {(lp - torch.log_softmax(logits / 0.7, -1)).abs().max().item():.2g}; one row alone "
          f"{torch.equal(k.log_softmax(logits[2:3], temps[2:3]), lp[2:3])}")
    t, hq, hkv, d = 150, 4, 2, 16
    q, kk, v = torch.randn(t, hq, d), torch.randn(t, hkv, d), torch.randn(t, hkv, d)
    seqs = [(0, 0, 40, 0), (40, 40, 110, 0)]
    out = k.attention(q, kk, v, seqs, d ** -0.5, cached=False)
    ref = torch.cat([torch.nn.functional.scaled_dot_product_attention(
        q[a:a + n].transpose(0, 1), kk[a:a + n].transpose(0, 1).repeat_interleave(2, 0),
        v[a:a + n].transpose(0, 1).repeat_interleave(2, 0), is_causal=True).transpose(0, 1) for a, _, n, _ in seqs])
    ck, cv = torch.zeros(2, hkv, 256, d), torch.zeros(2, hkv, 256, d)
    ck[1, :, :110], cv[1, :, :110] = kk[40:].transpose(0, 1), v[40:].transpose(0, 1)
    ps = [0, 63, 64, 65, 109]
    one = k.attention(q[[40 + p for p in ps]], ck, cv, [(1, i, 1, p) for i, p in enumerate(ps)], d ** -0.5, cached=True)
    tail = k.attention(q[90:], ck, cv, [(1, 0, 60, 50)], d ** -0.5, cached=True)
    print(f"attention: max |Δ| vs SDPA {(out - ref).abs().max().item():.2g}; decode rows == packed rows "
          f"{torch.equal(one, out[[40 + p for p in ps]])}; prefill after a cached prefix == packed rows "
          f"{torch.equal(tail, out[90:])}")


def end_to_end() -> None:
    from lego_rl.serving import batch_invariant
    from lego_rl.serving.engine import EmbeddedEngine
    from lego_rl.serving.tiny_model import ensure_tiny_model
    from lego_rl.train import varlen_attention
    from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings
    from support.true_on_policy import check_across_sync

    batch_invariant.uses_kernels = lambda t: True  # type: ignore[assignment]

    def causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, longest: int,
                    scale: float | None) -> torch.Tensor:
        g = q.shape[1] // k.shape[1]
        return torch.cat([torch.nn.functional.scaled_dot_product_attention(
            q[a:b].transpose(0, 1), k[a:b].transpose(0, 1).repeat_interleave(g, 0),
            v[a:b].transpose(0, 1).repeat_interleave(g, 0), is_causal=True, scale=scale).transpose(0, 1)
            for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)])

    varlen_attention.causal_varlen = causal_sdpa  # type: ignore[assignment]
    torch.set_num_threads(1)

    async def run() -> None:
        tiny = ensure_tiny_model()
        engine = EmbeddedEngine(tiny, max_batch=4, true_on_policy=True)
        backend = TorchBackend(tiny, TorchTrainSettings(lr=1e-3, device="cpu", true_on_policy=True))
        await engine.start()
        t0 = time.perf_counter()
        try:
            checked = await check_across_sync(engine, backend, [[1, 10, 72, 105, 300, 12] * 11, [5, 6, 7],
                                                                list(range(1, 19))], [5, 3, 4], 0.8)
        finally:
            await engine.stop()
        print(f"end to end through the CUDA path: {checked.tokens} sampled-token logprobs bit-identical "
              f"({time.perf_counter() - t0:.0f} s)")

    asyncio.run(run())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--e2e", action="store_true", help="also the engine and trainer end to end (~15 min)")
    a = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("set TRITON_INTERPRET=1 (the kernels run under Triton's interpreter)")
    _patch_interpreter()
    kernels()
    if a.e2e:
        end_to_end()


if __name__ == "__main__":
    main()
