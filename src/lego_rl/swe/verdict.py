"""Pure verdict helpers: per-test reports against the tests a row names, or against a baseline run.

Three ways a verdict is reached (docs/grading.md): the row names its tests (SWE-bench Pro's
fail-to-pass/pass-to-pass, or a row's ``fail_to_pass``/``pass_to_pass``) and each must be reported
``PASSED`` (``judge_named``/``judge_tests``); the row names none and the same run on the base tree
decides what must change (``judge_baseline``); or the runner reports nothing per test and the exit
status is all there is (decided in the grader, not here).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from lego_rl.errors import GraderError
from lego_rl.swe.testresults import ERROR, FAILED, PASSED, SKIPPED, TestRun


@dataclass(frozen=True)
class TestsVerdict:
    solved: bool
    statuses: dict[str, str] = field(default_factory=dict)
    failing: list[str] = field(default_factory=list)
    """Required tests (f2p or p2p) that were not reported PASSED, with their status or MISSING."""


def parse_parser_output(raw: bytes | str) -> dict[str, str]:
    """``{"tests": [{"name", "status"}]}`` -> name -> status; anything else is a ``GraderError``."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise GraderError(f"the SWE-bench Pro parser wrote invalid JSON: {exc}") from None
    tests = data.get("tests") if isinstance(data, dict) else None
    if not isinstance(tests, list):
        raise GraderError('the SWE-bench Pro parser output lacks a "tests" list')
    out: dict[str, str] = {}
    for t in tests:
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not isinstance(t.get("status"), str):
            raise GraderError(f"the SWE-bench Pro parser output has a malformed test entry: {str(t)[:120]}")
        # A test reported twice counts only if every report passed (a retried flaky failure stays a failure).
        prev = out.get(t["name"])
        out[t["name"]] = t["status"] if prev in (None, "PASSED") else prev
    return out


def judge_tests(statuses: dict[str, str], fail_to_pass: Sequence[str], pass_to_pass: Sequence[str]) -> TestsVerdict:
    """Solved only when every fail-to-pass and pass-to-pass test is reported ``PASSED``."""
    failing = [
        f"{name}: {statuses.get(name, 'MISSING')}"
        for name in [*fail_to_pass, *pass_to_pass]
        if statuses.get(name) != "PASSED"
    ]
    return TestsVerdict(solved=not failing, statuses=statuses, failing=failing)


def judge_named(run: TestRun, fail_to_pass: Sequence[str], pass_to_pass: Sequence[str]) -> TestsVerdict:
    """The row names its tests: every one must be reported ``PASSED`` by a report that can be trusted.

    A missing, skipped or expected-failure test is a failure; a report with problems (forged or
    missing unittest lines) or with no results at all is never a pass.
    """
    if run.problems:
        return TestsVerdict(False, run.statuses, [f"untrustworthy report: {p}" for p in run.problems])
    if not run.statuses:
        return TestsVerdict(False, run.statuses, ["no per-test results were reported"])
    return judge_tests(run.statuses, fail_to_pass, pass_to_pass)


def judge_baseline(run: TestRun, baseline: TestRun) -> TestsVerdict:
    """The row names no tests: the tests that failed at baseline now pass and no other test regresses.

    ``baseline`` is the same test run on the base tree with the official tests (no agent patch).
    Solved when the candidate's report is trustworthy and not empty, and

    * every test that passed at baseline passes (a missing one is a failure: deleting tests fails);
    * every test that failed or errored at baseline passes;
    * a test skipped at baseline passes or stays skipped;
    * no test (new ones included) failed or errored, and no module failed to import;
    * when the baseline had failures (including modules that failed to import there, whose tests
      only appear once the fix lands), at least one test passes that did not pass at baseline.
    """
    failing = [f"untrustworthy report: {p}" for p in run.problems]
    if not run.statuses and not failing:
        failing.append("no per-test results were reported")
    now, before = run.statuses, baseline.statuses
    for name, was in before.items():
        got = now.get(name, "MISSING")
        if got == PASSED or (was == SKIPPED and got == SKIPPED):
            continue
        failing.append(f"{name}: {got} (was {was} at baseline)")
    listed = set(before)
    failing += [f"{name}: {status} (new test)" for name, status in now.items()
                if name not in listed and status in (FAILED, ERROR)]
    failing += [f"{module}: does not import (collection error)" for module in run.collection_errors]
    had_failures = bool(baseline.collection_errors) or any(s not in (PASSED, SKIPPED) for s in before.values())
    newly_passing = any(s == PASSED and before.get(n) != PASSED for n, s in now.items())
    if had_failures and not failing and not newly_passing:
        failing.append("no test that failed at baseline passes now")
    return TestsVerdict(not failing, now, failing)
