"""skills/monitor/SKILL.md: every command block runs, as written, against the recorded runs (bash with errexit
and pipefail, the venv's `lego` first on PATH), and says what the step says it shows."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from monitor_runs import CHECK, TOY

SKILL = Path(__file__).resolve().parents[2] / "skills" / "monitor" / "SKILL.md"
BLOCKS = re.findall(r"```bash\n(.*?)```", SKILL.read_text(), flags=re.DOTALL)


def test_the_skill_is_in_agent_skills_format() -> None:
    text = SKILL.read_text()
    front = re.match(r"---\nname: ([a-z0-9-]+)\ndescription: (.+?)\n---\n", text)
    assert front and front.group(1) == "lego-monitor" and len(front.group(2)) > 40
    assert "## Steps" in text and len(BLOCKS) >= 8
    assert all(block.lstrip().startswith("lego ") for block in BLOCKS)


def _run(block: str, env: dict[str, str], cwd: Path) -> str:
    res = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert res.returncode == 0, f"{block}\n--- stdout\n{res.stdout}\n--- stderr\n{res.stderr}"
    return res.stdout


@pytest.mark.skipif(shutil.which("jq") is None, reason="jq missing")
@pytest.mark.parametrize("recorded", [TOY, CHECK], ids=["train", "rollout-check"])
def test_every_command_block_runs_against_a_recorded_run(
    recorded: Path, tmp_path: Path, copy_run: Callable[[Path], Path]
) -> None:
    run = copy_run(recorded)
    other = tmp_path / "other"
    shutil.copytree(recorded, other)
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEGO_", "RUN_", "MONITOR_"))}
    env.update(
        RUN=str(run),
        OTHER=str(other),
        WORK=str(work),
        COLUMNS="140",
        PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}",
    )
    outputs = [_run(block, env, work) for block in BLOCKS]
    assert (work / "report.html").stat().st_size > 1000
    if recorded == TOY:
        assert "finished (completed)" in outputs[0]
        assert '"reward": [' in outputs[1] and '"pass_at_1": [' in outputs[1]
        assert '"completed": 512' not in outputs[2] and '"completed": 544' in outputs[2]
        assert '"zero_variance": 40' in outputs[3]
        assert '"worst": [' in outputs[4] and '"warn": false' in outputs[4]
        assert "timeline" in outputs[6] or "finished: completed" in outputs[6]
        assert outputs[7].startswith("steps done 16/16 (last: step 15)   weight version 14")
        assert '"up": 0' in outputs[8]
    else:
        assert "[rollout-check] finished" in outputs[0]
        assert '"slowest_stages": [' in outputs[5] and "harness_install" in outputs[5]
