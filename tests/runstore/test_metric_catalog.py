"""The declared metrics: what a declaration is, the write check, the read accessors, and that the names the
trainer's losses produce are declared."""

from __future__ import annotations

import json

import pytest
import torch

from lego_rl.runstore import StepMetrics
from lego_rl.runstore import metric_catalog as mc
from lego_rl.train.backend import LossInputs
from lego_rl.train.consistency import KINDS, ConsistencyReport, ConsistencyStats
from lego_rl.train.losses import LossConfig, SftLoss, make_loss


def test_every_declaration_says_what_it_is() -> None:
    groups = {"train", "rollout", "staleness", "timing", "consistency", "tokenisation", "eval"}
    for m in mc.METRICS:
        assert m.meaning and m.group in groups, m
        assert m.written_by, f"{m} is written by no run kind"
        assert isinstance(m.kind, mc.MetricKind) and m.unit, f"{m} has no unit"
        assert m.hidden is None or m.hidden.strip(), f"{m}: a hidden metric says why"
        assert (m.kind is mc.DISTRIBUTION) <= m.is_family, f"{m}: a distribution is a family"


def test_no_name_is_covered_by_two_declarations() -> None:
    names = [m.key(m.choices[0] if m.choices else 0) if m.is_family else str(m) for m in mc.METRICS]
    for name in names:
        assert sum(m.covers(name) for m in mc.METRICS) == 1, name
    with pytest.raises(ValueError, match="declared twice"):
        mc._declare("loss", "", mc.GAUGE, "train", "again")


def test_declared_values_accepts_declared_names_and_refuses_the_rest() -> None:
    values = {mc.POLICY_LAG_MEAN: 1.0, "consistency/full/k3_kl": 0.01, mc.TOKENS_AGE.key(2): 5.0}
    out = mc.declared_values(mc.TRAIN, values)
    assert out == {"policy_lag_mean": 1.0, "consistency/full/k3_kl": 0.01, "tokens_age/2": 5.0}
    assert json.loads(json.dumps(out)) == out
    with pytest.raises(mc.UndeclaredMetric, match="'staleness_mean' written by a train run is not declared") as e:
        mc.declared_values(mc.TRAIN, {"staleness_mean": 1.0})
    assert e.value.name == "staleness_mean" and e.value.run_kind is mc.TRAIN
    with pytest.raises(mc.UndeclaredMetric, match="declared for train only"):
        mc.declared_values(mc.SFT, {mc.POLICY_LAG_MEAN: 0.0})
    for bad in ("consistency/sideways/k3_kl", "tokens_age/x", "tokens_age/01", "tokens_age/"):
        with pytest.raises(mc.UndeclaredMetric):
            mc.declared_values(mc.TRAIN, {bad: 1.0})


def test_families_name_and_recognise_their_members() -> None:
    assert mc.TOKENS_AGE.key(0) == "tokens_age/0" and mc.TOKENS_AGE.member("tokens_age/17") == "17"
    assert mc.CONSISTENCY_BY_SPLIT["k3_kl"].key("bridged") == "consistency/bridged/k3_kl"
    with pytest.raises(ValueError, match="not a member"):
        mc.CONSISTENCY_BY_SPLIT["k3_kl"].key("sideways")
    with pytest.raises(TypeError, match="not a family"):
        mc.LOSS.key(1)


def test_reads_go_through_declarations_never_a_string() -> None:
    row = StepMetrics(step=0, started_at=0.0, finished_at=1.0, values=mc.declared_values(mc.TRAIN, {
        mc.POLICY_LAG_MEAN: 1.0, "tokens_age/0": 3.0, "tokens_age/1": 4.0, mc.LOSS: 0.5}))
    assert mc.read(row.values, mc.POLICY_LAG_MEAN) == 1.0 and mc.read(row.values, mc.KL) is None
    assert mc.read_family(row.values, mc.TOKENS_AGE) == {"0": 3.0, "1": 4.0}
    with pytest.raises(TypeError, match="through its declaration"):
        mc.read(row.values, "policy_lag_mean")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="is a family"):
        mc.read(row.values, mc.TOKENS_AGE)
    with pytest.raises(TypeError, match="one metric"):
        mc.read_family(row.values, mc.LOSS)


