"""Which files the grader resets after the agent patch (pure planning; the sandbox steps run in the
grader and red-team tests)."""

from __future__ import annotations

import pytest

from lego_rl.swe.testinfra import base_infra, changes_test_config, command_files, plan_reset

BASE = {
    "calc/__init__.py",
    "calc/ops.py",
    "tests/conftest.py",
    "tests/test_mul.py",
    "setup.cfg",
    "tox.ini",
    "run_tests.sh",
    "pkg/__init__.py",
    "pkg/unittest.py",
    ".venv/lib/python3.11/site-packages/easy.pth",
}


def test_always_reset_files_are_restored_or_removed_at_any_depth() -> None:
    now = (BASE - {"tests/conftest.py"}) | {
        "conftest.py",
        "deep/er/conftest.py",
        "pytest.ini",
        "x/.pytest.ini",
        "sitecustomize.py",
        "lib/usercustomize.py",
        "site/zz.pth",
        "src/calc.egg-info/entry_points.txt",
    }
    plan = plan_reset(BASE, now, "bash run_tests.sh")
    assert set(plan.remove) == {
        "conftest.py",
        "deep/er/conftest.py",
        "pytest.ini",
        "x/.pytest.ini",
        "sitecustomize.py",
        "lib/usercustomize.py",
        "site/zz.pth",
        "src/calc.egg-info/entry_points.txt",
    }
    # base infrastructure is restored even when the agent deleted it (tests/conftest.py)
    assert set(plan.restore) == {
        "tests/conftest.py",
        "tox.ini",
        "run_tests.sh",
        ".venv/lib/python3.11/site-packages/easy.pth",
    }
    assert plan.compare == ["setup.cfg"]
    assert "calc/ops.py" not in plan.restore + plan.remove  # the fix itself is never touched


def test_runner_shadows_and_bytecode_are_removed_only_when_added_where_they_import_top_level() -> None:
    now = BASE | {
        "unittest.py",
        "pytest/__init__.py",
        "tests/inspect.py",
        "tests/__pycache__/test_add.cpython-311.pyc",
        "calc/parser.py",
        "calc/types.py",
        "docs/json/index.md",
        "calc/ops.cpython-311-x86_64-linux-gnu.so",
        "json/__init__.py",
        "tools/notes.txt",
    }
    plan = plan_reset(BASE, now, "python -m pytest")
    assert set(plan.remove) == {
        "unittest.py",
        "pytest/__init__.py",
        "tests/inspect.py",
        "json/__init__.py",
        "tests/__pycache__/test_add.cpython-311.pyc",
    }
    # pkg/unittest.py is the repository's own (in the base): edits to it may be the fix, so it stays
    assert "pkg/unittest.py" not in plan.remove + plan.restore


def test_base_infra_saves_every_reset_candidate() -> None:
    assert base_infra(BASE, "bash run_tests.sh") == [
        ".venv/lib/python3.11/site-packages/easy.pth",
        "run_tests.sh",
        "setup.cfg",
        "tests/conftest.py",
        "tox.ini",
    ]


@pytest.mark.parametrize(
    ("cmd", "files"),
    [
        ("bash run_tests.sh", {"run_tests.sh"}),
        ("./tests/runtests.py --parallel 1 admin_views", {"tests/runtests.py"}),
        ("make test", {"Makefile", "makefile", "GNUmakefile"}),
        ("python -m pytest calc.py tests/test_x.py", set()),  # source files named on the line may be the fix
        ("sh /abs/run.sh ../up/run.sh", set()),
        ("pytest 'unbalanced", set()),
    ],
)
def test_command_files(cmd: str, files: set[str]) -> None:
    assert command_files(cmd) == files


def test_pyproject_and_setup_cfg_reset_only_when_their_test_sections_change() -> None:
    base = '[project]\nname = "calc"\n\n[tool.pytest.ini_options]\naddopts = "-q"\n'
    assert not changes_test_config("pyproject.toml", base, base.replace('"calc"', '"calc2"'))
    assert changes_test_config("pyproject.toml", base, base.replace('"-q"', '"--collect-only"'))
    # dotted keys and inline tables reach the same section: compared parsed, not as text
    assert changes_test_config(
        "pyproject.toml",
        '[project]\nname = "c"\n',
        '[project]\nname = "c"\n[tool]\npytest.ini_options.addopts = "--co"\n',
    )
    assert not changes_test_config("pyproject.toml", base, base + '\n[tool]\n"pytest.ini_options.x" = 1\n')
    assert changes_test_config(
        "pyproject.toml",
        '[project]\nname = "c"\n',
        '[project]\nname = "c"\n[tool]\npytest = {ini_options = {addopts = "--co"}}\n',
    )
    assert changes_test_config("pyproject.toml", base, "not = [toml")  # unparseable: nobody can vouch for it
    assert changes_test_config("pyproject.toml", None, '[tool.pytest.ini_options]\naddopts = "--co"\n')
    assert not changes_test_config("pyproject.toml", None, '[project]\nname = "c"\n')
    cfg = "[metadata]\nname = calc\n\n[tool:pytest]\naddopts = -q\n"
    assert not changes_test_config("setup.cfg", cfg, cfg.replace("name = calc", "name = calc2"))
    assert changes_test_config("setup.cfg", cfg, cfg + "\n[pytest]\naddopts = --co\n")
