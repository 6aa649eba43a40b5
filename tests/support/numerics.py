"""Floating-point tolerances for the suite, derived from the numbers instead of from one machine.

Two computations of the same real quantity differ when they round differently: another BLAS micro-kernel
(MKL and cuBLAS pick one by CPU/GPU model *and* by matrix shape, so a chunk of 3 rows and the whole
matrix need not agree), another summation order (chunks, threads, tiling, vector width), another fused op.
How far apart they can land follows from three things, which is the rule this module writes down once
(tests/README.md explains it for readers of the tests):

- the dtype's machine epsilon ``eps`` (``torch.finfo``: fp32 1.2e-7, bf16 7.8e-3, fp16 9.8e-4); a value of
  size ``M`` is rounded to within ``eps * M / 2``;
- the magnitude ``M``: a bound on the absolute values a computation rounds (its summands, partial sums and
  results); for a softmax of logits that is the largest ``|logit / T|``, for a sum of probabilities it is 1;
- the length ``n`` of the reduction the two computations may order differently (a matmul's inner
  dimension, a softmax's vocabulary, a gradient's sum over positions), plus a few elementwise ops.

A reduction of ``n`` terms of size at most ``M`` rounds at most ``2n`` times (products and sums), each time
by at most ``eps * M / 2``, so each side lies within ``eps * M * (n + ops)`` of the exact value and the two
within twice that. This is the worst case (first-order, as in Higham's bound for recursive summation), so
it is machine-independent; real differences are usually an order of magnitude or two below it, and a
genuine bug (a wrong row, chunk boundary or convention) is orders of magnitude above it. Errors of
successive stages add: sum the tolerances of the stages (``rounding_tolerance(...) + ...``).

Where a claim is strict on purpose (bit-identical replay, greedy parity), do not loosen it: make the two
sides run the same kernels in the same order (same shapes, ``pinned_cpu_math``) and compare exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

ELEMENTWISE_OPS = 4
"""Default allowance for the elementwise roundings after the reduction (scale, exp/log, subtract)."""


def rounding_tolerance(dtype: torch.dtype, *, magnitude: float, terms: int = 1,
                       ops: int = ELEMENTWISE_OPS) -> float:
    """Absolute tolerance between two computations of the same values that may round differently.

    ``magnitude`` bounds the absolute values rounded along the way (summands, partial sums, results);
    ``terms`` is the length of the reduction whose order or kernel may differ between the two sides;
    ``ops`` the elementwise roundings after it. Returns ``2 * eps * magnitude * (terms + ops)``: each side
    is within half of it of the exact value (see the module docstring).
    """
    if magnitude < 0 or terms < 0 or ops < 0:
        raise ValueError(f"magnitude, terms and ops must be >= 0, got {magnitude}, {terms}, {ops}")
    return 2.0 * torch.finfo(dtype).eps * magnitude * (terms + ops)


def log_softmax_tolerance(dtype: torch.dtype, *, logit_magnitude: float, inner: int, vocab: int,
                          normalisations: int = 1) -> float:
    """Tolerance on logprobs computed as ``log_softmax(x @ W / T)`` (optionally renormalised over a
    truncated set, ``normalisations`` log-sum-exps over at most ``vocab`` entries) by two different kernels.

    Stage 1, the logits: a dot product of ``inner`` terms of size at most ``logit_magnitude``. Stage 2, each
    log-sum-exp: ``vocab`` summands ``exp(z - max) <= 1``, whose relative error becomes an absolute one in
    the log (magnitude 1). A logprob ``z - lse`` carries the logit error twice (its own and through lse).
    """
    logits = 2 * rounding_tolerance(dtype, magnitude=logit_magnitude, terms=inner)
    lse = normalisations * rounding_tolerance(dtype, magnitude=1.0, terms=vocab)
    return logits + lse


def ulp_tolerance(dtype: torch.dtype, *, magnitude: float, ulps: float) -> float:
    """``ulps`` units of the dtype's resolution at ``magnitude`` (``ulps * eps * magnitude``).

    For comparisons with no useful worst case: a whole network forward against another path through it
    (KV-cache decode against a full forward, a packed row against one segment). Its rounding compounds
    over every layer's matmuls, so the worst case is percent-level and would hide bugs; the comparison
    instead allows a stated number of ulps at the magnitude of the compared values, chosen between the
    rounding level (a few ulps) and the bug level (a wrong position, cache row or convention: 1e-3 and up).
    """
    if magnitude < 0 or ulps < 0:
        raise ValueError(f"magnitude and ulps must be >= 0, got {magnitude}, {ulps}")
    return ulps * torch.finfo(dtype).eps * magnitude


FORWARD_ULPS = 48
"""Ulps at the logits' magnitude allowed between two fp32 paths through a whole forward of the tiny model
(4 layers): different kernels there land 2-10 ulps apart (1.05e-5 on logprobs at T = 0.8 on a 2-core AMD
EPYC); 48 ulps stays more than 5x below the 1e-3 a wrong cache row or position produces (T >= 0.8)."""

TINY_LOGIT_BOUND = 24.0
"""A bound on the values the tiny model's head rounds (``serving.tiny_model``, fixed random weights): its
logits stay below 7 in absolute value on random prompts, and sum |h||w| over the head's dot products (what
bounds their partial sums) below 16.5."""


def forward_tolerance(temperature: float = 1.0, *, ulps: float = FORWARD_ULPS) -> float:
    """Tolerance on fp32 logprobs of the tiny model computed by two different paths through its forward
    (engine decode against teacher forcing, fast against generic path): ``ulps`` at ``|logit| / T``."""
    t = temperature if temperature > 0 else 1.0  # greedy reports the untempered logprob
    return ulp_tolerance(torch.float32, magnitude=TINY_LOGIT_BOUND / t, ulps=ulps)


@contextmanager
def pinned_cpu_math(threads: int = 1) -> Iterator[None]:
    """Run the block with ``threads`` intra-op CPU threads (restored after), so a comparison that needs both
    sides to split their reductions the same way does not depend on the machine's core count or on another
    test having changed the setting. A fixture in the test module wraps it (``yield`` inside the ``with``)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
