from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A clean cwd with a minimal valid dataset, images.json and no stray LEGO/SWE variables."""
    import os

    for name in list(os.environ):
        if name.startswith(("LEGO_", "VIME_", "SWE_", "SUNABAKO_", "ADAPTER_")) or name in {
            "NUM_ROLLOUT", "PROMPT_DATA", "ROLLOUT_BATCH_SIZE", "SAMPLES_PER_PROMPT", "GLOBAL_BATCH_SIZE",
            "MAX_CONTEXT_LEN", "MAX_RESPONSE_LEN", "HF_CHECKPOINT", "DATA_ROOT", "RUN_ROOT", "RUN_LOG",
            "CHAT_TEMPLATE_KWARGS", "TRAIN_HEAD", "TRAIN_WORKER", "SSH_PORT", "E2B_API_KEY",
        }:
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    row = {"prompt": [{"role": "user", "content": "fix it"}], "label": "t1",
           "metadata": {"instance_id": "t1", "image": "img:1", "workdir": "/testbed", "eval_cmd": "true",
                        "problem_statement": "fix it"}}
    (tmp_path / "tasks.jsonl").write_text(json.dumps(row) + "\n")
    (tmp_path / "images.json").write_text(json.dumps({"img:1": {"rootfs": "/", "workdir": "/testbed", "env": {}}}))
    return tmp_path


BASE_TOML = """
[sandbox]
provider = "bwrap"
images = "images.json"

[rollout]
prompt_data = "tasks.jsonl"
"""


@pytest.fixture
def base_toml(workdir: Path) -> Path:
    path = workdir / "lego.toml"
    path.write_text(BASE_TOML)
    return path
