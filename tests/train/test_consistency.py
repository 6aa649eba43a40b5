"""Rollout-vs-trainer consistency figures: hand-computed cases, the per-kind split, and turn spans on Samples."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from lego_rl.runstore.metrics import StepMetrics
from lego_rl.train.batching import plan_steps
from lego_rl.train.consistency import (
    TokenKinds,
    consistency_report,
    consistency_stats,
    micro_batch_kinds,
    sample_kinds,
)
from lego_rl.trajectory.manager import build_samples
from lego_rl.trajectory.records import TurnRecord
from lego_rl.trajectory.sample import PARQUET_SCHEMA, Sample, TurnSpan, load_samples, save_samples


def test_hand_computed_figures() -> None:
    rollout = torch.tensor([-1.0, -2.0, -3.0])
    trainer = torch.tensor([-1.1, -2.0, -3.2])
    s = consistency_stats(rollout, trainer)
    # Δ = [-0.1, 0, -0.2]; centred a = [1, 0, -1], b = [1.0, 0.1, -1.1]: r = 2.1 / sqrt(2 * 2.22).
    assert s.tokens == 3
    # The statistics run in fp64; the only error is the fp32 rounding of the inputs (<= eps/2 * 3.2 = 1.9e-7
    # each, 4.8e-8 for -3.2): 1e-6 bounds it in the differences and r, and k3 ~ d^2/2 moves by d * 4e-7 < 1e-7.
    assert s.pearson == pytest.approx(2.1 / math.sqrt(2 * 2.22), abs=1e-6)
    assert s.mean_abs_diff == pytest.approx(0.1, abs=1e-6)
    assert s.max_abs_diff == pytest.approx(0.2, abs=1e-6)
    # sorted |Δ| = [0, 0.1, 0.2]; p99 sits at index 0.99 * 2 = 1.98: 0.1 + 0.98 * 0.1.
    assert s.p99_abs_diff == pytest.approx(0.198, abs=1e-6)
    k3 = ((math.exp(-0.1) - 1 + 0.1) + 0 + (math.exp(-0.2) - 1 + 0.2)) / 3
    assert s.k3_kl == pytest.approx(k3, abs=1e-7)


def test_identical_sides_and_percentile_on_a_ramp() -> None:
    a = -torch.arange(1, 102, dtype=torch.float32) / 10  # [101]
    same = consistency_stats(a, a.clone())
    assert same.pearson == pytest.approx(1.0) and same.max_abs_diff == 0 and same.k3_kl == 0
    ramp = consistency_stats(torch.zeros(101), -torch.arange(101, dtype=torch.float64) / 100)
    assert ramp.p99_abs_diff == pytest.approx(0.99) and ramp.max_abs_diff == pytest.approx(1.0)
    assert ramp.pearson is None  # one side is constant: no correlation to report


def test_mask_excludes_context_and_bad_input_is_named() -> None:
    rollout = torch.tensor([0.0, -1.0, -2.0, 0.0])
    trainer = torch.tensor([-9.0, -1.0, -2.5, -9.0])  # context positions hold anything
    r = consistency_report(rollout, trainer, torch.tensor([0.0, 1.0, 1.0, 0.0]))
    assert r.overall.tokens == 2 and r.overall.max_abs_diff == pytest.approx(0.5)
    assert consistency_stats(torch.zeros(0), torch.zeros(0)).tokens == 0
    with pytest.raises(ValueError, match="one length"):
        consistency_stats(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match="trainer logprobs hold a non-finite value"):
        consistency_stats(torch.zeros(2), torch.tensor([0.0, -math.inf]))


def _sample(rid: str, segment: int, spans: list[tuple[int, int, str]], n: int, rng: torch.Generator) -> Sample:
    mask = [0] * n
    for start, end, _ in spans:
        mask[start:end] = [1] * (end - start)
    logp = (-torch.rand(n, generator=rng) * 3).tolist()
    return Sample(rollout_id=rid, group_index=0, index=0, segment=segment, num_segments=2,
                  tokens=list(range(n)), loss_mask=mask, rollout_logprobs=[lp * m for lp, m in zip(logp, mask)],
                  turn_spans=[TurnSpan(turn=k, start=a, end=b, render_mode=mode)  # type: ignore[arg-type]
                              for k, (a, b, mode) in enumerate(spans)])


def test_template_drift_in_one_kind_is_told_apart_from_noise() -> None:
    """Fully re-rendered turns drift (a template difference shifts their logprobs); bridged turns carry
    only fp32-size noise. Overall the drift is diluted; the split names the kind that drifted."""
    rng = torch.Generator().manual_seed(0)
    samples = [
        _sample("r0", 0, [(5, 45, "full"), (60, 140, "bridged")], 150, rng),
        _sample("r0", 1, [(30, 70, "full"), (80, 200, "bridged")], 210, rng),
        _sample("r1", 0, [(4, 100, "bridged")], 100, rng),
    ]
    step = plan_steps(samples, [0.0] * 3, max_tokens_per_micro_batch=256)[0]
    rollout, trainer, masks, kinds_list = [], [], [], []
    for mb in step.micro_batches:
        kinds = micro_batch_kinds(mb, samples)
        noise = torch.randn(mb.num_tokens, generator=rng) * 2e-6  # [T]
        drift = torch.where(kinds.full, torch.full_like(noise, -0.3), torch.zeros_like(noise))  # [T]
        rollout.append(mb.rollout_logprobs)
        trainer.append(mb.rollout_logprobs + noise + drift)
        masks.append(mb.loss_mask)
        kinds_list.append(kinds)
    kinds = TokenKinds(*(torch.cat([getattr(k, f) for k in kinds_list]) for f in ("bridged", "full", "later_segment")))
    report = consistency_report(torch.cat(rollout), torch.cat(trainer), torch.cat(masks), kinds)
    b, f = report.by_kind["bridged"], report.by_kind["full"]
    assert b.tokens == 80 + 120 + 96 and f.tokens == 40 + 40
    # Thresholds on the seeded synthetic noise (sigma 2e-6, the same on every machine), not on rounding: its
    # max over 296 tokens is ~3.5 sigma, its mean far below 1e-4.
    assert b.max_abs_diff < 1e-5 and b.k3_kl < 1e-10
    assert f.mean_abs_diff == pytest.approx(0.3, abs=1e-4) and f.k3_kl > 0.03
    assert report.overall.tokens == b.tokens + f.tokens
    assert 1e-5 < report.overall.mean_abs_diff < f.mean_abs_diff  # diluted: overall alone cannot say which
    # Both segments hold drifted turns here, so the segment split shows drift on both sides.
    assert report.by_kind["first_segment"].tokens + report.by_kind["later_segments"].tokens == report.overall.tokens
    row = StepMetrics(step=0, started_at=0.0, finished_at=1.0, values=report.as_values())
    assert row.values["consistency/full/mean_abs_diff"] == pytest.approx(0.3, abs=1e-4)
    assert "consistency/bridged/pearson" in row.values and "consistency/tokens" in row.values


def test_micro_batch_kinds_refuses_foreign_samples() -> None:
    rng = torch.Generator().manual_seed(1)
    samples = [_sample("r0", 0, [(2, 8, "full")], 10, rng)]
    mb = plan_steps(samples, [0.0], max_tokens_per_micro_batch=64)[0].micro_batches[0]
    other = [_sample("r0", 0, [(2, 8, "full")], 12, rng)]
    with pytest.raises(ValueError, match="not the samples it was packed from"):
        micro_batch_kinds(mb, other)


def _rec(turn: int, prompt: list[int], out: list[int], mode: str, bridge: int = 0) -> TurnRecord:
    return TurnRecord(session_id="s", turn=turn, protocol="chat", prompt_ids=prompt, output_ids=out,
                      logprobs=[-0.5] * len(out), render_mode=mode, bridge_prefix_len=bridge,  # type: ignore[arg-type]
                      finish_reason="stop")


def test_trajectory_records_turn_spans_with_render_modes() -> None:
    t0 = _rec(0, [1, 2, 3], [10, 11], "full")
    t1 = _rec(1, [1, 2, 3, 10, 11, 4], [12, 13, 14], "bridged", bridge=5)
    t2 = _rec(2, [1, 9, 9], [15], "full")  # re-rendered history that drifted: a new segment
    samples, _ = build_samples([t0, t1, t2], rollout_id="r", group_index=0, index=0, reward=1.0)
    first, later = samples
    assert [(s.turn, s.start, s.end, s.render_mode) for s in first.turn_spans] == [(0, 3, 5, "full"),
                                                                                  (1, 6, 9, "bridged")]
    assert [(s.turn, s.start, s.end, s.render_mode) for s in later.turn_spans] == [(2, 3, 4, "full")]
    k = sample_kinds(first)
    assert k.bridged.tolist() == [False] * 6 + [True] * 3 and k.full.tolist() == [False] * 3 + [True] * 2 + [False] * 4
    assert sample_kinds(later).later_segment.all()


def test_turn_spans_round_trip_and_old_files_still_load(tmp_path: Path) -> None:
    s = Sample(rollout_id="r", group_index=0, index=0, tokens=[1, 2, 3], loss_mask=[0, 1, 1],
               rollout_logprobs=[0.0, -1.0, -2.0], turn_spans=[TurnSpan(turn=0, start=1, end=3, render_mode="bridged")])
    for suffix in ("jsonl", "parquet"):
        assert load_samples(save_samples([s], tmp_path / f"new.{suffix}")) == [s]
    old = s.model_dump(mode="json")
    del old["turn_spans"]  # a sample saved before the field existed
    (tmp_path / "old.jsonl").write_text(json.dumps(old) + "\n")
    assert load_samples(tmp_path / "old.jsonl")[0].turn_spans == []
    old_schema = pa.schema([f for f in PARQUET_SCHEMA if f.name != "turn_spans"])
    old["metadata"] = "{}"
    pq.write_table(pa.Table.from_pylist([old], schema=old_schema), tmp_path / "old.parquet")
    assert load_samples(tmp_path / "old.parquet")[0].turn_spans == []
    with pytest.raises(ValueError, match="runs past the 3 tokens"):
        Sample(rollout_id="r", group_index=0, index=0, tokens=[1, 2, 3], loss_mask=[0, 1, 1],
               rollout_logprobs=[0.0, -1.0, -2.0], turn_spans=[TurnSpan(turn=0, start=1, end=4, render_mode="full")])
