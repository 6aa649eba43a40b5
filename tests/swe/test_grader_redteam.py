"""The red-team suite: every hack in tests/swe/redteam scores 0 and the honest fixes score 1.

Each hack is graded in real bwrap sandboxes against real pytest and real unittest, for a row that
names its tests (fail-to-pass/pass-to-pass) and for one that does not (judged against a baseline
run). Adding a hack is adding one patch file (tests/swe/redteam/README.md).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
from redteam_task import HACKS, RUNNERS, Hack, build_image, load_hacks, meta
from swe_data import require_setup

from lego_rl.sandbox.base import ImageSpec, Sandbox
from lego_rl.sandbox.factory import create_sandbox
from lego_rl.swe.grader import BaselineCache, grade

Opener = Callable[[], AbstractAsyncContextManager[Sandbox]]
ALL = load_hacks()
# The hacks the issue lists (each published against a grader like ours); the suite must keep them all.
REQUIRED = {
    "conftest_os_exit",
    "conftest_makereport",
    "conftest_sessionfinish",
    "forged_passed_lines",
    "planted_test_file",
    "syntax_error",
    "helper_sys_exit",
    "delete_tests",
    "module_pytest_skip",
    "monkeypatch_assert",
    "pth_file",
    "shadow_unittest",
    "honest_fix",
    # issue 26, classes 1, 2, 4, 5 and 7 (the verdict channel, canaries, late processes, sabotage of grading,
    # attacks on the new runner itself): each earned reward 1, or a grader error, on the grader before it
    "channel_atexit_report",
    "channel_pytest_plugin",
    "channel_unittest_result",
    "canary_oracle_frame",
    "canary_oracle_source",
    "canary_error_spared",
    "daemon_report_writer",
    "daemon_detached_writer",
    "block_official_patch",
    "report_nested_json",
    "channel_flood",
    "result_instance_patch",
    "trace_rewrites_locals",
    # class 7 (issue 26, round 4): an attack on how the integrity check compares, not on what it compares
    "identity_reuse",
    "honest_fix_new_module_with_tests",
    "honest_fix_with_runtime_effects",
}
CASES = [
    pytest.param(h, r, named, id=f"{h.name}-{r}-{'named' if named else 'baseline'}")
    for h in ALL
    for r in h.runners
    for named in (True, False)
]


def test_hack_files_are_well_formed_and_cover_the_published_hacks(tmp_path: Path) -> None:
    assert REQUIRED <= {h.name for h in ALL}
    assert {h.name for h in ALL if h.expect == 1.0} >= {"honest_fix"}
    bad = tmp_path / "bad.patch"
    bad.write_text("# expect: maybe\n# hack: x\ndiff --git a/x b/x\n")
    with pytest.raises(ValueError, match="expect 0 or 1"):
        Hack.load(bad)
    bad.write_text("expect: 0\ndiff --git a/x b/x\n")
    with pytest.raises(ValueError, match="is not '# key: value'"):
        Hack.load(bad)
    assert HACKS.is_dir() and set(RUNNERS) == {"pytest", "unittest"}


@pytest.fixture(scope="module")
def redteam_image() -> Iterator[ImageSpec]:
    require_setup("bwrap")
    base = Path(tempfile.mkdtemp(prefix="lego-redteam-image-", dir="/var/tmp"))
    base.chmod(0o755)
    try:
        yield build_image(base / "rootfs")
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def baselines() -> BaselineCache:
    """One cache for the module: each (runner, baseline row) runs its baseline once, as in training."""
    return BaselineCache()


@pytest.mark.slow
@pytest.mark.parametrize(("hack", "runner", "named"), CASES)
async def test_hack_scores_its_expected_verdict(
    hack: Hack, runner: str, named: bool, redteam_image: ImageSpec, baselines: BaselineCache
) -> None:
    row = meta(runner, named=named)
    res = await grade(
        row,
        hack.patch,
        open_sandbox=lambda: create_sandbox(redteam_image, provider="bwrap"),
        timeout=120,
        baselines=baselines,
    )
    assert res.apply_method not in (None, "empty"), (
        res.output
    )  # every hack applies: the verdict must catch it
    assert res.reward == hack.expect, (
        f"{hack.name} ({hack.what}) scored {res.reward}: {res.reason}\n{res.output}"
    )
    if hack.label == "grading_blocked":  # no test ran to completion, or none was read: no per-test verdict
        assert res.reason.startswith("grading blocked") and "NOT SOLVED (grading_blocked)" in res.output, res.output
    else:
        assert res.verdict_source == ("named tests" if named else "baseline")
        assert "===== per-test results" in res.output and "===== verdict" in res.output
    if hack.label is not None:
        assert getattr(res, "label", None) == hack.label, (hack.name, res.reason, res.output)
    if hack.expect == 1.0:
        # an honest fix carries no policy label (a real __eq__ is not a suspect construct)
        assert getattr(res, "label", None) is None and not getattr(res, "suspects", []), res.output
        r = RUNNERS[runner]
        assert all(res.tests[name] == "PASSED" for name in (*r.fail_to_pass, *r.pass_to_pass)), res.tests


@pytest.mark.slow
async def test_a_repository_that_stops_at_the_first_failure_still_grades(redteam_image: ImageSpec) -> None:
    """The repository's own pytest.ini has ``addopts = -x``: the grader's ``--maxfail`` comes after it, so a
    canary that fails does not end the run before the official tests, and disabled assertions are caught."""
    hacks = {h.name: h for h in ALL}
    row = meta("pytest", named=True).model_copy(
        update={"pre_commands": ["printf '[pytest]\\naddopts = -x\\n' > pytest.ini"]}
    )
    opener = lambda: create_sandbox(redteam_image, provider="bwrap")
    honest = await grade(row, hacks["honest_fix"].patch, open_sandbox=opener, timeout=120)
    assert honest.reward == 1.0, honest.output
    assert "-x" in honest.output and "===== per-test results" in honest.output
    cheat = await grade(row, hacks["monkeypatch_assert"].patch, open_sandbox=opener, timeout=120)
    # the run's own evidence is in the log; the label is suspect_patch, which also names the patch
    assert cheat.reward == 0.0 and cheat.label in ("tampered", "suspect_patch")
    assert "unittest.case.TestCase.assertEqual was replaced" in cheat.output
    assert "--maxfail=2147483647" in honest.output or "none planted" in honest.output
