import pytest

from lego_rl.errors import GraderError
from lego_rl.swe.verdict import judge_tests, parse_parser_output


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
