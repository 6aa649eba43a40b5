"""Fixtures for the `lego` command tests: a clean working directory with a minimal valid config."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """cwd with one task row, an images.json whose rootfs exists, a lego.toml on bwrap, no stray variables."""
    for name in list(os.environ):
        if name.startswith(("LEGO_", "VIME_", "SWE_", "SUNABAKO_", "ADAPTER_")) or name in {
            "PROMPT_DATA", "HF_CHECKPOINT", "DATA_ROOT", "RUN_ROOT", "RUN_LOG", "E2B_API_KEY",
        }:
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    row = {"prompt": [{"role": "user", "content": "fix it"}], "label": "t1",
           "metadata": {"instance_id": "t1", "image": "img:1", "workdir": "/testbed", "eval_cmd": "true",
                        "problem_statement": "fix it"}}
    (tmp_path / "tasks.jsonl").write_text(json.dumps(row) + "\n")
    (tmp_path / "images.json").write_text(json.dumps({"img:1": {"rootfs": "/", "workdir": "/testbed", "env": {}}}))
    (tmp_path / "lego.toml").write_text(
        '[sandbox]\nprovider = "bwrap"\nimages = "images.json"\n\n[rollout]\nprompt_data = "tasks.jsonl"\n\n'
        '[paths]\nrun_root = "runs/check"\n'
    )
    return tmp_path
