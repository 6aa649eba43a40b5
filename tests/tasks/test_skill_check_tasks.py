"""skills/check-tasks/SKILL.md: every command block runs, as written, against the example tasks (bash with
errexit and pipefail, the venv's `lego` first on PATH), and shows what its step says it shows."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKILL = ROOT / "skills" / "check-tasks" / "SKILL.md"
BLOCKS = re.findall(r"```bash\n(.*?)```", SKILL.read_text(), flags=re.DOTALL)
EXAMPLES = ROOT / "examples" / "tasks"


def test_the_skill_is_in_agent_skills_format() -> None:
    text = SKILL.read_text()
    front = re.match(r"---\nname: ([a-z0-9-]+)\ndescription: (.+?)\n---\n", text)
    assert front and front.group(1) == "lego-check-tasks" and len(front.group(2)) > 40
    assert "## Steps" in text and len(BLOCKS) == 8


@pytest.mark.skipif(shutil.which("jq") is None or shutil.which("bwrap") is None
                    or not Path("/var/cache/lego-rl/rootfs-bookworm").is_dir(),
                    reason="needs jq, bwrap and the examples' rootfs")
def test_every_command_block_runs_against_the_example_tasks(tmp_path: Path) -> None:
    # the operator's shell less anything that would redirect lego (as tests/skills/test_skill_blocks.py)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LEGO_", "RUN_", "SWE_", "ADAPTER_", "MONITOR_"))
           and k not in {"PROMPT_DATA", "HF_CHECKPOINT", "DATA_ROOT", "RUN_ROOT"}}
    # as tests/skills/test_skill_blocks.py runs every skill: a 10 s budget ends the tiny model's rollouts
    env.update(REPO=str(ROOT), TASKS=str(EXAMPLES), WORK=str(tmp_path), SWE_AGENT_TIME_BUDGET_SEC="10",
               COLUMNS="140", PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}")
    outputs = []
    for block in BLOCKS:
        res = subprocess.run(["bash", "-euo", "pipefail", "-c", block], env=env, cwd=tmp_path, capture_output=True,
                             text=True, check=False, timeout=600)
        assert res.returncode == 0, f"{block}\n--- stdout\n{res.stdout}\n--- stderr\n{res.stderr}"
        outputs.append(res.stdout)
    assert outputs[0].strip() == "exit 0"
    summary = json.loads(outputs[1])
    assert (summary["rows"], summary["valid"], summary["invalid"]) == (3, 3, 0)
    assert set(summary["cost_s"]) == {"sandbox", "setup", "tests"}
    assert outputs[2] == ""  # no row is invalid
    assert outputs[3].split() == ["3", "lego-example-duration", "lego-example-median", "lego-example-slugify"]
    assert json.loads(outputs[4]) == {"reused": 3, "checked": 0}
    # screening: the random tiny model solves nothing, so nothing is kept (exit 1) and every task is named
    assert outputs[5].strip() == "exit 1"
    rows = [line.split("\t") for line in outputs[6].splitlines()[:3]]
    assert [(r[1], r[2], r[3]) for r in rows] == [(i, "never solved", "0/2") for i in outputs[3].split()[1:]]
    summary = json.loads("\n".join(outputs[6].splitlines()[3:]))
    assert summary["kept"] == 0 and sum(summary["terminations"].values()) == 6
    assert summary["infrastructure_failures"] == 0
    assert (tmp_path / "screened.jsonl").read_text() == ""
    assert json.loads(outputs[7]) == {"reused": 6, "rolled_out": 0}
