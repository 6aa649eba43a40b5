"""`lego train` with ``train.backend = "megatron"``: the toy environment through the embedded engine, the Megatron
backend from ``train_session.BACKENDS``, weight sync into the engine, a checkpoint, and a resume from it (CPU).

The missing-extra path runs without megatron-core; the rest skips when it is not installed.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lego_rl.cli.main import app
from lego_rl.runstore import read_events
from lego_rl.runstore.log import follow_metrics
from support.toy_run import scrub_config_env, write_toy_run

runner = CliRunner()


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    scrub_config_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    # 4 groups of 8: a step where every group has zero variance (nothing to train) is ~3 % likely, not ~40 %.
    yield write_toy_run(tmp_path, rollout={"batch_size": 4, "samples_per_prompt": 8},
                        train={"backend": "megatron", "lr": 1e-3})


def said(res: object) -> str:
    return " ".join(str(getattr(res, "output", "")).split())


def test_without_megatron_core_lego_train_names_the_extra(toy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "megatron", None)  # importing it now raises ImportError
    res = runner.invoke(app, ["train", "-c", "lego.toml"])
    assert res.exit_code == 2, res.output
    assert "megatron-core is not installed" in said(res) and "lego-rl[megatron]" in said(res)


def test_pipeline_stages_without_their_processes_are_refused_before_anything_starts(toy: Path) -> None:
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (the `megatron` extra)")
    # Two stages in a plain (one-process) `lego train`: the stages need torchrun's processes.
    res = runner.invoke(app, ["train", "-c", "lego.toml", "--set", "train.pipeline_parallel=2",
                              "--set", "cluster.gpus_per_node=2"])
    assert res.exit_code == 2, res.output
    assert "= 2 trainer processes, but 1 is running" in said(res)
    assert not (toy / "runs").exists()


@pytest.mark.slow
def test_trains_the_toy_environment_with_megatron_and_resumes(toy: Path) -> None:
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (the `megatron` extra)")
    res = runner.invoke(app, ["train", "-c", "lego.toml", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["status"] == "completed" and summary["steps_done"] == 2
    root = toy / "runs" / "toy"
    rows = list(follow_metrics(root / "metrics.jsonl").read())
    assert [r.step for r in rows] == [0, 1]
    trained = [r for r in rows if r.values.get("trained")]
    assert trained and all("grad_norm" in r.values and r.values["tokens"] > 0 for r in trained)
    ckpt = root / "checkpoints" / "step-000001"
    marker = json.loads((ckpt / "lego_checkpoint.json").read_text())
    assert marker["backend"] == "megatron" and marker["tensor_parallel"] == 1
    assert (ckpt / "trainer_state.tp0.pt").is_file() and (ckpt / "model.safetensors").is_file()
    kinds = [e.kind for e in read_events(root / "events.jsonl")]
    assert kinds[0] == "run_started" and kinds[-1] == "training_finished"
    # Resume: the Megatron backend loads its own checkpoint and the loop continues at step 2.
    res = runner.invoke(app, ["train", "-c", "lego.toml", "--json", "--resume", "--steps", "3"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["steps_done"] == 3
    assert [r.step for r in follow_metrics(root / "metrics.jsonl").read()] == [0, 1, 2]
