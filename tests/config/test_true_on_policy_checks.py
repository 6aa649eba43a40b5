"""``train.true_on_policy``: ``lego validate`` refuses every combination whose engine and trainer logprobs cannot
be bit-identical, names the keys and the fix, and the key reaches the trainer's settings (issue 31)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lego_rl.cli.main import app
from lego_rl.compose.harnesses import harness_inventory
from lego_rl.compose.train_session import torch_settings
from lego_rl.config.checks import run_checks
from lego_rl.config.resolve import resolve

runner = CliRunner()
ON = ["train.true_on_policy=true", "rollout.top_p=1.0"]


def codes(path: Path, *overrides: str) -> set[str]:
    r = resolve(path, environ={}, overrides=list(overrides))
    return {f.code for f in run_checks(r, harnesses=harness_inventory(r, environ={})) if f.code.startswith("true_")}


def test_the_supported_combination_passes(base_toml: Path) -> None:
    assert codes(base_toml, *ON) == set()
    assert codes(base_toml, 'rollout.top_p=0.9') == set()  # off: nothing to refuse


@pytest.mark.parametrize(("override", "code"), [
    ('serving.backend="vllm"', "true_on_policy_vllm"),
    ('train.backend="megatron"', "true_on_policy_backend"),
    ("rollout.top_p=0.95", "true_on_policy_truncation"),
    ("rollout.top_k=20", "true_on_policy_truncation"),
    ('serving.precision="weights"', "true_on_policy_precision"),
    ('train.precision="fp32"', "true_on_policy_fp32"),
    ('train.packed_attention="varlen"', "true_on_policy_attention"),
    ("model.moe=true", "true_on_policy_moe"),
    ("cluster.gpus_per_node=2", "true_on_policy_world"),
])
def test_each_combination_that_cannot_be_bit_identical_is_refused(base_toml: Path, override: str, code: str) -> None:
    assert code in codes(base_toml, *ON, override)


def test_fp32_on_cpu_is_allowed(base_toml: Path) -> None:
    assert codes(base_toml, *ON, 'train.precision="fp32"', 'serving.device="cpu"') == set()


def test_lego_validate_names_the_keys_and_the_fix(base_toml: Path) -> None:
    args = ["validate", "-c", str(base_toml), "--set", "train.true_on_policy=true", "--json"]  # top_p 0.95 default
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    [finding] = [f for f in json.loads(result.stdout)["findings"] if f["code"] == "true_on_policy_truncation"]
    assert finding["severity"] == "error" and "rollout.top_p = 0.95" in finding["message"]
    assert "rollout.top_p = 1.0" in finding["fix"]


def test_the_key_reaches_the_trainer(base_toml: Path) -> None:
    pytest.importorskip("torch")
    assert torch_settings(resolve(base_toml, environ={}, overrides=ON).config).true_on_policy is True
    assert torch_settings(resolve(base_toml, environ={}).config).true_on_policy is False
