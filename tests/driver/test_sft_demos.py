"""Demonstrations recorded through the real CLI, then SFT on them: scripts/record_demos.py drives
`lego rollout-check` (Claude Code in bwrap, lego's adapter, the task's hidden tests) with the scripted
policy (TEST DOUBLE at the model boundary, tests/support/scripted_engine.py) applying each example task's
reference fix at lego.toml's output cap (the main job's recording stage); `lego train --sft` on a rewarded
rollout's samples must lower the loss and raise the tiny model's log-probability of the demonstrated tokens
(real torch backend)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lego_rl.cli.main import app
from lego_rl.driver.sft import load_demonstrations
from lego_rl.runstore.log import follow_metrics
from lego_rl.serving.tiny_model import ensure_tiny_model
from lego_rl.train.batching import plan_steps
from lego_rl.trajectory.sample import Sample

# A demonstration is a whole Claude Code prompt (~9k tokens of the tiny vocabulary): a few minutes of CPU.
pytestmark = [pytest.mark.slow, pytest.mark.cli, pytest.mark.root, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]


def demo_logprob(model_dir: Path, samples: list[Sample], max_tokens: int) -> float:
    from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings

    backend = TorchBackend(model_dir, TorchTrainSettings(lr=1e-3, device="cpu"))
    [step] = plan_steps(samples, [0.0] * len(samples), max_tokens_per_micro_batch=max_tokens)
    lps = backend.compute_logprobs(step.micro_batches, temperature=1.0)
    total = sum(float((lp * mb.loss_mask).sum()) for lp, mb in zip(lps, step.micro_batches, strict=True))
    return total / sum(float(mb.loss_mask.sum()) for mb in step.micro_batches)


def test_recorded_demonstrations_train_the_tiny_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The main job's recording stage as `make run` runs it: every example task, at lego.toml's output cap. Each
    rollout completes (Claude Code exits 0, no "exceeded the N output token maximum") with reward 1, and the CLI
    asked the adapter for exactly that cap: the two agree."""
    import tomllib

    monkeypatch.chdir(REPO)
    cap = tomllib.loads((REPO / "lego.toml").read_text())["model"]["max_response_tokens"]
    demos = tmp_path / "demos.jsonl"
    proc = subprocess.run([sys.executable, "scripts/record_demos.py", "-c", "lego.toml", "-n", "1", "--out", str(demos),
                           "--run-root", str(tmp_path / "rec"), "--set", "agent.time_budget_s=240"],
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "3 demonstration(s)" in proc.stdout
    outcome = [json.loads(line) for line in (tmp_path / "rec" / "rollout-check" / "outcomes.jsonl").read_text()
               .splitlines()]
    assert sorted((o["termination"], o["reward"]) for o in outcome) == [("completed", 1.0)] * 3
    asked = {m for f in (tmp_path / "rec" / "sandboxes").glob("*/cli-claude_code_*.jsonl")
             for m in re.findall(r'"max_tokens":(\d+)', f.read_text())}
    assert asked == {str(cap)}, asked  # the CLI's own transcript of its requests
    loaded = load_demonstrations(demos, micro_batch_tokens=1 << 20)
    assert len(loaded) == 3 and all(d.rollout_id.startswith("rec/") for d in loaded)
    samples = next(d for d in loaded if "median" in d.rollout_id).samples
    longest = max(len(s.tokens) for s in samples)

    run_root = tmp_path / "sft"
    median = tmp_path / "median.jsonl"
    median.write_text("".join(x.model_dump_json() + "\n" for x in samples))
    res = CliRunner().invoke(app, ["train", "-c", "lego.toml", "--sft", str(median), "--steps", "3", "--json",
                                   "--run-root", str(run_root), "--set", "train.lr=0.003", "--set",
                                   "train.sft_batch_size=1", "--set", f"train.micro_batch_tokens={longest}", "--set",
                                   "train.warmup_steps=0"])
    assert res.exit_code == 0, res.output[-3000:]
    summary = json.loads(res.stdout)
    rows = list(follow_metrics(run_root / "metrics.jsonl").read())
    losses = [r.values["loss"] for r in rows]
    assert len(rows) == 3 and losses[-1] < 0.8 * losses[0], losses
    assert rows[0].values["tokens"] == sum(s.num_trained_tokens for s in samples)
    before = demo_logprob(ensure_tiny_model(), samples, longest)
    after = demo_logprob(Path(summary["checkpoint"]), samples, longest)
    assert after > before + 0.5, (before, after)
