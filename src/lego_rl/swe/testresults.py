"""Per-test results from a test runner's own report, and which runner an eval command drives.

The grader takes its verdict from these results, never from the eval command's exit status (a
``conftest.py`` holding ``os._exit(0)`` makes that status 0 without running a test). Two runners
report per test here:

* **pytest**: the grader injects ``--junitxml=<random path>`` through ``PYTEST_ADDOPTS`` and reads the
  XML pytest writes at the end of the session. Test names are pytest node ids
  (``tests/test_x.py::Class::test_y[param]``), the form SWE-bench-style rows use. Printed ``PASSED``
  lines are never read, so forging them on stdout changes nothing.
* **unittest** (``python -m unittest ...``): the grader runs ``UNITTEST_MAIN`` in its place, unittest's
  own main with a result class that writes a JSON report after the last test. Names are test ids
  (``test_x.Class.test_y``). Text on stdout/stderr is never read, so forged result lines change
  nothing, and a run ended early (``os._exit``) writes no report.

A module that fails to import is reported as a *collection error* (pytest's ``collection failure``,
unittest's ``_FailedTest``), kept apart from tests: it is never a test that could pass, only a reason
the expected tests are missing.

Statuses use the SWE-bench Pro parser's vocabulary: ``PASSED``, ``FAILED``, ``ERROR``, ``SKIPPED``,
plus ``XFAIL`` (an expected failure is not a pass).
"""

from __future__ import annotations

import json
import re
import shlex
import xml.etree.ElementTree as ET
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
    """``pytest-junit``, ``unittest-report`` or ``swepro-parser``."""
    statuses: dict[str, str] = field(default_factory=dict)
    """Test name -> status; a test reported twice keeps its worst report."""
    collection_errors: list[str] = field(default_factory=list)
    """Modules that could not be collected/imported (not tests; their tests are missing)."""
    problems: list[str] = field(default_factory=list)
    """Why this report cannot be trusted as a whole (empty when it can)."""


def _merge(statuses: dict[str, str], name: str, status: str) -> None:
    # A test reported twice counts as passed only if every report passed (a rerun flaky failure,
    # or a forged second report, never upgrades a failure).
    prev = statuses.get(name)
    statuses[name] = status if prev in (None, PASSED) else prev


def _junit_node_id(classname: str, name: str, file: str | None) -> str:
    """pytest's node id back from junit's (classname, name, file): ``tests.test_x.C`` + ``test_y`` +
    ``tests/test_x.py`` -> ``tests/test_x.py::C::test_y``."""
    if file and file.endswith(".py"):
        module = file[:-3].replace("/", ".")
        if classname == module:
            return f"{file}::{name}"
        if classname.startswith(module + "."):
            return f"{file}::{classname[len(module) + 1 :].replace('.', '::')}::{name}"
    return f"{classname}::{name}" if classname else name


def parse_junit(raw: bytes) -> TestRun:
    """pytest's junit XML (``junit_family=xunit1``, which records each test's file) -> ``TestRun``."""
    run = TestRun("pytest-junit")
    try:
        root = ET.fromstring(raw)
    except ET.ParseError as exc:
        run.problems.append(f"the junit XML does not parse: {exc}")
        return run
    for case in root.iter("testcase"):
        classname, name, file = case.get("classname", ""), case.get("name", ""), case.get("file")
        kids = {child.tag: child for child in case}
        error = kids.get("error")
        if error is not None and not classname and error.get("message", "").startswith("collection failure"):
            run.collection_errors.append(file or name)
            continue
        if error is not None:
            status = ERROR
        elif "failure" in kids:
            status = FAILED
        elif "skipped" in kids:
            status = XFAIL if kids["skipped"].get("type") == "pytest.xfail" else SKIPPED
        else:
            status = PASSED
        _merge(run.statuses, _junit_node_id(classname, name, file), status)
    return run


UNITTEST_MAIN = '''"""lego-rl grader: ``python -m unittest`` plus a per-test report at the end of the run."""
# Imported before the working directory joins sys.path: a unittest.py there cannot replace these.
import json, os, sys, unittest

REPORT = {report!r}


class _Result(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.per_test = {{}}

    def _put(self, test, status):
        prev = self.per_test.get(test.id())
        self.per_test[test.id()] = status if prev in (None, "PASSED") else prev

    def addSuccess(self, test):
        super().addSuccess(test)
        self._put(test, "PASSED")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._put(test, "FAILED")

    def addError(self, test, err):
        super().addError(test, err)
        self._put(test, "ERROR")

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._put(test, "SKIPPED")

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._put(test, "XFAIL")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._put(test, "FAILED")

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            self._put(test, "FAILED" if issubclass(err[0], test.failureException) else "ERROR")


class _Runner(unittest.TextTestRunner):
    resultclass = _Result


sys.argv[0] = "python -m unittest"
sys.path[0] = os.getcwd()  # what python -m puts there (this file's directory must not be importable)
prog = unittest.main(module=None, testRunner=_Runner, exit=False)
with open(REPORT + ".tmp", "w") as fh:
    json.dump({{"tests": [{{"name": n, "status": s}} for n, s in prog.result.per_test.items()]}}, fh)
os.replace(REPORT + ".tmp", REPORT)
sys.exit(not prog.result.wasSuccessful())
'''
"""Runs in the sandbox in place of ``python -m unittest``: the same arguments, the same output, plus a
JSON report (the SWE-bench Pro parser's shape) written after the last test, at a path only the grader
knows in advance."""

_FAILED_IMPORT = ("unittest.loader._FailedTest.", "unittest.loader.ModuleImportFailure.")


def unittest_command(cmd: str, main_path: str) -> str:
    """``cmd`` with ``-m unittest`` replaced by the reporting main at ``main_path``."""
    return _UNITTEST.sub(lambda _m: main_path, cmd)


def parse_unittest_report(raw: bytes) -> TestRun:
    """The JSON report ``UNITTEST_MAIN`` wrote -> ``TestRun`` (import failures become collection errors)."""
    run = TestRun("unittest-report")
    try:
        data = json.loads(raw)
        tests = data["tests"]
        entries = [(t["name"], t["status"]) for t in tests]
    except (ValueError, KeyError, TypeError) as exc:
        run.problems.append(f"the unittest report is malformed: {exc}")
        return run
    for name, status in entries:
        if not isinstance(name, str) or status not in (PASSED, FAILED, ERROR, SKIPPED, XFAIL):
            run.problems.append(f"the unittest report has a malformed entry: {name!r}: {status!r}")
        elif name.startswith(_FAILED_IMPORT):
            run.collection_errors.append(name.split(".", 3)[-1])
        else:
            _merge(run.statuses, name, status)
    return run


def format_results(run: TestRun, *, hide: frozenset[str] = frozenset()) -> str:
    """Per-test outcomes for the grader log, one per line, sorted by name."""
    lines = [f"{status:8} {name}" for name, status in sorted(run.statuses.items()) if name not in hide]
    lines += [f"{'COLLECT':8} {name} (collection/import error)" for name in run.collection_errors]
    lines += [f"PROBLEM  {p}" for p in run.problems]
    return "\n".join(lines) if lines else "(no per-test results)"
