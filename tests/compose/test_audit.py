"""`lego audit` over a real audited run (`lego train` on the toy environment with train.audit = true: the embedded
engine, the torch trainer, weight sync), and red-team cases: each kind of corruption of the chain that the audit
exists to catch — a logprob the trainer did not get from the engine, a re-scored token, a reward that does not
match its advantage, a rank that skipped its optimizer step, a parameter update without signal, a step served
stale weights — is written into a copy of the run, and the matching check must fail (exit 1) and name it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from lego_rl.cli.main import app
from lego_rl.compose.sessions.audit import audit_run
from support.toy_run import scrub_config_env, write_toy_run

runner = CliRunner()


@pytest.fixture(scope="module")
def audited_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    work = tmp_path_factory.mktemp("audited")
    with pytest.MonkeyPatch.context() as mp:
        scrub_config_env(mp)
        mp.chdir(work)
        # Synchronous (max_staleness 0): step 1 must be served the weights step 0 trained. Zero-variance groups are
        # replaced, so both steps carry signal.
        write_toy_run(work, rollout={"batch_size": 4, "samples_per_prompt": 8, "max_staleness": 0},
                      train={"lr": 1e-3, "audit": True, "oversample_zero_variance": True})
        res = runner.invoke(app, ["train", "-c", "lego.toml", "--json"])
        assert res.exit_code == 0, res.output
    yield work / "runs" / "toy"


def _copy(run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(run, dst)
    for old in (dst / "audit").glob("report*.json"):
        old.unlink()
    return dst


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _failed(run: Path) -> dict[str, str]:
    res = runner.invoke(app, ["audit", str(run), "--json"])
    assert res.exit_code == 1, res.output
    report = json.loads(res.stdout)
    return {c["name"]: c["detail"] for c in report["checks"] if not c["passed"]}


def test_an_audited_run_passes_every_check_and_the_report_is_written(audited_run: Path, tmp_path: Path) -> None:
    run = _copy(audited_run, tmp_path)
    res = runner.invoke(app, ["audit", str(run), "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["passed"] and report["ranks"] == 1 and report["steps_trained"] == 2, report
    assert {c["name"] for c in report["checks"]} == {
        "ranks_recorded", "tokens_match_engine", "advantages_group_normalised", "optimizer_ran_every_rank",
        "parameters_changed_iff_signal", "engines_served_synced_weights"}
    # Step 1 was sampled under the weights step 0 trained, and nothing else.
    versions = next(c["detail"] for c in report["checks"] if c["name"] == "engines_served_synced_weights")
    assert "step 0: [0]" in versions and "step 1: [1]" in versions, versions
    steps = report["figures"]["steps"]
    assert steps["0"]["consistency/pearson"] > 0.999 and steps["0"]["model_tflops_per_gpu"] > 0
    assert report["figures"]["parameters"] > 1_000_000
    # Reports are never replaced: a second audit writes report.1.json beside the first.
    assert runner.invoke(app, ["audit", str(run)]).exit_code == 0
    assert sorted(p.name for p in (run / "audit").glob("report*.json")) == ["report.1.json", "report.json"]


def test_a_logprob_the_engine_never_returned_fails_the_token_check(audited_run: Path, tmp_path: Path) -> None:
    run = _copy(audited_run, tmp_path)
    engine = run / "audit" / "engine-0.jsonl"
    rows = _rows(engine)
    trained = {tuple(r["token_ids"]) for row in _rows(run / "audit" / "rank-0.jsonl") for t in row["tokens"]
               for r in t["runs"]}
    victim = next(r for r in rows if tuple(r["token_ids"]) in trained)
    victim["logprobs"][-1] += 1e-3  # the trainer's copy now differs from what the engine sampled
    _write(engine, rows)
    failed = _failed(run)
    assert set(failed) == {"tokens_match_engine"}, failed
    assert "logprobs differ" in failed["tokens_match_engine"]


def test_a_token_the_engine_never_sampled_fails_the_token_check(audited_run: Path, tmp_path: Path) -> None:
    run = _copy(audited_run, tmp_path)
    rank0 = run / "audit" / "rank-0.jsonl"
    rows = _rows(rank0)
    rows[0]["tokens"][0]["runs"][0]["token_ids"][0] += 1  # as if re-tokenised between rollout and trainer
    _write(rank0, rows)
    failed = _failed(run)
    assert "tokens_match_engine" in failed and "no engine reply has these token ids" in failed["tokens_match_engine"]


def test_an_advantage_that_does_not_match_the_groups_rewards_fails(audited_run: Path, tmp_path: Path) -> None:
    run = _copy(audited_run, tmp_path)
    rank0 = run / "audit" / "rank-0.jsonl"
    rows = _rows(rank0)
    entry = next(t for t in rows[0]["tokens"] if t["advantages"] != [0.0])
    entry["advantages"] = [entry["advantages"][0] * 2]  # e.g. a group normalised over segments, not rollouts
    _write(rank0, rows)
    failed = _failed(run)
    assert set(failed) == {"advantages_group_normalised"}, failed
    assert entry["rollout_id"] in failed["advantages_group_normalised"]


def test_a_reward_changed_after_the_fact_fails_the_advantage_check(audited_run: Path, tmp_path: Path) -> None:
    """The audit recomputes advantages from the events' rewards, not from the trainer's own numbers."""
    run = _copy(audited_run, tmp_path)
    events = run / "events.jsonl"
    rows = _rows(events)
    trained = {t["rollout_id"] for t in _rows(run / "audit" / "rank-0.jsonl")[0]["tokens"]}
    victim = next(e for e in rows if e["kind"] == "rollout_finished" and e["rollout_id"] in trained
                  and e["reward"] == 0.0)
    victim["reward"] = 1.0
    _write(events, rows)
    assert "advantages_group_normalised" in _failed(run)


def test_a_rank_that_skipped_its_optimizer_step_or_moved_without_signal_fails(
        audited_run: Path, tmp_path: Path) -> None:
    run = _copy(audited_run, tmp_path)
    rank0 = run / "audit" / "rank-0.jsonl"
    rows = _rows(rank0)
    rows[0]["optimizer_steps_after"] = rows[0]["optimizer_steps_before"]
    rows[1]["nonzero_advantage"] = False  # parameters changed although no advantage was non-zero
    _write(rank0, rows)
    failed = _failed(run)
    assert "rank 0 call 1" in failed["optimizer_ran_every_rank"]
    assert "rank 0 call 2" in failed["parameters_changed_iff_signal"]


def test_a_missing_rank_record_fails(audited_run: Path, tmp_path: Path) -> None:
    run = _copy(audited_run, tmp_path)
    rank0 = run / "audit" / "rank-0.jsonl"
    _write(rank0, _rows(rank0)[:1])
    assert "rank 0 recorded 1 optimizer steps" in _failed(run)["ranks_recorded"]


def test_a_step_served_with_stale_weights_fails(audited_run: Path, tmp_path: Path) -> None:
    run = _copy(audited_run, tmp_path)
    engine = run / "audit" / "engine-0.jsonl"
    rows = _rows(engine)
    for r in rows:  # every reply labelled with the loaded checkpoint: the sync never reached the engine
        for span in r["weight_versions"]:
            span["version"] = "default"
    _write(engine, rows)
    failed = _failed(run)
    assert "engines_served_synced_weights" in failed
    assert "step 1" in failed["engines_served_synced_weights"]


def test_a_run_without_audit_records_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    res = runner.invoke(app, ["audit", str(tmp_path / "run")])
    assert res.exit_code == 2
    assert "train.audit = true" in " ".join(res.output.split())


def test_a_torn_audit_line_is_named(audited_run: Path, tmp_path: Path) -> None:
    run = _copy(audited_run, tmp_path)
    with (run / "audit" / "engine-0.jsonl").open("a") as f:
        f.write('{"request_id": "cut-he')
    with pytest.raises(Exception, match=r"engine-0.jsonl:\d+ is not JSON"):
        audit_run(run)


def test_one_reply_served_under_old_weights_during_a_later_step_fails(audited_run: Path, tmp_path: Path) -> None:
    """The window check covers every reply of a synchronous step, trained on or not: one reply of step 1 still
    under version 0 (an engine replica the sync missed) is named."""
    run = _copy(audited_run, tmp_path)
    engine = run / "audit" / "engine-0.jsonl"
    rows = _rows(engine)
    rows[-1]["weight_versions"] = [{**span, "version": "0"} for span in rows[-1]["weight_versions"]]
    _write(engine, rows)
    detail = _failed(run)["engines_served_synced_weights"]
    assert "step 1 started on version 1, but the engines served 1 of its replies under [0]" in detail, detail
