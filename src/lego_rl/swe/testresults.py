"""Per-test results of a test run, and which runner an eval command drives.

The grader takes its verdict from per-test results, never from the eval command's exit status (a
``conftest.py`` holding ``os._exit(0)`` makes that status 0 without running a test). For pytest and
``python -m unittest`` the results come through the grader's own channel, one record per test as it
finishes (``swe/supervised.py`` and ``swe/insandbox``); printed ``PASSED`` lines are never read. Test names
are pytest node ids (``tests/test_x.py::Class::test_y[param]``) or unittest test ids
(``test_x.Class.test_y``), the forms SWE-bench-style rows use.

A module that fails to import is reported as a *collection error* (pytest's ``collection failure``,
unittest's ``_FailedTest``), kept apart from tests: it is never a test that could pass, only a reason
the expected tests are missing.

Statuses use the SWE-bench Pro parser's vocabulary: ``PASSED``, ``FAILED``, ``ERROR``, ``SKIPPED``,
plus ``XFAIL`` (an expected failure is not a pass).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Literal

PASSED, FAILED, ERROR, SKIPPED, XFAIL = "PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL"
RunnerKind = Literal["pytest", "unittest", "none"]

_PYTEST = re.compile(r"(?:^|[\s/;&|(`'\"])(?:py\.test|pytest)(?:\s|$|[;&|)`'\"])")
_UNITTEST = re.compile(r"-m\s+unittest(?=\s|$|[;&|)])")
_STOP_EARLY = re.compile(r"(?:^|\s)(?:-x|--exitfirst|--maxfail[= ]\S+|-f|--failfast|--sw|--stepwise)(?:\s|$)")


def detect_runner(cmd: str) -> RunnerKind:
    """The runner whose per-test report the grader can read for ``cmd``, decided from the command alone.

    Decided statically on purpose: if it depended on the output, a patch that garbled the output
    would switch the grader to a weaker verdict.
    """
    if _PYTEST.search(cmd):
        return "pytest"
    if _UNITTEST.search(cmd):
        return "unittest"
    return "none"


def stops_early(cmd: str) -> bool:
    """True when the command stops at the first failure (``-x``, ``--failfast``...): a canary test
    that must fail would end the run before the real tests, so none is planted then."""
    try:
        words = shlex.split(cmd)
    except ValueError:
        words = cmd.split()
    return bool(_STOP_EARLY.search(" " + " ".join(words) + " "))


@dataclass
class TestRun:
    """What one run of the tests reported, test by test."""

    __test__ = False  # not a pytest test class, whatever its name

    runner: str
    """``pytest-shim``, ``unittest-shim`` or ``swepro-parser``."""
    statuses: dict[str, str] = field(default_factory=dict)
    """Test name -> status; a test reported twice keeps its worst report."""
    collection_errors: list[str] = field(default_factory=list)
    """Modules that could not be collected/imported (not tests; their tests are missing)."""
    problems: list[str] = field(default_factory=list)
    """Why this report cannot be trusted as a whole (empty when it can)."""


def replace_unittest_module(cmd: str, main: str) -> str:
    """``cmd`` with ``-m unittest`` replaced by ``main`` (the grader's unittest shim, a quoted path)."""
    return _UNITTEST.sub(lambda _m: main, cmd)


def format_results(run: TestRun, *, hide: frozenset[str] = frozenset()) -> str:
    """Per-test outcomes for the grader log, one per line, sorted by name."""
    lines = [f"{status:8} {name}" for name, status in sorted(run.statuses.items()) if name not in hide]
    lines += [f"{'COLLECT':8} {name} (collection/import error)" for name in run.collection_errors]
    lines += [f"PROBLEM  {p}" for p in run.problems]
    return "\n".join(lines) if lines else "(no per-test results)"
