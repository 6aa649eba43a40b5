"""Test infrastructure the agent's patch may not change: which files, and how the grader resets them.

The grader applies the agent's patch in a fresh sandbox, so the tree differs from the task's base
(image + pre-commands) only where the patch wrote. Some of those files decide *how* the tests run
rather than what the code does: a ``conftest.py`` can end the run with status 0 or mark every test
passed, a ``sitecustomize.py`` or ``.pth`` file runs code in every interpreter, a ``unittest.py`` in
the working directory replaces the runner. After the agent patch and before the official test
patch, the grader restores every such file to its base content, or removes it when the agent added
it. docs/grading.md has the list with the reasons; this module is its single source.

Python family (the only one the datasets here hold):

* **always reset** (restored to base, removed when added): ``conftest.py`` at any depth,
  ``pytest.ini``, ``.pytest.ini``, ``tox.ini``, ``sitecustomize.py``, ``usercustomize.py``, every
  ``*.pth``, ``entry_points.txt`` of an ``*.egg-info``/``*.dist-info`` in the tree (a ``pytest11``
  entry there loads a plugin into every pytest run), and the scripts the eval command runs by name
  (``run_tests.sh``, ``tests/runtests.py``, a ``Makefile`` for ``make``);
* **reset when their test sections changed**: ``pyproject.toml`` (``[tool.pytest...]``) and
  ``setup.cfg`` (``[tool:pytest]``, ``[pytest]``) — the agent's other edits there survive, an edit
  to the test configuration restores the whole file;
* **removed when the agent added them** (base files of the same name are the repository's own):
  compiled bytecode (``*.pyc``/``*.pyo``: an unchecked-hash ``.pyc`` runs without its source) and a
  module or package whose name is a runner's (``pytest``, ``_pytest``, ``pluggy``, ``unittest``...)
  or the standard library's, where it would import as a top-level module (its directory is not a
  package), which is where ``python -m``, pytest's rootdir insertion or ``sys.path[0]`` find it.
"""

from __future__ import annotations

import configparser
import shlex
import sys
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

ALWAYS_RESET_NAMES = frozenset(
    {"conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "sitecustomize.py", "usercustomize.py"}
)
ALWAYS_RESET_SUFFIXES = (".pth",)
SECTION_RESET_NAMES = frozenset({"pyproject.toml", "setup.cfg"})
RUNNER_MODULES = frozenset(
    {
        "pytest",
        "_pytest",
        "pluggy",
        "py",
        "unittest",
        "nose",
        "nose2",
        "xmlrunner",
        "iniconfig",
        "conftest",
        "sitecustomize",
        "usercustomize",
    }
)
SHADOWABLE = RUNNER_MODULES | frozenset(sys.stdlib_module_names)
_SETUP_CFG_SECTIONS = ("tool:pytest", "pytest")


def _script_tokens(cmd: str) -> list[str]:
    try:
        return shlex.split(cmd, comments=True)
    except ValueError:
        return cmd.split()


def command_files(cmd: str) -> set[str]:
    """Repository paths the eval command executes by name: scripts (``*.sh``, ``run*``) and, for
    ``make``, the makefiles. Source files named on the command line (``pytest calc.py``) are not
    included: they may be what the agent had to fix."""
    out: set[str] = set()
    for tok in _script_tokens(cmd):
        path = tok.removeprefix("./")
        base = PurePosixPath(path).name
        if path.startswith("/") or ".." in path.split("/") or not base:
            continue
        if base.endswith((".sh", ".bash")) or base.lower().startswith(("run", "runtests")):
            out.add(path)
        if base == "make":
            out.update({"Makefile", "makefile", "GNUmakefile"})
    return out


def _is_always(path: str, cmd_files: set[str]) -> bool:
    p = PurePosixPath(path)
    if p.name in ALWAYS_RESET_NAMES or p.name.endswith(ALWAYS_RESET_SUFFIXES) or path in cmd_files:
        return True
    return p.name == "entry_points.txt" and p.parent.name.endswith((".egg-info", ".dist-info"))


def _shadows(path: str, tree: set[str]) -> bool:
    """An added file that imports as a top-level runner/stdlib module (or is bytecode)."""
    p = PurePosixPath(path)
    if p.suffix in (".pyc", ".pyo"):
        return True
    parts = p.parts
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if last:
            if p.suffix != ".py" and not p.name.endswith(".so"):
                return False
            name = part.split(".", 1)[0]
        else:
            name = part
            if str(PurePosixPath(*parts[: i + 1], "__init__.py")) not in tree:
                continue  # a plain directory: not a package that could shadow
        parent_init = str(PurePosixPath(*parts[:i], "__init__.py")) if i else "__init__.py"
        if name in SHADOWABLE and parent_init not in tree:
            return True
    return False


@dataclass
class ResetPlan:
    """What the grader does to the tree between the agent patch and the test patch."""

    restore: list[str] = field(default_factory=list)
    """Base paths written back from the saved base copy (a no-op where the agent left them alone)."""
    remove: list[str] = field(default_factory=list)
    """Paths the agent added that may not exist at grading time."""
    compare: list[str] = field(default_factory=list)
    """``pyproject.toml``/``setup.cfg`` paths whose test sections decide (``changes_test_config``)."""


def base_infra(base: Iterable[str], cmd: str) -> list[str]:
    """Base paths whose content the grader saves before the agent patch (every reset candidate)."""
    files = command_files(cmd)
    return sorted(p for p in base if _is_always(p, files) or PurePosixPath(p).name in SECTION_RESET_NAMES)


def plan_reset(base: set[str], current: set[str], cmd: str) -> ResetPlan:
    """The reset for a tree that went from ``base`` to ``current`` (repository-relative file lists)."""
    files = command_files(cmd)
    plan = ResetPlan()
    for path in sorted(base | current):
        name = PurePosixPath(path).name
        if _is_always(path, files):
            (plan.restore if path in base else plan.remove).append(path)
        elif name in SECTION_RESET_NAMES:
            if path not in current:
                plan.restore.append(path)  # deleting the configuration changes how tests run
            else:
                plan.compare.append(path)
        elif path in current and path not in base and _shadows(path, current):
            plan.remove.append(path)
    return plan


def _test_sections(name: str, text: str) -> Any:
    if name == "pyproject.toml":
        tool = tomllib.loads(text).get("tool", {})
        return tool.get("pytest") if isinstance(tool, dict) else tool
    cfg = configparser.RawConfigParser(strict=False, interpolation=None)
    cfg.read_string(text)
    return {s: dict(cfg.items(s)) for s in _SETUP_CFG_SECTIONS if cfg.has_section(s)}


def changes_test_config(name: str, base_text: str | None, current_text: str) -> bool:
    """True when the agent's ``pyproject.toml``/``setup.cfg`` configures the tests differently from
    base (or cannot be parsed, so nobody can say it does not)."""
    try:
        now = _test_sections(name, current_text)
    except (tomllib.TOMLDecodeError, configparser.Error, UnicodeDecodeError):
        return True
    if base_text is None:
        return bool(now)
    try:
        before = _test_sections(name, base_text)
    except (tomllib.TOMLDecodeError, configparser.Error):
        return True  # the base does not parse either: restore it byte for byte
    return bool(now != before)