def test_consistency_declarations_cover_what_the_report_writes() -> None:
    assert mc.CONSISTENCY_SPLITS == KINDS
    stats = ConsistencyStats(tokens=3, pearson=0.9, mean_abs_diff=0.1, p99_abs_diff=0.2, max_abs_diff=0.3, k3_kl=0.01)
    report = ConsistencyReport(overall=stats, by_kind={k: stats for k in KINDS})
    written = report.as_values()
    assert set(mc.declared_values(mc.TRAIN, written)) == set(written)
    assert set(mc.CONSISTENCY) == set(ConsistencyStats.model_fields)


def _inputs(n: int = 6, *, ref: bool = False) -> LossInputs:
    g = torch.Generator().manual_seed(0)
    slots = torch.tensor([0, 0, 0, 1, 1, 1])  # [T]
    mask = torch.ones(n)  # [T]
    old = -torch.rand(n, generator=g)  # [T]
    counts = torch.full((2,), 3.0)  # [R]
    return LossInputs(
        logprobs=(old + 0.3 * torch.randn(n, generator=g)).requires_grad_(), old_logprobs=old,
        rollout_logprobs=old + 0.2 * torch.randn(n, generator=g), advantages=torch.tensor([1.0] * 3 + [-1.0] * 3),
        loss_mask=mask, token_weights=mask / 6, rollout_slots=slots, rollout_token_counts=counts,
        rollout_log_ratio_elsewhere=torch.zeros(2), rollout_is_log_ratio_elsewhere=torch.zeros(2),
        ref_logprobs=old - 0.1 if ref else None, entropy=torch.rand(n, generator=g),
    )


@pytest.mark.parametrize("cfg", [
    LossConfig(), LossConfig(kl_coef=0.1), LossConfig(dual_clip_c=3.0), LossConfig(is_correction="tis"),
    LossConfig(is_correction="mis"), LossConfig(algorithm="gspo"),
], ids=["grpo", "kl", "dual-clip", "tis", "mis", "gspo"])
def test_every_name_a_policy_loss_reports_is_declared_for_train(cfg: LossConfig) -> None:
    out = make_loss(cfg)(_inputs(ref=cfg.kl_coef > 0))
    # the backend adds these to the loss's own figures
    mc.declared_values(mc.TRAIN, {**out.metrics, mc.LOSS: 0.0, mc.GRAD_NORM: 0.0, mc.LR: 0.0, mc.TOKENS: 0.0})


def test_every_name_the_sft_loss_reports_is_declared_for_sft() -> None:
    out = SftLoss()(_inputs())
    mc.declared_values(mc.SFT, {**out.metrics, mc.LOSS: 0.0, mc.GRAD_NORM: 0.0, mc.LR: 0.0, mc.TOKENS: 0.0})


def test_sinks_file_each_value_under_its_group_and_a_distribution_under_one_tag() -> None:
    assert mc.tag(mc.LOSS) == "train/loss" and mc.tag(mc.TIME_STEP_S) == "timing/time_step_s"
    assert mc.tag(mc.CONSISTENCY["k3_kl"]) == "consistency/k3_kl"
    family = mc.CONSISTENCY_BY_SPLIT["k3_kl"]
    assert mc.tag(family, family.key("full")) == "consistency/full/k3_kl"
    assert mc.tag(mc.TOKENS_AGE, "tokens_age/3") == mc.tag(mc.TOKENS_AGE) == "staleness/tokens_age"
    single = [mc.tag(m) for m in mc.METRICS if not m.is_family]
    assert len(single) == len(set(single))
