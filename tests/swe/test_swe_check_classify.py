"""classify_baseline on the output real runners print (pytest, unittest, shells), no sandbox."""

from __future__ import annotations

import pytest

from lego_rl.swe.check import classify_baseline
from lego_rl.swe.grader import GradeResult


def _eval(cmd: str, code: int, stdout: str = "", stderr: str = "") -> GradeResult:
    log = (f"===== reset official test paths to HEAD: exit 0 (0.01 s)\n$ git checkout\n"
           f"===== eval as root: exit {code} (1.20 s)\n$ {cmd}\n{stdout}\n--- stderr\n{stderr}\n")
    return GradeResult(0.0, False, f"tests failed (exit {code})", output=log, eval_exit_code=code)


PYTEST_FAILED = """============================= test session starts ==============================
collected 3 items

tests/test_calc.py .F.                                                   [100%]

=================================== FAILURES ===================================
___________________________________ test_add ___________________________________
E       assert -1 == 5
=========================== short test summary info ============================
FAILED tests/test_calc.py::test_add - assert -1 == 5
========================= 1 failed, 2 passed in 0.05s =========================="""

PYTEST_NOT_FOUND = """============================= test session starts ==============================
collected 0 items

============================ no tests ran in 0.01s =============================
ERROR: file or directory not found: tests/test_missing.py
"""

PYTEST_IMPORT = """collected 0 items / 1 error

==================================== ERRORS ====================================
_____________________ ERROR collecting tests/test_calc.py ______________________
ImportError while importing test module '/testbed/tests/test_calc.py'.
E   ModuleNotFoundError: No module named 'calc.fast'
=========================== short test summary info ============================
ERROR tests/test_calc.py
!!!!!!!!!!!!!!!!!!!! Interrupted: 1 error during collection !!!!!!!!!!!!!!!!!!!!
=============================== 1 error in 0.09s ==============================="""

UNITTEST_IMPORT = """E
======================================================================
ERROR: test_missing (unittest.loader._FailedTest.test_missing)
----------------------------------------------------------------------
ImportError: Failed to import test module: test_missing
Traceback (most recent call last):
ModuleNotFoundError: No module named 'tests.test_missing'

----------------------------------------------------------------------
Ran 1 test in 0.000s

FAILED (errors=1)"""


@pytest.mark.parametrize(("result", "kind", "evidence"), [
    (_eval("pytest tests", 1, PYTEST_FAILED), "tests failed", "exit 1"),
    (_eval("pytest tests/test_missing.py", 4, PYTEST_NOT_FOUND), "collection error", "file or directory not found"),
    (_eval("pytest tests", 5, "collected 0 items\n\n== no tests ran in 0.01s =="), "collection error", "exit 5"),
    (_eval("pytest tests", 2, PYTEST_IMPORT), "collection error", "ERROR collecting"),
    (_eval("python -m unittest tests.test_missing", 1, stderr=UNITTEST_IMPORT), "collection error",
     "Failed to import test module"),
    (_eval("tox -e py", 127, stderr="bash: line 1: tox: command not found"), "command not found", "exit 127"),
    (_eval("python -m pytest", 1, stderr="/usr/bin/python: No module named pytest"), "command not found",
     "No module named pytest"),
    (_eval("./run_tests.sh", 126, stderr="bash: ./run_tests.sh: Permission denied"), "command not found", "exit 126"),
    (_eval("python3 tests/test_x.py", 2, stderr="python3: can't open file '/testbed/tests/test_x.py': [Errno 2]"),
     "collection error", "can't open file"),
    (_eval("python3 tests/test_x.py", 1, stderr="AssertionError: add(2, 3) returned -1"), "tests failed", "exit 1"),
])
def test_baseline_kinds(result: GradeResult, kind: str, evidence: str) -> None:
    got, why = classify_baseline(result)
    assert (got, evidence in why) == (kind, True), why


def test_a_missing_module_the_tests_import_is_not_a_missing_runner() -> None:
    """`No module named 'pytest_foo'` (a plugin) or `'pytest.x'` is not pytest itself being absent."""
    res = _eval("pytest", 1, stderr="ModuleNotFoundError: No module named 'pytestqt'")
    assert classify_baseline(res)[0] == "tests failed"


def test_timeout_and_passing_and_per_test_reports() -> None:
    assert classify_baseline(GradeResult(0.0, False, "tests timed out after 8 s", timed_out=True))[0] == "timeout"
    assert classify_baseline(GradeResult(1.0, True, "tests passed", eval_exit_code=0))[0] == "passes"
    empty = GradeResult(0.0, False, "not passed: t1: MISSING", output="===== run_script: exit 0 (1 s)\n")
    assert classify_baseline(empty, per_test=True) == ("collection error", "no test was reported")
    ran = GradeResult(0.0, False, "not passed: t1: FAILED", tests={"t1": "FAILED"})
    assert classify_baseline(ran, per_test=True)[0] == "tests failed"
