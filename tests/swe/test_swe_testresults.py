"""Per-test reports: pytest's junit XML and the grader's unittest report, read as the grader reads them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lego_rl.swe.testresults import (
    UNITTEST_MAIN,
    detect_runner,
    format_results,
    parse_junit,
    parse_unittest_report,
    stops_early,
    unittest_command,
)

TESTS = """import unittest

import pytest


class CalcTest(unittest.TestCase):
    def test_ok(self):
        pass

    def test_bad(self):
        self.assertEqual(1, 2)

    @unittest.expectedFailure
    def test_xfail(self):
        self.assertEqual(1, 2)

    def test_sub(self):
        for i in range(2):
            with self.subTest(i=i):
                self.assertEqual(i, 0)


def test_fn():
    pass


@pytest.mark.parametrize("x", [1, "a b"])
def test_param(x):
    pass


def test_skip():
    pytest.skip("no")
"""


@pytest.mark.parametrize(
    ("cmd", "runner"),
    [
        ("python -m pytest -q tests", "pytest"),
        ("cd x && py.test -k y", "pytest"),
        ("pytest", "pytest"),
        ("python3 -m unittest discover -s tests -v", "unittest"),
        ("python -m unittest tests.test_x", "unittest"),
        ("python3 tests/test_calc.py", "none"),
        ("tox -e py", "none"),
        ("echo pytest-like", "none"),
    ],
)
def test_runner_is_decided_from_the_command(cmd: str, runner: str) -> None:
    assert detect_runner(cmd) == runner


def test_stop_early_flags() -> None:
    assert (
        stops_early("pytest -x tests")
        and stops_early("python -m unittest -f")
        and stops_early("pytest --maxfail=2")
    )
    assert not stops_early("pytest -q tests") and not stops_early("pytest -k 'x or y'")


def _run_pytest(tmp_path: Path, files: dict[str, str]) -> bytes:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:asyncio",
            f"--junitxml={tmp_path}/junit.xml",
            "-o",
            "junit_family=xunit1",
            "tests",
        ],
        cwd=tmp_path,
        capture_output=True,
        check=False,  # failing tests are the point
    )
    return (tmp_path / "junit.xml").read_bytes()


def test_junit_from_real_pytest_gives_node_ids_and_statuses(tmp_path: Path) -> None:
    run = parse_junit(_run_pytest(tmp_path, {"tests/test_a.py": TESTS}))
    assert run.statuses == {
        "tests/test_a.py::CalcTest::test_ok": "PASSED",
        "tests/test_a.py::CalcTest::test_bad": "FAILED",
        "tests/test_a.py::CalcTest::test_xfail": "XFAIL",
        "tests/test_a.py::CalcTest::test_sub": "FAILED",
        "tests/test_a.py::test_fn": "PASSED",
        "tests/test_a.py::test_param[1]": "PASSED",
        "tests/test_a.py::test_param[a b]": "PASSED",
        "tests/test_a.py::test_skip": "SKIPPED",
    }
    assert run.problems == [] and run.collection_errors == []
    assert "FAILED   tests/test_a.py::CalcTest::test_bad" in format_results(run)


def test_junit_collection_error_is_not_a_test(tmp_path: Path) -> None:
    run = parse_junit(_run_pytest(tmp_path, {"tests/test_a.py": TESTS, "tests/test_b.py": "def f(:\n"}))
    assert run.collection_errors == ["tests/test_b.py"] and run.statuses == {}  # pytest stops: nothing ran
    assert "COLLECT  tests/test_b.py" in format_results(run)


def test_junit_duplicates_keep_the_worst_and_garbage_is_a_problem() -> None:
    xml = (
        b'<testsuites><testsuite><testcase classname="t" name="a"/><testcase classname="t" name="a">'
        b'<failure message="x"/></testcase><testcase classname="t" name="a"/></testsuite></testsuites>'
    )
    assert parse_junit(xml).statuses == {"t::a": "FAILED"}
    assert parse_junit(b"<testsuites>").problems[0].startswith("the junit XML does not parse")
    assert format_results(parse_junit(b"<testsuites/>")) == "(no per-test results)"


def test_unittest_main_reports_each_test_and_replaces_only_the_module(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text(
        TESTS.replace("import pytest\n", "").split("\n\ndef test_fn")[0]
    )
    (tmp_path / "tests" / "test_broken.py").write_text("import nope_not_a_module\n")
    (tmp_path / "unittest.py").write_text("raise SystemExit(0)\n")  # a shadow in the working directory
    (tmp_path / "grader").mkdir()
    main = tmp_path / "grader" / "main.py"  # never in the working directory (its directory is sys.path[0])
    main.write_text(UNITTEST_MAIN.format(report=str(tmp_path / "grader" / "report.json")))
    cmd = unittest_command(f"{sys.executable} -m unittest discover -s tests -v", str(main))
    assert cmd == f"{sys.executable} {main} discover -s tests -v"
    (tmp_path / "work").mkdir()
    for name in ("tests", "unittest.py"):
        (tmp_path / name).rename(tmp_path / "work" / name)
    proc = subprocess.run(cmd.split(), cwd=tmp_path / "work", capture_output=True, text=True, check=False)
    assert (
        proc.returncode == 1 and "test_ok (test_a.CalcTest.test_ok) ... ok" in proc.stderr
    )  # output unchanged
    run = parse_unittest_report((tmp_path / "grader" / "report.json").read_bytes())
    assert run.statuses == {
        "test_a.CalcTest.test_ok": "PASSED",
        "test_a.CalcTest.test_bad": "FAILED",
        "test_a.CalcTest.test_xfail": "XFAIL",
        "test_a.CalcTest.test_sub": "FAILED",
    }
    assert run.collection_errors == ["test_broken"] and run.problems == []


@pytest.mark.parametrize(
    "raw", [b"nope", b"{}", b'{"tests": [{"name": "a", "status": "GREAT"}]}', b'{"tests": [1]}']
)
def test_malformed_unittest_report_is_a_problem(raw: bytes) -> None:
    assert parse_unittest_report(raw).problems
    assert not parse_unittest_report(
        json.dumps({"tests": [{"name": "a", "status": "PASSED"}]}).encode()
    ).problems
