"""rollout-check's exit codes tell "ran, no reward" apart from "only infrastructure failures" and "nothing
rolled out", and scripts/run_main_job.sh accepts only the first."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from lego_rl.cli.console import EXIT_FAILED, EXIT_INFRA, EXIT_OK, EXIT_USAGE
from lego_rl.cli.rollout_cmd import EXIT_NOTHING_RAN, exit_code
from lego_rl.rollout.generate import RolloutResult
from lego_rl.termination import TerminationReason as T

REPO = Path(__file__).resolve().parents[2]


def _res(termination: T, reward: float | None) -> RolloutResult:
    return RolloutResult(rollout_id="r", instance_id="t", harness="codex", termination=termination, reward=reward,
                         samples=[], timings={}, artifacts=None)


@pytest.mark.parametrize(("results", "code"), [
    ([_res(T.COMPLETED, 1.0), _res(T.SANDBOX_SETUP, None)], EXIT_OK),
    ([_res(T.COMPLETED, 0.0), _res(T.TURN_LIMIT, 0.0)], EXIT_FAILED),
    ([_res(T.COMPLETED, 0.0), _res(T.HARNESS_INSTALL, None)], EXIT_FAILED),  # one policy outcome is enough
    ([_res(T.HARNESS_INSTALL, None), _res(T.ADAPTER_ERROR, None)], EXIT_INFRA),
    ([_res(T.INTERNAL_ERROR, None)], EXIT_INFRA),
], ids=["rewarded", "ran-no-reward", "mixed", "all-infra", "internal-error"])
def test_exit_code_of_finished_rollouts(results: list[RolloutResult], code: int) -> None:
    assert exit_code(results) == code


def test_exit_codes_are_distinct_and_documented() -> None:
    from typer.testing import CliRunner

    from lego_rl.cli.main import app

    codes = [EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INFRA, EXIT_NOTHING_RAN]
    assert len(set(codes)) == len(codes)
    help_text = CliRunner().invoke(app, ["rollout-check", "--help"], env={"COLUMNS": "1000"}).stdout
    docs = (REPO / "docs" / "configuration.md").read_text()
    section = docs[docs.index("## Exit codes of `lego rollout-check`"):]
    for code in codes:
        assert f"\n {code}  " in help_text, code
        assert f"\n| {code} |" in section, code


STUB = """#!/usr/bin/env bash
# TEST DOUBLE for the `lego` executable: records its arguments and exits with $STUB_EXIT.
printf '%s\\n' "$@" > "$STUB_ARGS"
exit "$STUB_EXIT"
"""


@pytest.mark.root  # the script runs the job in a network namespace (unshare -n)
@pytest.mark.parametrize(("lego_exit", "script_exit"), [
    (EXIT_OK, 0), (EXIT_FAILED, 0), (EXIT_USAGE, EXIT_USAGE), (EXIT_INFRA, EXIT_INFRA),
    (EXIT_NOTHING_RAN, EXIT_NOTHING_RAN),
], ids=["rewarded", "ran-no-reward-accepted", "usage", "all-infra-refused", "nothing-rolled-out-refused"])
def test_main_job_script_accepts_only_ran_without_reward(tmp_path: Path, lego_exit: int, script_exit: int) -> None:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) for the loopback-only namespace")
    stub = tmp_path / "lego_test_double"
    stub.write_text(STUB)
    stub.chmod(0o755)
    args = tmp_path / "args"
    env = {**os.environ, "LEGO": str(stub), "STUB_EXIT": str(lego_exit), "STUB_ARGS": str(args)}
    proc = subprocess.run([str(REPO / "scripts" / "run_main_job.sh"), "--ids", "a b"], env=env, check=False,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == script_exit, proc.stderr
    assert args.read_text().splitlines() == ["rollout-check", "-c", "lego.toml", "--baseline", "--ids", "a b"]
    if lego_exit == EXIT_FAILED:
        assert "none solved its task" in proc.stderr
    if lego_exit in (EXIT_INFRA, EXIT_NOTHING_RAN):
        assert "FAILED" in proc.stderr
