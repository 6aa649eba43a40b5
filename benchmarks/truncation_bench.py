"""Top-p/top-k truncation (``sampler.truncation_mask``): sorting only the top 1,024 candidates against sorting the
whole vocabulary, on rows of the real 151,936-id vocabulary, in one process (same-run ratios).

Two kinds of rows: peaked (softmax of 6·N(0, 1) logits: nuclei of 1 to ~300 ids at top_p 0.95, like a trained
model's) and flat (softmax of 0.1·N(0, 1): the nucleus is ~95 % of the ids, like a random-init model's; the
candidates' bound check sends such rows straight to the full sort, so there the new path costs one row max
more). Batch 64 is the engine's decode step; 256 rows is one block of the trainer's logprob recomputation
(``logprobs.CHUNK_ROWS``).

    python benchmarks/truncation_bench.py [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from lego_rl.serving.sampler import truncation_mask

VOCAB = 151_936


def timed(fn: object, device: str, repeat: int) -> float:
    """Median seconds of ``repeat`` calls (after one warm-up)."""
    assert callable(fn)
    fn()
    times = []
    for _ in range(repeat):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    for rows in (64, 256):
        for kind, scale in (("peaked", 6.0), ("flat", 0.1)):
            probs = torch.softmax(torch.randn(rows, VOCAB, generator=gen) * scale, dim=-1).to(a.device)  # [B, V]
            full = timed(lambda: truncation_mask(probs, 0, 0.95, candidates=VOCAB), a.device, a.repeat)
            cand = timed(lambda: truncation_mask(probs, 0, 0.95), a.device, a.repeat)
            print(json.dumps({"device": a.device, "rows": rows, "kind": kind, "full_sort_ms": round(1000 * full, 2),
                              "candidates_ms": round(1000 * cand, 2), "speedup": round(full / cand, 2)}), flush=True)


if __name__ == "__main__":
    main()
