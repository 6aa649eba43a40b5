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
    assert "## Steps" in text and len(BLOCKS) == 5


@pytest.mark.skipif(shutil.which("jq") is None or shutil.which("bwrap") is None
                    or not Path("/var/cache/lego-rl/rootfs-bookworm").is_dir(),
                    reason="needs jq, bwrap and the examples' rootfs")
def test_every_command_block_runs_against_the_example_tasks(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEGO_")}
    env.update(TASKS=str(EXAMPLES), WORK=str(tmp_path),
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
