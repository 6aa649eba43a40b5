"""Which runner a command drives, and whether it stops early (the per-test records: test_swe_supervised.py)."""

from __future__ import annotations

import pytest

from lego_rl.swe.testresults import detect_runner, replace_unittest_module, stops_early

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


def test_only_the_unittest_module_is_replaced() -> None:
    assert replace_unittest_module("python -m unittest discover -s tests -v", "/g/main.py") == \
        "python /g/main.py discover -s tests -v"
    assert replace_unittest_module("python -m unittestx", "/g/main.py") == "python -m unittestx"
