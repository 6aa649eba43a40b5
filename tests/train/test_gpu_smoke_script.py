"""scripts/gpu_smoke.py (the multi-GPU smoke run of docs/cluster.md) as a CPU dry run: two gloo trainer ranks with
the Megatron backend at TP=2 under torchrun, one separate `lego serve` engine writing its served tokens, two
synchronous GRPO steps of the toy environment, then `lego audit` over both ranks' records. The same script, the
same code paths, that the GPU run takes; only the devices and the model size differ."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_smoke_script_trains_on_two_ranks_with_a_separate_engine_and_the_audit_passes(tmp_path: Path) -> None:
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (the `megatron` extra)")
    out = tmp_path / "smoke"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_smoke.py"), "--out", str(out), "--cpu",
                           "--trainer-gpus", "2", "--engine-gpus", "1", "--tp", "2", "--sequence-parallel"],
                          capture_output=True, text=True, timeout=900)
    train_log = (out / "train.log").read_text(errors="replace")[-3000:] if (out / "train.log").exists() else ""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + train_log
    run = out / "run"
    assert sorted(p.name for p in (run / "audit").glob("rank-*.jsonl")) == ["rank-0.jsonl", "rank-1.jsonl"]
    served = [json.loads(line) for line in (run / "audit" / "engine-0.jsonl").read_text().splitlines()]
    assert len(served) >= 16 and all(r["token_ids"] and len(r["logprobs"]) == len(r["token_ids"]) for r in served)
    report = json.loads((run / "audit" / "report.json").read_text())
    assert report["passed"] and report["ranks"] == 2, report
    summary = (out / "summary.md").read_text()
    assert "Megatron TP=2 × DP=1, sequence parallel" in summary and "1 `lego serve` engine(s)" in summary
    assert "| engines_served_synced_weights | pass |" in summary
    # The engine was a separate process: the run's config points the trainer at it, not at an embedded engine.
    config = json.loads((run / "config.json").read_text())
    assert config["serving"]["backend"]["value"] == "vllm" and len(config["serving"]["urls"]["value"]) == 1


def test_an_existing_run_folder_is_refused_before_anything_starts(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_smoke.py"), "--out", str(tmp_path), "--cpu"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "never overwritten" in proc.stderr
