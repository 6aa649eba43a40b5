"""Per-test results from a test runner's own report, and which runner an eval command drives.

The grader takes its verdict from these results, never from the eval command's exit status (a
``conftest.py`` holding ``os._exit(0)`` makes that status 0 without running a test). Two runners
report per test here:

* **pytest**: the grader injects ``--junitxml=<random path>`` through ``PYTEST_ADDOPTS`` and reads the
  XML pytest writes at the end of the session. Test names are pytest node ids
  (``tests/test_x.py::Class::test_y[param]``), the form SWE-bench-style rows use. Printed ``PASSED``
  lines are never read, so forging them on stdout changes nothing.
* **unittest** (``python -m unittest ... -v``): the verbose result lines on stderr
  (``test_y (pkg.mod.Class.test_y) ... ok``), cross-checked against unittest's own ``Ran N tests``
  summary: a forged result line makes the counts disagree, and a run that ended before the summary
  (``os._exit``) reports nothing usable.

A module that fails to import is reported as a *collection error* (pytest's ``collection failure``,
unittest's ``_FailedTest``), kept apart from tests: it is never a test that could pass, only a reason
the expected tests are missing.

Statuses use the SWE-bench Pro parser's vocabulary: ``PASSED``, ``FAILED``, ``ERROR``, ``SKIPPED``,
plus ``XFAIL`` (an expected failure is not a pass).
"""

from __future__ import annotations

import re
import shlex
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Literal

PASSED, FAILED, ERROR, SKIPPED, XFAIL = "PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL"
RunnerKind = Literal["pytest", "unittest", "none"]

_PYTEST = re.compile(r"(?:^|[\s/;&|(`'\"])(?:py\.test|pytest)(?:\s|$|[;&|)`'\"])")
_UNITTEST = re.compile(r"-m\s+unittest(?:\s|$)")
_VERBOSE = re.compile(r"(?:^|\s)(?:-v+|--verbose)(?:\s|$)")
_STOP_EARLY = re.compile(r"(?:^|\s)(?:-x|--exitfirst|--maxfail[= ]\S+|-f|--failfast|--sw|--stepwise)(?:\s|$)")


def detect_runner(cmd: str) -> RunnerKind:
    """The runner whose per-test report the grader can read for ``cmd``, decided from the command alone.

    Decided statically on purpose: if it depended on the output, a patch that garbled the output
    would switch the grader to a weaker verdict. ``unittest`` needs ``-v`` (only verbose output names
    each test); without it the command is ``none`` and graded by exit status (docs/grading.md).
    """
    if _PYTEST.search(cmd):
        return "pytest"
    if _UNITTEST.search(cmd) and _VERBOSE.search(cmd):
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
    """``pytest-junit``, ``unittest-verbose`` or ``swepro-parser``."""
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
            return f"{file}::{classname[len(module) + 1:].replace('.', '::')}::{name}"
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


_UT_HEAD = re.compile(r"^(?P<method>[A-Za-z_]\w*) \((?P<where>[A-Za-z_][\w.]*)\)(?P<rest>(?: \.\.\..*)?)$")
_UT_SUB = re.compile(r"^  (?P<method>[A-Za-z_]\w*) \((?P<where>[A-Za-z_][\w.]*)\) \(.*\) \.\.\. (?P<status>FAIL|ERROR|skipped(?: .*)?)$")
_UT_STATUS = re.compile(r"(?P<status>ok|FAIL|ERROR|skipped '.*'|expected failure|unexpected success)$")
_UT_RAN = re.compile(r"^Ran (?P<n>\d+) tests? in ")
_UT_WORDS = {"ok": PASSED, "FAIL": FAILED, "ERROR": ERROR, "expected failure": XFAIL, "unexpected success": FAILED}
_FAILED_IMPORT = ("unittest.loader._FailedTest.", "unittest.loader.ModuleImportFailure.")
_SEPARATOR = "=" * 70


def _ut_status(word: str) -> str:
    return SKIPPED if word.startswith("skipped") else _UT_WORDS[word]


def _ut_name(method: str, where: str) -> str:
    return where if where.endswith("." + method) else f"{where}.{method}"


def parse_unittest(stderr: str) -> TestRun:
    """unittest's verbose stderr -> ``TestRun``, checked against its ``Ran N tests`` line.

    Python 3.11+ prints ``test_y (mod.Class.test_y) ... ok``; older versions ``test_y (mod.Class)``.
    A test with a docstring puts ``docstring ... ok`` on the next line; a test's own stderr output
    sits between the name and the status, so the status is the *last* word of a later line. The real
    status always comes after anything a test prints, so a forged result line either ends up before
    the real status on the same line (ignored) or as a status line with no test waiting for it,
    which spoils the whole report (``problems``) rather than passing a test.
    """
    run = TestRun("unittest-verbose")
    pending: str | None = None
    sub_status: str | None = None  # worst subtest report of the pending test (3.11 prints no own status then)
    results = 0
    ran: int | None = None

    def resolve(status: str) -> None:
        nonlocal pending, sub_status, results
        assert pending is not None
        results += 1
        if pending.startswith(_FAILED_IMPORT):
            run.collection_errors.append(pending.split(".", 3)[-1])
        else:
            _merge(run.statuses, pending, status)
        pending, sub_status = None, None

    in_results = True
    for line in stderr.splitlines():
        line = line.rstrip("\r")
        m_ran = _UT_RAN.match(line)
        if m_ran:
            ran = int(m_ran["n"])  # the last summary wins
            in_results = False
            continue
        if not in_results:
            continue
        if line == _SEPARATOR:  # failure details follow: no more result lines
            in_results = False
            continue
        sub = _UT_SUB.match(line)
        if sub and pending == _ut_name(sub["method"], sub["where"]):
            word = _ut_status(sub["status"])
            sub_status = word if sub_status in (None, PASSED, SKIPPED) else sub_status
            continue
        head = _UT_HEAD.match(line)
        if head:
            if pending is not None:
                if sub_status is None:
                    run.problems.append(f"no result was printed for {pending}")
                    pending = None
                else:
                    resolve(sub_status)
            pending = _ut_name(head["method"], head["where"])
            line = head["rest"]
        status = _UT_STATUS.search(line)
        if status is None:
            continue
        if pending is None:
            run.problems.append(f"a result line belongs to no test: {line[-80:]!r}")
        else:
            resolve(_ut_status(status["status"]))
    if pending is not None:
        if sub_status is None:
            run.problems.append(f"no result was printed for {pending}")
        else:
            resolve(sub_status)
    if ran is None:
        run.problems.append("unittest printed no 'Ran N tests' summary (the run ended before unittest reported)")
    elif ran != results:
        run.problems.append(f"unittest says it ran {ran} tests but {results} results were printed")
    return run


def format_results(run: TestRun, *, hide: frozenset[str] = frozenset()) -> str:
    """Per-test outcomes for the grader log, one per line, sorted by name."""
    lines = [f"{status:8} {name}" for name, status in sorted(run.statuses.items()) if name not in hide]
    lines += [f"{'COLLECT':8} {name} (collection/import error)" for name in run.collection_errors]
    lines += [f"PROBLEM  {p}" for p in run.problems]
    return "\n".join(lines) if lines else "(no per-test results)"
