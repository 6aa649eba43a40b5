"""`lego validate` (and `lego train`'s own check) asks the vLLM lego launches whether it can return routed
experts when R3 is on with the vLLM backend (lego_rl.compose.engine_checks). The installed vLLM
(.venv-vllm) is asked for real; the one without the flag is the TEST DOUBLE of tests/support/old_vllm.py."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from support.old_vllm import old_vllm
from typer.testing import CliRunner

from lego_rl.cli.main import app
from lego_rl.serving.vllm_launch import vllm_python

SKIP_VLLM = os.environ.get("LEGO_SKIP_VLLM") == "1"  # read before the workdir fixture clears LEGO_* variables
R3_VLLM = ["rollout.use_rollout_routing_replay=true", 'serving.backend="vllm"',
           'serving.urls=["http://127.0.0.1:8000"]']


def validate(workdir: Path, python: Path | str | None, *overrides: str) -> dict[str, str]:
    """Finding code -> message of `lego validate --json` with ``LEGO_VLLM_PYTHON=python`` (None: unset)."""
    moe = workdir / "moe"
    moe.mkdir(exist_ok=True)
    (moe / "config.json").write_text(json.dumps({"model_type": "qwen3_moe", "num_experts": 8}))
    argv = ["validate", "-c", "lego.toml", "--json", "--set", f'model.checkpoint="{moe}"']
    for item in overrides:
        argv += ["--set", item]
    env = {"LEGO_VLLM_PYTHON": str(python)} if python is not None else {}
    result = CliRunner().invoke(app, argv, env=env)
    report = json.loads(result.stdout)
    return {f["code"]: f["message"] for f in report["findings"]}


def test_r3_with_a_vllm_without_the_flag_is_refused(workdir: Path) -> None:
    old = old_vllm(workdir / "old-vllm")
    found = validate(workdir, old, *R3_VLLM)
    message = found["r3_vllm_flag"]
    assert "vllm 0.8.5" in message and str(old) in message and "--enable-return-routed-experts" in message
    assert "r3_vllm_flag" not in validate(workdir, old, R3_VLLM[0])  # the embedded engine: no vLLM involved
    assert "no usable vLLM" in validate(workdir, sys.executable, *R3_VLLM)["r3_vllm"]  # lego's own interpreter
    assert not {"r3_vllm", "r3_vllm_flag"} & set(validate(workdir, "/nonexistent/python", *R3_VLLM))  # elsewhere


def test_r3_with_the_installed_vllm_passes(workdir: Path) -> None:
    installed = vllm_python()
    if not installed.exists():
        if SKIP_VLLM:
            pytest.skip("LEGO_SKIP_VLLM=1 and no vLLM environment (scripts/setup_vllm.sh)")
        pytest.fail(f"no vLLM interpreter at {installed}: run scripts/setup_vllm.sh (or LEGO_SKIP_VLLM=1)")
    assert not {"r3_vllm", "r3_vllm_flag"} & set(validate(workdir, installed, *R3_VLLM))
