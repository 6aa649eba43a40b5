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
    assert "torchrun --nproc-per-node 2 -m lego_rl train" in said(res)
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


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["tensor_parallel", "pipeline_parallel", "expert_parallel", "sequence_parallel"])
def test_lego_train_under_torchrun_trains_with_megatron_model_parallel(tmp_path: Path, layout: str) -> None:
    """``torchrun --nproc-per-node 2 lego train`` with ``train.backend = "megatron"`` and TP=2, PP=2, EP=2 (the
    tiny MoE, DP=2) or TP=2 with sequence parallelism (the tiny MoE: its experts split by TP; gloo on CPU): rank 0
    runs the loop, the engine and the run directory, rank 1 follows its trainer calls (``train.distributed``);
    both exit 0, both steps trained, the checkpoint holds one optimizer shard per rank and the gathered HF
    weights, and `lego audit` passes over both ranks' records."""
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (the `megatron` extra)")
    import os
    import socket
    import subprocess

    from lego_rl.serving.tiny_model import ensure_tiny_model

    sizes: dict[str, object] = ({"tensor_parallel": 2, "sequence_parallel": True} if layout == "sequence_parallel"
                                else {layout: 2})
    moe = layout in ("expert_parallel", "sequence_parallel")
    write_toy_run(tmp_path, rollout={"batch_size": 4, "samples_per_prompt": 8, "max_staleness": 0},
                  train={"backend": "megatron", "lr": 1e-3, **sizes, "audit": True,
                         "oversample_zero_variance": True},
                  cluster={"gpus_per_node": 2},
                  **({"model": {"checkpoint": str(ensure_tiny_model(moe=True))}} if moe else {}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEGO_", "SWE_", "ADAPTER_"))
           and k not in {"PROMPT_DATA", "RUN_ROOT", "RUN_LOG", "HF_CHECKPOINT", "DATA_ROOT"}}
    with socket.socket() as sock:  # a named free port: --master-port 0 would hang the rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    lego = str(Path(sys.executable).with_name("lego"))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
                           "--master-addr=127.0.0.1", f"--master-port={port}", lego, "train", "-c", "lego.toml",
                           "--json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    root = tmp_path / "runs" / "toy"
    rows = list(follow_metrics(root / "metrics.jsonl").read())
    assert [r.step for r in rows] == [0, 1]
    assert any(r.values.get("trained") and r.values.get("grad_norm", 0) > 0 for r in rows), [r.values for r in rows]
    ckpt = root / "checkpoints" / "step-000001"
    marker = json.loads((ckpt / "lego_checkpoint.json").read_text())
    assert marker["backend"] == "megatron" and marker["tensor_parallel" if layout == "sequence_parallel" else layout] == 2
    shards = {"tensor_parallel": ["trainer_state.tp0.pt", "trainer_state.tp1.pt"],
              "sequence_parallel": ["trainer_state.tp0.pt", "trainer_state.tp1.pt"],
              "pipeline_parallel": ["trainer_state.pp0.tp0.pt", "trainer_state.pp1.tp0.pt"],
              "expert_parallel": ["trainer_state.ep0.tp0.pt", "trainer_state.ep1.tp0.pt"]}[layout]
    assert all((ckpt / name).is_file() for name in shards), sorted(p.name for p in ckpt.iterdir())
    assert (ckpt / "model.safetensors").is_file()
    # The audit: both TP ranks recorded both optimizer steps and changed their own shards; every trained token
    # is an engine reply; step 1 was served the weights step 0 trained.
    res = runner.invoke(app, ["audit", str(root), "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["ranks"] == 2 and report["steps_trained"] == 2, report
    for rank in (0, 1):
        rows = [json.loads(line) for line in (root / "audit" / f"rank-{rank}.jsonl").read_text().splitlines()]
        assert [r["optimizer_steps_after"] for r in rows] == [1, 2]
        if not moe:
            assert all(r["parameters_changed"] == r["parameters"] for r in rows), rows
        else:  # an expert no token of the toy's short prompts was routed to keeps its weights (checked below)
            assert all(0 < r["parameters_changed"] <= r["parameters"] for r in rows), rows
    if moe:
        from safetensors.torch import load_file
        from torch import equal

        before = load_file(str(next(ensure_tiny_model(moe=True).glob("*.safetensors"))))
        after = load_file(str(ckpt / "model.safetensors"))
        assert sorted(after) == sorted(before)  # every expert of both ranks, in the HF layout
        unchanged = [n for n in before if equal(before[n], after[n])]
        assert all(".mlp.experts." in n for n in unchanged), unchanged  # every dense weight trained
        moved = {int(n.split(".")[5]) for n in before if ".mlp.experts." in n and n not in unchanged}
        if layout == "expert_parallel":
            assert moved & {0, 1, 2, 3} and moved & {4, 5, 6, 7}, moved  # both ranks' experts trained
        else:  # TP splits every expert in two: trained ones moved (both halves gathered into the HF file)
            assert moved, moved
    if layout == "pipeline_parallel":  # each stage holds its own layers: the two ranks' parameter sets differ
        assert {json.loads(line)["parameters"] for rank in (0, 1)
                for line in (root / "audit" / f"rank-{rank}.jsonl").read_text().splitlines()} != {0}
