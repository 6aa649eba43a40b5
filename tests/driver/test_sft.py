"""`lego train --sft`: supervised warm start through the real torch backend on the tiny model.

Demonstrations here are first_letter answers rendered with the tiny model's own chat template (prompt
masked, answer trained). Covered: the loss falls and the demonstrated tokens' log-probability rises under
the saved checkpoint; the run directory (metrics rows, events, TensorBoard scalars equal to the rows); a
GRPO run starts from the SFT checkpoint; resume continues bit-for-bit; bad data is refused naming file and
line before anything starts; recorded rollouts become SFT data (``collect_demonstrations``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.loop_settings import default_sft_settings
import torch
from typer.testing import CliRunner

from lego_rl.cli.main import app
from lego_rl.driver.sft import collect_demonstrations, load_demonstrations
from lego_rl.driver.toy_env import PROMPT, make_rows
from lego_rl.runstore import read_events
from lego_rl.runstore.log import follow_metrics
from lego_rl.serving.tiny_model import ensure_tiny_model
from lego_rl.train.batching import plan_steps
from lego_rl.trajectory.sample import Sample

TOML = """
[serving]
device = "cpu"
port = 0

[sandbox]
provider = "bwrap"

[rollout]
prompt_data = "toy.jsonl"
batch_size = 2
samples_per_prompt = 2
top_p = 1.0

[train]
environment = "first_letter"
num_rollout = 1
lr = 0.001
sft_batch_size = 3
seed = 5

[paths]
run_root = "runs/sft"
"""

ANSWERS = {"a": "apple", "e": "egg", "s": "sun", "t": "tree"}
runner = CliRunner()


def demo_samples(n: int) -> list[Sample]:
    """first_letter demonstrations in the tiny model's chat template: the answer (and its end token) trained."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ensure_tiny_model()))
    end = tok.convert_tokens_to_ids("<|im_end|>")
    out = []
    for i, row in enumerate(make_rows(n)):
        prompt = tok.apply_chat_template([{"role": "user", "content": PROMPT.format(letter=row["letter"])}],
                                         add_generation_prompt=True, tokenize=True)
        if isinstance(prompt, dict) or hasattr(prompt, "input_ids"):
            prompt = prompt["input_ids"]
        answer = tok.encode(ANSWERS[row["letter"]], add_special_tokens=False) + [end]
        tokens = list(prompt) + answer
        out.append(Sample(rollout_id=f"demo-{i}", group_index=i, index=0, tokens=tokens,
                          loss_mask=[0] * len(prompt) + [1] * len(answer), rollout_logprobs=[0.0] * len(tokens),
                          reward=1.0))
    return out


def write_demos(path: Path, samples: list[Sample]) -> Path:
    path.write_text("".join(s.model_dump_json() + "\n" for s in samples))
    return path


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    for name in list(os.environ):
        if name.startswith(("LEGO_", "SWE_", "ADAPTER_")) or name in {"PROMPT_DATA", "RUN_ROOT", "RUN_LOG",
                                                                      "HF_CHECKPOINT", "DATA_ROOT"}:
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "toy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in make_rows(8)))
    (tmp_path / "lego.toml").write_text(TOML)
    write_demos(tmp_path / "demos.jsonl", demo_samples(8))
    yield tmp_path


def said(res: object) -> str:
    return " ".join(res.output.split())  # type: ignore[attr-defined]


def demo_logprob(model_dir: Path, samples: list[Sample]) -> float:
    """Mean log-probability of the demonstrated (loss-masked) tokens under the model in ``model_dir``."""
    from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings

    backend = TorchBackend(model_dir, TorchTrainSettings(lr=1e-3, device="cpu"))
    [step] = plan_steps(samples, [0.0] * len(samples), max_tokens_per_micro_batch=16384)
    [lp] = backend.compute_logprobs(step.micro_batches, temperature=1.0)  # [T]
    mask = step.micro_batches[0].loss_mask  # [T]
    return float((lp * mask).sum() / mask.sum())


