"""What the grader resets after the agent patch (pure planning over two listings; the sandbox steps run in
the grader, red-team and timing tests)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lego_rl.swe.testinfra import (
    LIST_CMD,
    PROBE_SCRIPT,
    InfraContext,
    Listing,
    Probe,
    changes_tool_config,
    command_files,
    interpreter_of,
    official_test_folders,
    parse_listing,
    plan_reset,
    saved_paths,
)

WD = "/testbed"
BASE_FILES = [
    "calc/__init__.py",
    "calc/ops.py",
    "calc/parser.py",
    "tests/conftest.py",
    "tests/helpers.py",
    "tests/test_mul.py",
    "setup.cfg",
    "pyproject.toml",
    "tox.ini",
    "run_tests.sh",
    "pkg/__init__.py",
    "pkg/unittest.py",
    "pkg/test_pkg.py",
    ".venv/pyvenv.cfg",
    ".venv/bin/python",
    ".venv/lib/python3.11/site-packages/easy.pth",
    ".venv/lib/python3.11/site-packages/real/__init__.py",
    "docs/json/index.md",
]
PROBE = Probe(
    prefix=f"{WD}/.venv",
    wd=WD,
    path=(
        ("/usr/lib/python3.11", ("json", "inspect", "types")),
        ("/usr/lib/python3/dist-packages", ("pytest", "_pytest", "pygments", "numpy")),
        (f"{WD}/.venv/lib/python3.11/site-packages", ("real",)),
        (f"{WD}/src", ("calc_src",)),  # an editable install's folder: the code under test, not the environment
    ),
    modules=frozenset({"sys", "builtins", "json", "unittest", "inspect", "types"}),
    configs=("pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg",
             "newrunner.cfg"),
)
CMD = ".venv/bin/python -m pytest tests"
TESTS = ["tests/test_add.py"]


def listing(paths: list[str], kind: str = "f") -> Listing:
    return {p: (kind, str(i), "1.0", "10") for i, p in enumerate(paths)}


def ctx(probe: Probe | None = PROBE, cmd: str = CMD, tests: list[str] = TESTS) -> InfraContext:
    return InfraContext.build(BASE_FILES, cmd, tests, probe)


def changed(base: Listing, *paths: str) -> Listing:
    """``base`` with ``paths`` written (a new change time; added when not in base)."""
    now = dict(base)
    for p in paths:
        kind, ino, _, size = now.get(p, ("f", "9999", "", "1"))
        now[p] = (kind, ino, "2.0", size)
    return now


def test_runner_configuration_of_every_name_is_restored_unconditionally_at_any_depth() -> None:
    base = listing(BASE_FILES)
    now = changed(base, "setup.cfg", "tox.ini", "tests/conftest.py")
    for p in ("pytest.toml", ".pytest.toml", "sub/PYTEST.INI", "x/.pytest.ini", "deep/er/Conftest.py",
              "newrunner.cfg", "lib/usercustomize.py", "sitecustomize.py", "site/zz.PTH"):
        now = changed(now, p)
    plan = plan_reset(base, now, ctx())
    assert set(plan.restore) == {"setup.cfg", "tox.ini", "tests/conftest.py"}  # no judging by a second parser
    assert set(plan.remove) == {"pytest.toml", ".pytest.toml", "sub/PYTEST.INI", "x/.pytest.ini",
                                "deep/er/Conftest.py", "newrunner.cfg", "lib/usercustomize.py",
                                "sitecustomize.py", "site/zz.PTH"}
    assert plan.why["newrunner.cfg"] == "runner configuration"  # a name only the probed runner reads


def test_deleted_protected_files_come_back_and_the_fix_is_never_touched() -> None:
    base = listing(BASE_FILES)
    now = changed({p: v for p, v in base.items() if p not in ("tests/conftest.py", "run_tests.sh")}, "calc/ops.py")
    plan = plan_reset(base, now, ctx(cmd="bash run_tests.sh"))
    assert set(plan.restore) == {"tests/conftest.py", "run_tests.sh"}
    assert plan.kept == ["calc/ops.py"] and not plan.remove


def test_pyproject_is_judged_by_its_tool_table_and_an_added_one_is_removed() -> None:
    base = listing(BASE_FILES)
    plan = plan_reset(base, changed(base, "pyproject.toml", "sub/pyproject.toml"), ctx())
    assert plan.judge == ["pyproject.toml"] and plan.remove == ["sub/pyproject.toml"]
    text = '[project]\nname = "calc"\n\n[tool.pytest.ini_options]\naddopts = "-q"\n'
    assert not changes_tool_config(text, text.replace('"calc"', '"calc2"'))  # build metadata may change
    assert changes_tool_config(text, text.replace('"-q"', '"--collect-only"'))
    assert changes_tool_config(text, text + '\n[tool.pytest]\naddopts = ["--co"]\n')  # pytest 9's native table
    assert changes_tool_config(text, text + '\n[tool.coverage.run]\nplugins = ["x"]\n')  # a plugin's table
    # judged as parsed, not as text: an escaped key is the same table to pytest's parser, a dotted one too
    assert not changes_tool_config(text, text.replace("[tool.pytest.ini_options]", '[tool."py\\u0074est".ini_options]'))
    assert changes_tool_config(text, '[project]\nname = "calc"\n[tool]\npytest.ini_options.addopts = "--co"\n')
    assert changes_tool_config(text, "not = [toml")  # unparseable: nobody can vouch for what pytest reads
    assert changes_tool_config("not = [toml", text)
    # a symlinked configuration is never read through: restored
    sym = dict(changed(base, "pyproject.toml"))
    sym["pyproject.toml"] = ("l", "1", "2.0", "4")
    assert plan_reset(base, sym, ctx()).restore == ["pyproject.toml"]


def test_test_folders_keep_only_the_official_paths() -> None:
    base = listing(BASE_FILES)
    now = changed(base, "tests/helpers.py", "tests/test_add.py", "tests/helpers/__init__.py", "tests/test_aaa.py",
                  "tests/unit/new.py", "TESTS/x.py", "calc/new_module.py", "pkg/test_pkg.py", "calc/test_new.py",
                  "calc/ops_test.py")
    plan = plan_reset(base, now, ctx())
    assert set(plan.restore) == {"tests/helpers.py", "pkg/test_pkg.py"}
    assert set(plan.remove) == {"tests/helpers/__init__.py", "tests/test_aaa.py", "tests/unit/new.py",
                                "TESTS/x.py", "calc/test_new.py", "calc/ops_test.py"}
    assert plan.kept == ["calc/new_module.py"]  # tests/test_add.py is official: the test patch writes it
    assert official_test_folders(["astropy/io/tests/test_x.py", "calc/test_ops.py", "tests/unit/test_y.py",
                                  "src/pkg/testing_utils/test_z.py", "Test/A.py"]) == (
        "astropy/io/tests/", "test/", "tests/")


def test_the_environment_the_command_names_is_protected() -> None:
    base = listing(BASE_FILES)
    now = changed(base, ".venv/bin/python", ".venv/bin/python3", ".venv/pyvenv.cfg",
                  ".venv/lib/python3.11/site-packages/real/__init__.py", "venv2/lib/python3.11/site-packages/x.py",
                  "src/calc_src/new.py")
    plan = plan_reset(base, now, ctx())
    assert set(plan.restore) == {".venv/bin/python", ".venv/pyvenv.cfg",
                                 ".venv/lib/python3.11/site-packages/real/__init__.py"}
    assert set(plan.remove) == {".venv/bin/python3", "venv2/lib/python3.11/site-packages/x.py"}
    assert plan.kept == ["src/calc_src/new.py"]
    # without a probe the folder holding pyvenv.cfg and the named interpreter are still the environment
    plan = plan_reset(base, now, ctx(probe=None))
    assert ".venv/bin/python3" in plan.remove and ".venv/bin/python" in plan.restore


def test_metadata_folders_and_bytecode_are_matched_case_insensitively() -> None:
    base = listing(BASE_FILES)
    now = changed(base, "tests/__PyCache__/test_add.cpython-311.pyc", "calc/__pycache__/ops.cpython-311.PYC",
                  ".Pytest_Cache/v/cache/lastfailed", "fake.DIST-INFO/entry_points.txt",
                  "src/calc.egg-info/SOURCES.txt", "calc/ops.pyo")
    plan = plan_reset(base, now, ctx())
    assert set(plan.remove) == {"tests/__PyCache__/test_add.cpython-311.pyc", "calc/__pycache__/ops.cpython-311.PYC",
                                ".Pytest_Cache/v/cache/lastfailed", "fake.DIST-INFO/entry_points.txt",
                                "src/calc.egg-info/SOURCES.txt", "calc/ops.pyo"}
    assert {plan.why[p] for p in plan.remove} == {"metadata or bytecode"}


def test_shadows_of_what_the_interpreter_imports_are_removed_case_insensitively() -> None:
    base = listing(BASE_FILES)
    added = ["JSON.py", "pygments/__init__.py", "pygments/lexer.py", "Numpy.py", "inspect.cpython-311-x86_64-linux-gnu.so",
             "real.py", "calc/types.py", "calc/json.py", "docs/json/index.md", "json_tools.py", "lib/inspect.py",
             "unittest", "utils.py", "helpers/__init__.py"]
    now = changed(base, *added)
    now["unittest"] = ("l", "77", "2.0", "4")  # a symlink that may point at a package
    plan = plan_reset(base, now, ctx())
    assert set(plan.remove) == {"JSON.py", "pygments/__init__.py", "pygments/lexer.py", "Numpy.py",
                                "inspect.cpython-311-x86_64-linux-gnu.so", "real.py", "lib/inspect.py", "unittest"}
    # inside a package, in a folder that is not a package, or a top-level name no installed module has (an honest
    # new utils.py or helpers package): the code under test
    assert set(plan.kept) == {"calc/types.py", "calc/json.py", "docs/json/index.md", "json_tools.py", "utils.py",
                              "helpers/__init__.py"}
    # the repository's own modules are not shadows of themselves (an editable src/ on sys.path)
    assert "calc_src" not in ctx().shadow_names
    # no probe: the runners' and the standard library's names still are
    fallback = plan_reset(base, changed(base, "pytest.py", "Inspect.py", "numpy.py"), ctx(probe=None))
    assert set(fallback.remove) == {"pytest.py", "Inspect.py"}


def test_saved_paths_match_the_patch_case_insensitively() -> None:
    base = listing(BASE_FILES)
    assert saved_paths(base, ["Tests/Helpers.py", "calc/ops.py", "new.py"]) == ["calc/ops.py", "tests/helpers.py"]


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


@pytest.mark.parametrize(
    ("cmd", "interp"),
    [
        (".venv/bin/python -m pytest -q tests", (".venv/bin/python", False)),
        ("python3.11 -m unittest discover", ("python3.11", False)),
        ("PYTHONPATH=src pytest -x tests", ("pytest", True)),
        ("make test", ("python3", False)),
    ],
)
def test_interpreter_of(cmd: str, interp: tuple[str, bool]) -> None:
    assert interpreter_of(cmd) == interp


def test_the_probe_script_runs_under_a_real_interpreter(tmp_path: Path) -> None:
    """The script the grader runs in the sandbox, run here by this venv's Python: it finds pytest's own
    configuration names (pytest 9 reads pytest.toml first) and what the interpreter can import."""
    script = tmp_path / "probe.py"
    script.write_text(PROBE_SCRIPT)
    out = subprocess.run([sys.executable, str(script), str(tmp_path), "1"], capture_output=True, text=True,
                         check=True, cwd="/").stdout
    probe = Probe.parse(out.strip().splitlines()[-1])
    assert probe.configs[:2] == ("pytest.toml", ".pytest.toml") and "setup.cfg" in probe.configs
    names = {n for _, ns in probe.path for n in ns}
    assert {"pytest", "_pytest", "pygments"} <= names and {"json", "sys"} <= probe.modules
    assert not any(p == str(script.parent) for p, _ in probe.path)  # the script's own folder is left out
    json.dumps(out)


def test_the_listing_sees_writes_renames_and_symlinks_and_is_fast_on_10k_files(tmp_path: Path) -> None:
    """``LIST_CMD`` and ``plan_reset`` on a real 10,000-file tree: a file written with its old content and
    mtime is still seen (its change time moved), and listing plus planning take a fraction of the 1 s budget."""
    for d in range(100):
        (tmp_path / f"pkg{d}").mkdir()
        for f in range(100):
            (tmp_path / f"pkg{d}" / f"m{f}.py").write_text("x = 1\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "helpers.py").write_text("h\n")
    run = lambda: parse_listing(subprocess.run(["bash", "-c", LIST_CMD], cwd=tmp_path, capture_output=True,
                                               check=True).stdout)
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    base = run()
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    listed = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime  # find's own CPU time
    helper = tmp_path / "tests" / "helpers.py"
    st = helper.stat()
    time.sleep(0.01)
    helper.write_text("h\n")  # same content, mtime put back: only the change time tells
    os.utime(helper, ns=(st.st_atime_ns, st.st_mtime_ns))
    (tmp_path / "pkg0" / "m0.py").rename(tmp_path / "pkg0" / "moved.py")
    (tmp_path / "pkg1" / "m0.py").unlink()
    (tmp_path / "pkg1" / "m0.py").symlink_to("../tests/helpers.py")
    now = run()
    t1 = time.process_time()
    plan = plan_reset(base, now, InfraContext.build(base, "python -m pytest tests", ["tests/test_add.py"], None))
    planned = time.process_time() - t1
    assert len(base) == 10_001
    assert plan.restore == ["tests/helpers.py"]
    assert {"pkg0/moved.py", "pkg1/m0.py"} <= set(plan.kept)
    assert now["pkg1/m0.py"][0] == "l"
    # CPU seconds, not wall time: a shared test machine's load must not decide; the budget for the whole
    # reset is 1 s, and one listing plus the planning is a small part of it
    assert listed + planned < 0.5, (listed, planned)
