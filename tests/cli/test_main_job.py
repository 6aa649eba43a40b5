"""scripts/run_main_job.sh (`make run`): SFT warm start, then GRPO from the SFT checkpoint, each stage's
exit code passed on, the GRPO stage getting the extra arguments. The recording stage is skipped by naming
demonstrations in DEMOS (it needs the engine; tests/driver/test_sft_demos.py runs it for real)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

STUB = """#!/usr/bin/env bash
# TEST DOUBLE for the `lego` executable: records each call's arguments; `train --sft` leaves a
# checkpoints/latest under its --run-root as the real one does, then exits $STUB_EXIT_SFT.
printf '%s\\n' "$*" >> "$STUB_ARGS"
root=""; sft=0; prev=""
for a in "$@"; do
    [ "$prev" = "--run-root" ] && root="$a"
    [ "$a" = "--sft" ] && sft=1
    prev="$a"
done
if [ "$sft" = 1 ]; then
    mkdir -p "$root/checkpoints" && echo step-000007 > "$root/checkpoints/latest"
    exit "$STUB_EXIT_SFT"
fi
exit "$STUB_EXIT_GRPO"
"""


@pytest.mark.root  # the script runs the job in a network namespace (unshare -n)
@pytest.mark.parametrize(("sft_exit", "grpo_exit", "script_exit", "calls"), [
    (0, 0, 0, 2), (2, 0, 2, 1), (3, 0, 3, 1), (0, 3, 3, 2), (0, 130, 130, 2),
], ids=["trained", "sft-data-refused", "sft-infra", "grpo-infra", "grpo-stopped"])
def test_main_job_runs_sft_then_grpo_from_its_checkpoint(tmp_path: Path, sft_exit: int, grpo_exit: int,
                                                          script_exit: int, calls: int) -> None:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) for the loopback-only namespace")
    stub = tmp_path / "lego_test_double"
    stub.write_text(STUB)
    stub.chmod(0o755)
    args = tmp_path / "args"
    demos = tmp_path / "demos.jsonl"
    demos.write_text("")
    runs = tmp_path / "runs"
    env = {**os.environ, "LEGO": str(stub), "STUB_ARGS": str(args), "STUB_EXIT_SFT": str(sft_exit),
           "STUB_EXIT_GRPO": str(grpo_exit), "DEMOS": str(demos), "RUNS": str(runs)}
    proc = subprocess.run([str(REPO / "scripts" / "run_main_job.sh"), "--steps", "3"], env=env, check=False,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == script_exit, proc.stderr
    lines = args.read_text().splitlines()
    assert len(lines) == calls
    assert lines[0] == f"train -c lego.toml --sft {demos} --run-root {runs}/sft"
    if calls == 2:
        assert lines[1] == (f"train -c lego.toml --run-root {runs}/grpo --set model.checkpoint=\"{runs}/sft/"
                            "checkpoints/step-000007\" --steps 3")
    if script_exit == 0:
        assert "main job: trained" in proc.stderr
    else:
        assert "FAILED" in proc.stderr