@pytest.mark.slow
def test_sft_lowers_the_loss_writes_the_run_and_grpo_starts_from_its_checkpoint(toy: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    res = runner.invoke(app, ["train", "-c", "lego.toml", "--sft", "demos.jsonl", "--steps", "12", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    root = toy / "runs" / "sft"
    assert summary["status"] == "completed" and summary["steps_done"] == 12
    assert summary["checkpoint"] == str(root / "checkpoints" / "step-000011")
    rows = list(follow_metrics(root / "metrics.jsonl").read())
    assert [r.step for r in rows] == list(range(12))
    for r in rows:
        assert {"loss", "nll", "tokens", "lr", "grad_norm", "demonstrations"} <= set(r.values)
        assert r.values["demonstrations"] == 3 and r.values["lr"] == pytest.approx(1e-3)
    first, last = rows[0].values["loss"], rows[-1].values["loss"]
    assert last < 0.5 * first, [r.values["loss"] for r in rows]
    kinds = [e.kind for e in read_events(root / "events.jsonl")]
    assert kinds[0] == "run_started" and kinds[-1] == "training_finished"
    assert kinds.count("step_finished") == 12 and kinds.count("checkpoint_saved") == 1

    # The checkpoint is a model directory: the demonstrated tokens are more likely under it.
    demos = load_demonstrations(toy / "demos.jsonl", micro_batch_tokens=16384)
    samples = [s for d in demos for s in d.samples]
    before = demo_logprob(ensure_tiny_model(), samples)
    after = demo_logprob(Path(summary["checkpoint"]), samples)
    assert after > before + 1.0, (before, after)

    # TensorBoard: the metrics rows' values, under their declared group.
    acc = EventAccumulator(str(root / "tensorboard"))
    acc.Reload()
    for name in ("loss", "grad_norm", "lr", "tokens"):
        points = acc.Scalars(f"train/{name}")
        assert [p.step for p in points] == list(range(12))
        # TensorBoard stores fp32 (half an ulp: 6e-8 relative); the rows keep the fp64 values.
        assert [p.value for p in points] == pytest.approx([r.values[name] for r in rows], rel=1e-6)

    # GRPO from the SFT checkpoint, through the CLI (engine and trainer both load it).
    res = runner.invoke(app, ["train", "-c", "lego.toml", "--run-root", "runs/rl", "--set",
                              f'model.checkpoint="{summary["checkpoint"]}"', "--json"])
    assert res.exit_code == 0, res.output
    rl = list(follow_metrics(toy / "runs" / "rl" / "metrics.jsonl").read())
    assert len(rl) == 1 and "reward_mean" in rl[0].values
    acc = EventAccumulator(str(toy / "runs" / "rl" / "tensorboard"))
    acc.Reload()
    [point] = acc.Scalars("rollout/reward_mean")
    assert point.step == 0 and point.value == pytest.approx(rl[0].values["reward_mean"])


@pytest.mark.slow
def test_resume_continues_bit_for_bit(toy: Path) -> None:
    base = ["train", "-c", "lego.toml", "--sft", "demos.jsonl", "--json", "--set", "train.checkpoint_every=2"]
    res = runner.invoke(app, [*base, "--steps", "6", "--run-root", "runs/whole"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, [*base, "--steps", "3", "--run-root", "runs/split"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, [*base, "--steps", "6", "--run-root", "runs/split", "--resume"])
    assert res.exit_code == 0, res.output

    def losses(name: str) -> list[tuple[int, float, float]]:
        return [(r.step, r.values["loss"], r.values["grad_norm"])
                for r in follow_metrics(toy / "runs" / name / "metrics.jsonl").read()]

    assert losses("split") == losses("whole")  # exact: same batches, optimizer state and RNG
    from safetensors.torch import load_file

    whole = load_file(toy / "runs/whole/checkpoints/step-000005/model.safetensors")
    split = load_file(toy / "runs/split/checkpoints/step-000005/model.safetensors")
    assert whole.keys() == split.keys()
    assert all(torch.equal(whole[k], split[k]) for k in whole)
    assert (toy / "runs/split/config.resume-1.json").exists()


def test_missing_data_file_is_a_usage_error(toy: Path) -> None:
    res = runner.invoke(app, ["train", "-c", "lego.toml", "--sft", "nowhere.jsonl"])
    assert res.exit_code == 2, res.output
    assert "nowhere.jsonl does not exist" in said(res)
    assert not (toy / "runs" / "sft").exists()


@pytest.mark.parametrize(
    ("line", "message"),
    [("{not json", "not a Sample"),
     (json.dumps({"rollout_id": "x", "group_index": 0, "index": 0, "tokens": [1, 2], "loss_mask": [0, 1, 1],
                  "rollout_logprobs": [0.0, 0.0]}), "loss_mask has 3 entries but tokens has 2"),
     (json.dumps({"rollout_id": "x", "group_index": 0, "index": 0, "tokens": [1, 2], "loss_mask": [0, 0],
                  "rollout_logprobs": [0.0, 0.0]}), "rollout 'x' has no token with loss_mask 1"),
     (json.dumps({"rollout_id": "demo-0", "group_index": 0, "index": 0, "tokens": [1, 2], "loss_mask": [0, 1],
                  "rollout_logprobs": [0.0, 0.0]}), "rollout 'demo-0' segment 0 repeats line 1")],
    ids=["not-json", "misaligned", "nothing-trained", "duplicate"],
)
def test_bad_demonstration_names_file_and_line(toy: Path, line: str, message: str) -> None:
    with (toy / "demos.jsonl").open("a") as fh:
        fh.write(line + "\n")
    res = runner.invoke(app, ["train", "-c", "lego.toml", "--sft", "demos.jsonl"])
    assert res.exit_code == 2, res.output
    assert "demos.jsonl row 9" in said(res) and message in said(res), said(res)
    assert not (toy / "runs" / "sft").exists()  # refused before the run directory exists


def test_segment_longer_than_a_micro_batch_is_refused(toy: Path) -> None:
    res = runner.invoke(app, ["train", "-c", "lego.toml", "--sft", "demos.jsonl", "--set",
                              "train.micro_batch_tokens=8"])
    assert res.exit_code == 2, res.output
    assert "demos.jsonl row 1" in said(res) and "longer than train.micro_batch_tokens = 8" in said(res)


def test_collect_demonstrations_keeps_rewarded_rollouts_of_each_run(tmp_path: Path) -> None:
    samples = demo_samples(3)
    for run, rewards in (("run-a", [1.0, 0.0]), ("run-b", [1.0])):
        for k, reward in enumerate(rewards):
            folder = tmp_path / run / "sandboxes" / f"r{k}"
            folder.mkdir(parents=True)
            s = samples[k].model_copy(update={"rollout_id": f"r{k}", "reward": reward})
            write_demos(folder / "samples.jsonl", [s])
    got = collect_demonstrations([tmp_path / "run-a", tmp_path / "run-b"])
    assert sorted(s.rollout_id for s in got) == ["run-a/r0", "run-b/r0"]
    everything = collect_demonstrations([tmp_path / "run-a"], min_reward=None)
    assert sorted(s.rollout_id for s in everything) == ["run-a/r0", "run-a/r1"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(Exception, match="no sandboxes/\\*/samples.jsonl"):
        collect_demonstrations([tmp_path / "empty"])


class CheckpointOnlyBackendDouble:
    """TEST DOUBLE of a TrainerBackend for the runner's bookkeeping (no model): train_step counts calls,
    checkpoints are a JSON file of the extra state."""

    def __init__(self) -> None:
        self.weight_version = 0
        self.trained_on: list[list[str]] = []

    def train_step(self, step, loss_fn, *, old_logprobs, temperature, top_p=1.0, top_k=-1):  # type: ignore[no-untyped-def]
        from lego_rl.train.backend import StepResult

        self.trained_on.append(list(step.rollout_ids))
        self.weight_version += 1
        return StepResult(metrics={"loss": 1.0 / self.weight_version, "tokens": 1.0}, weight_version=self.weight_version)

    def save_checkpoint(self, path: Path, *, extra_state: dict) -> None:  # type: ignore[type-arg]
        path.mkdir(parents=True)
        (path / "extra.json").write_text(json.dumps(extra_state))

    def load_checkpoint(self, path: Path) -> dict:  # type: ignore[type-arg]
        return json.loads((path / "extra.json").read_text())


def sft_runner(tmp_path: Path, backend: CheckpointOnlyBackendDouble, *, resume: bool = False, steps: int = 4):  # type: ignore[no-untyped-def]
    from lego_rl.driver.sft import SftRunner
    from lego_rl.runstore import RunDir

    demos_file = tmp_path / "d.jsonl"
    if not demos_file.exists():
        write_demos(demos_file, demo_samples(3))
    demos = load_demonstrations(demos_file, micro_batch_tokens=4096)
    run = RunDir.open(tmp_path / "run", config={}, resume=resume)
    return SftRunner(default_sft_settings(steps=steps, batch_size=2, micro_batch_tokens=4096, seed=1), backend=backend,
                     demos=demos, run=run)


async def test_stop_checkpoints_the_last_completed_step_and_resume_draws_on(tmp_path: Path) -> None:
    first = sft_runner(tmp_path, CheckpointOnlyBackendDouble())
    first.on_step = lambda row: first.request_stop() if row.step == 1 else None
    assert await first.run() == "stopped"
    first.run_dir.close()
    assert (tmp_path / "run/checkpoints/latest").read_text().strip() == "step-000001"
    backend = CheckpointOnlyBackendDouble()
    again = sft_runner(tmp_path, backend, resume=True)
    assert again.resume() == 1
    assert await again.run() == "completed"
    again.run_dir.close()
    whole_backend = CheckpointOnlyBackendDouble()
    (tmp_path / "whole").mkdir()
    whole = sft_runner(tmp_path / "whole", whole_backend)
    await whole.run()
    # The resumed run trained steps 2 and 3 on the same demonstrations as an uninterrupted run did.
    assert backend.trained_on == whole_backend.trained_on[2:]
    steps = [r.step for r in follow_metrics(tmp_path / "run/metrics.jsonl").read()]
    assert steps == [0, 1, 2, 3]


async def test_resume_refuses_a_grpo_checkpoint(tmp_path: Path) -> None:
    from lego_rl.errors import ConfigError

    runner_ = sft_runner(tmp_path, CheckpointOnlyBackendDouble())
    grpo = tmp_path / "run/checkpoints/step-000004"
    grpo.mkdir(parents=True)
    (grpo / "extra.json").write_text(json.dumps({"step": 4, "cursor": {"epoch": 0, "position": 3}, "seed": 1}))
    (tmp_path / "run/checkpoints/latest").write_text("step-000004\n")
    with pytest.raises(ConfigError, match="was not written by SFT"):
        runner_.resume()
