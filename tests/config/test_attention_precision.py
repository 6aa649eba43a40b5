"""``train.precision`` and ``train.packed_attention``: an fp32 trainer cannot take varlen (flash) attention, and
``lego validate`` says so before a run starts (issue 31)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lego_rl.cli.main import app
from lego_rl.compose.harnesses import harness_inventory
from lego_rl.compose.train_session import megatron_settings, torch_settings
from lego_rl.config.checks import run_checks
from lego_rl.config.resolve import resolve

runner = CliRunner()


def codes(path: Path, *overrides: str) -> set[str]:
    r = resolve(path, environ={}, overrides=list(overrides))
    return {f.code for f in run_checks(r, harnesses=harness_inventory(r, environ={}))}


@pytest.mark.parametrize(("precision", "attention", "refused"), [
    ("bf16", "varlen", False), ("bf16", "auto", False), ("fp32", "auto", False), ("fp32", "sdpa", False),
    ("fp32", "varlen", True),
])
def test_varlen_with_fp32_is_the_one_refused_combination(base_toml: Path, precision: str, attention: str,
                                                         refused: bool) -> None:
    found = codes(base_toml, f'train.precision="{precision}"', f'train.packed_attention="{attention}"')
    assert ("varlen_fp32" in found) is refused


def test_lego_validate_names_the_keys_and_the_fix(base_toml: Path) -> None:
    args = ["validate", "-c", str(base_toml), "--set", 'train.precision="fp32"', "--set",
            'train.packed_attention="varlen"', "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    [finding] = [f for f in json.loads(result.stdout)["findings"] if f["code"] == "varlen_fp32"]
    assert finding["severity"] == "error"
    assert 'train.precision = "fp32"' in finding["message"] and "flash attention" in finding["message"]
    assert "train.packed_attention" in finding["fix"] and '"auto"' in finding["fix"]


def test_the_keys_reach_both_backends(base_toml: Path) -> None:
    pytest.importorskip("torch")
    r = resolve(base_toml, environ={}, overrides=['train.precision="fp32"', 'train.packed_attention="sdpa"'])
    s = torch_settings(r.config)
    assert (s.precision, s.packed_attention) == ("fp32", "sdpa")
    assert megatron_settings(r.config).bf16 is False
    assert megatron_settings(resolve(base_toml, environ={}).config).bf16 is True
