"""``train.audit``'s parameter fingerprint: float64 [sum, sum of squares] per tensor, taken a chunk at a time so a
large tensor is never copied whole to float64 (benchmarks/audit_cost_bench.py measures the memory)."""

from __future__ import annotations

import pytest
import torch

from lego_rl.train import audit
from lego_rl.train.audit import fingerprint
from support.numerics import rounding_tolerance


@pytest.mark.parametrize("chunk", [7, 1 << 22], ids=["many-chunks", "one-chunk"])
def test_fingerprint_is_the_float64_sums_and_sees_a_one_ulp_change(chunk: int, monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:
    monkeypatch.setattr(audit, "FINGERPRINT_CHUNK", chunk)
    gen = torch.Generator().manual_seed(0)
    params = {"w": torch.randn(33, 5, generator=gen), "b": torch.randn(1, generator=gen)}
    got = fingerprint(iter(params.items()))
    for name, p in params.items():
        x = p.double().reshape(-1)
        # fp64 sums of the same values in another order (chunks, vector width): rounding of numel terms at
        # most sum |x| (or sum x^2) in size; ~1e-11 here, far below the 1e-7 a one-ulp fp32 change makes.
        tol = rounding_tolerance(torch.float64, magnitude=float(x.abs().sum() + (x * x).sum()), terms=x.numel())
        assert got[name] == pytest.approx([float(x.sum()), float((x * x).sum())], rel=0, abs=tol)
    # The smallest change an fp32 update can make to one element moves the fingerprint.
    bumped = params["w"].clone()
    bumped.view(-1)[100] = torch.nextafter(bumped.view(-1)[100], torch.tensor(float("inf")))
    assert fingerprint(iter([("w", bumped)]))["w"] != got["w"]
    assert fingerprint(iter([("w", params["w"].clone())]))["w"] == got["w"]  # and only a change does
