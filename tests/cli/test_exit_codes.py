"""rollout-check's exit codes tell "ran, no reward" apart from "only infrastructure failures" and "nothing
rolled out" (scripts/run_main_job.sh, now a training job, is tested in test_main_job.py)."""

from __future__ import annotations

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
