import pytest

from lego_rl.errors import GraderError
from lego_rl.swe.testresults import TestRun
from lego_rl.swe.verdict import judge_baseline, judge_named, judge_tests, parse_parser_output


def test_every_required_test_must_pass() -> None:
    statuses = parse_parser_output('{"tests": [{"name": "a", "status": "PASSED"}, {"name": "b", "status": "FAILED"}]}')
    assert judge_tests(statuses, ["a"], []).solved
    v = judge_tests(statuses, ["a"], ["b", "c"])
    assert not v.solved and v.failing == ["b: FAILED", "c: MISSING"]


def test_a_test_reported_twice_passes_only_if_every_report_passed() -> None:
    raw = '{"tests": [{"name": "a", "status": "FAILED"}, {"name": "a", "status": "PASSED"}]}'
    assert parse_parser_output(raw) == {"a": "FAILED"}


@pytest.mark.parametrize("raw", ["not json", "[]", '{"tests": {}}', '{"tests": [{"name": 1, "status": "PASSED"}]}'])
def test_malformed_parser_output_is_a_grader_error(raw: str) -> None:
    with pytest.raises(GraderError):
        parse_parser_output(raw)


def _run(statuses: dict[str, str], collection_errors: list[str] | None = None,
         problems: list[str] | None = None) -> TestRun:
    return TestRun("pytest-junit", dict(statuses), list(collection_errors or []), list(problems or []))


BASE = _run({"f1": "FAILED", "f2": "ERROR", "p": "PASSED", "s": "SKIPPED"})


def test_baseline_verdict_needs_fixed_failures_and_no_regression() -> None:
    fixed = {"f1": "PASSED", "f2": "PASSED", "p": "PASSED", "s": "SKIPPED"}
    assert judge_baseline(_run({**fixed, "new": "PASSED"}), BASE).solved
    v = judge_baseline(_run({"f1": "PASSED", "f2": "FAILED", "s": "PASSED"}), BASE)
    assert not v.solved
    assert v.failing == ["f2: FAILED (was ERROR at baseline)", "p: MISSING (was PASSED at baseline)"]
    # a skipped expected test, a new failing test and a module that does not import all fail
    v = judge_baseline(_run({**fixed, "f1": "SKIPPED", "n": "ERROR"}, ["m"]), BASE)
    assert v.failing == [
        "f1: SKIPPED (was FAILED at baseline)", "n: ERROR (new test)", "m: does not import (collection error)"
    ]


def test_baseline_with_only_import_failures_needs_a_newly_passing_test() -> None:
    base = _run({"p": "PASSED"}, ["tests/test_new.py"])
    assert judge_baseline(_run({"p": "PASSED", "tests/test_new.py::t": "PASSED"}), base).solved
    v = judge_baseline(_run({"p": "PASSED"}), base)  # the module's tests never showed up
    assert not v.solved and v.failing == ["no test that failed at baseline passes now"]
    # a task whose baseline already passes is solved by anything that breaks nothing (tasks check flags it)
    assert judge_baseline(_run({"p": "PASSED"}), _run({"p": "PASSED"})).solved


def test_no_results_or_an_untrustworthy_report_is_never_a_pass() -> None:
    assert judge_baseline(_run({}), _run({})).failing == ["no per-test results were reported"]
    assert not judge_named(_run({}), ["a"], []).solved
    v = judge_named(_run({"a": "PASSED"}, problems=["forged"]), ["a"], [])
    assert not v.solved and v.failing == ["untrustworthy report: forged"]
    assert judge_named(_run({"a": "PASSED", "b": "PASSED"}), ["a"], ["b"]).solved
    assert judge_named(_run({"a": "PASSED", "b": "SKIPPED"}), ["a"], ["b"]).failing == ["b: SKIPPED"]
