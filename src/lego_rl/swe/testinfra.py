"""The test infrastructure: everything the test run depends on except the code under test.

The grader applies the agent's patch in a fresh sandbox, so the tree differs from the task's base
(image + pre-commands) only where the patch wrote. Between the agent patch and the official test
patch, the grader puts back what decides *how* the tests run rather than what the code does, by
design rather than by a list of known tricks:

* **what changed** is read from the file system, not from the patch text: one ``find`` listing with
  each file's type, inode, change time and size before the patch and one after (``LIST_CMD``). A file
  the patch wrote has a new change time (no tool can set it), a replaced one a new inode, so renames,
  case variants on a case-insensitive file system and symlinks are all seen as what they are;
* **what is protected** (a changed path is restored to base, an added one removed; ``plan_reset``):

  - the **runner's configuration**: every file name the installed runner reads (pytest 9:
    ``pytest.toml``, ``.pytest.toml``, ``pytest.ini``, ``.pytest.ini``, ``tox.ini``, ``setup.cfg``,
    taken from the runner itself by the probe, plus those names in case a probe cannot run) and
    ``conftest.py``, at any depth, unconditionally: a fix never needs them. ``pyproject.toml`` also
    holds the package's build metadata, so it is judged with the parser pytest uses (``tomllib``,
    which pytest 7+ uses, or ``tomli``, the same code): the agent's file stays only when its whole
    ``[tool]`` table (pytest's ``[tool.pytest]``/``[tool.pytest.ini_options]`` and the tables its
    plugins read) is unchanged, and it parses; otherwise the whole file goes back to base. An added
    ``pyproject.toml`` is removed (pytest takes one as its configuration file);
  - the **test folders**: below the topmost test-named directory (``tests``, ``test``, ``testing``,
    ``test_*``, ``*_tests``) of each official test path, everything except the official paths
    themselves (the test patch writes those next); and test modules by the runners' default naming
    (``test_*.py``, ``*_test.py``, ``tests.py``) anywhere;
  - the **environment**: the interpreter the test command names and its prefix when they are inside
    the working directory (a ``.venv``), every directory holding a ``pyvenv.cfg``, ``site-packages``
    and ``dist-packages`` folders, ``*.pth``, ``sitecustomize.py``, ``usercustomize.py``;
  - **metadata folders** (``__pycache__``, ``.pytest_cache``, ``*.dist-info``, ``*.egg-info``) and
    bytecode (``*.pyc``, ``*.pyo``), and the scripts the command runs by name (``run_tests.sh``...);
  - **shadows**: an added file or folder that imports as a top-level module the runner's interpreter
    would otherwise import from outside the repository (its standard library, built-ins, and every
    top-level name on its ``sys.path`` outside the working directory, recorded by the probe before
    the patch), where its folder is not a package (so ``python -m``, pytest's rootdir insertion or
    ``sys.path[0]`` find it first).

Every name is compared case-insensitively: on a case-insensitive view of the tree ``Conftest.PY``,
``__PyCache__`` and ``JSON.py`` are what they look like to the import system. docs/grading.md has the
reasons; this module is their single source.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath

PYTEST_CONFIG_NAMES = ("pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini",
                       "setup.cfg")
"""What pytest 9 reads, in its order; the probe adds whatever the installed version reads beyond these."""
JUDGED_NAMES = frozenset({"pyproject.toml"})
"""Runner configuration that also holds other things: judged by its ``[tool]`` table, not restored blindly."""
HOOK_NAMES = frozenset({"conftest.py", "sitecustomize.py", "usercustomize.py"})
METADATA_DIRS = frozenset({"__pycache__", ".pytest_cache"})
METADATA_DIR_SUFFIXES = (".dist-info", ".egg-info")
SITE_DIRS = frozenset({"site-packages", "dist-packages"})
BYTECODE = (".pyc", ".pyo")
MODULE_SUFFIXES = (".py", ".pyw", ".pyc", ".pyo", ".so", ".pyd")
FALLBACK_SHADOWS = frozenset(
    {"pytest", "_pytest", "pluggy", "py", "unittest", "iniconfig", "conftest", "sitecustomize", "usercustomize"}
) | frozenset(sys.stdlib_module_names) | frozenset(sys.builtin_module_names)
"""Top-level names protected when the probe could not run (no interpreter found): the runners' and this
Python's standard library."""

LIST_CMD = r"find . -path ./.git -prune -o \( -type f -o -type l \) -printf '%y\t%i\t%C@\t%s\t%p\0'"
"""One listing of the tree (``.git`` left out): type, inode, change time, size, path; NUL-separated."""

Listing = dict[str, tuple[str, str, str, str]]
"""Repository-relative path -> (type letter, inode, change time, size)."""


def parse_listing(raw: bytes) -> Listing:
    out: Listing = {}
    for entry in raw.decode("utf-8", "surrogateescape").split("\0"):
        fields = entry.split("\t", 4)
        if len(fields) != 5:
            continue
        kind, ino, ctime, size, path = fields
        out[path[2:] if path.startswith("./") else path] = (kind, ino, ctime, size)
    return out


# ----- the probe: what the runner's interpreter reads and imports, asked before the patch

PROBE_SCRIPT = r'''
import json, os, pkgutil, re, sys
wd, want_pytest = os.path.realpath(sys.argv[1]), sys.argv[2] == "1"
here = os.path.dirname(os.path.abspath(__file__))
entries = []
for p in sys.path:
    if not p or os.path.abspath(p) == here or not os.path.isdir(p):
        continue
    try:
        names = sorted({m.name for m in pkgutil.iter_modules([p])})
    except Exception:
        names = []
    entries.append([os.path.realpath(p), names])
configs = []
if want_pytest:
    try:
        from _pytest.config import findpaths
        configs = list(getattr(findpaths, "CONFIG_LOADERS_BY_NAME", None) or [
            c for c in findpaths.locate_config.__code__.co_consts
            if isinstance(c, str) and re.fullmatch(r"\.?[\w.-]+\.(?:ini|toml|cfg)", c)])
    except Exception:
        pass
print(json.dumps({"prefix": os.path.realpath(sys.prefix), "wd": wd, "path": entries,
                  "modules": sorted(set(sys.builtin_module_names) | set(getattr(sys, "stdlib_module_names", ())))
                  , "configs": configs}))
'''
"""Run by the test command's own interpreter, from ``/``, before the agent patch (base content only)."""


def _tokens(cmd: str) -> list[str]:
    try:
        return shlex.split(cmd, comments=True)
    except ValueError:
        return cmd.split()


def interpreter_of(cmd: str) -> tuple[str, bool]:
    """The interpreter the command names (``.venv/bin/python``, ``python3``) and False, or a runner's
    console script (``pytest``) and True (its ``#!`` line names the interpreter); ``python3`` otherwise."""
    for tok in _tokens(cmd):
        name = PurePosixPath(tok).name
        if re.fullmatch(r"python(?:\d+(?:\.\d+)?)?", name):
            return tok, False
        if name in ("pytest", "py.test"):
            return tok, True
    return "python3", False


def probe_shell(cmd: str, wd: str, script_path: str, runner: str) -> str:
    """Shell for the probe: find the interpreter from ``wd`` (as the command would), run the script."""
    tok, via_script = interpreter_of(cmd)
    shebang = ('p=$(sed -n \'1s/^#![[:space:]]*//p\' "$p"); set -- $p; '
               'case ${1##*/} in env) p=$2;; *) p=$1;; esac; p=$(command -v -- "$p") || exit 0; ')
    return (f"cd {shlex.quote(wd)} || exit 0; p=$(command -v -- {shlex.quote(tok)}) || exit 0; "
            + (shebang if via_script else "")
            + 'case $p in /*) ;; *) p=$PWD/$p;; esac; cd / && '
            + f'"$p" {shlex.quote(script_path)} {shlex.quote(wd)} {1 if runner == "pytest" else 0}')


@dataclass(frozen=True)
class Probe:
    """What the probe saw: the interpreter's prefix, its ``sys.path`` with the top-level names of each
    entry, its standard library and built-in names, and the runner's configuration file names."""

    prefix: str
    wd: str
    path: tuple[tuple[str, tuple[str, ...]], ...]
    modules: frozenset[str]
    configs: tuple[str, ...]

    @classmethod
    def parse(cls, raw: bytes | str) -> Probe:
        data = json.loads(raw)
        return cls(str(data["prefix"]), str(data["wd"]),
                   tuple((str(p), tuple(str(n) for n in names)) for p, names in data["path"]),
                   frozenset(str(m) for m in data["modules"]), tuple(str(c) for c in data["configs"]))


def _rel(path: str, wd: str) -> str | None:
    """``path`` relative to ``wd`` when inside it (``""`` for ``wd`` itself), else None."""
    if path == wd:
        return ""
    return path[len(wd) + 1:] if path.startswith(wd.rstrip("/") + "/") else None


# ----- what the reset protects


def command_files(cmd: str) -> set[str]:
    """Repository paths the eval command executes by name: scripts (``*.sh``, ``run*``) and, for
    ``make``, the makefiles. Source files named on the command line (``pytest calc.py``) are not
    included: they may be what the agent had to fix."""
    out: set[str] = set()
    for tok in _tokens(cmd):
        path = tok.removeprefix("./")
        base = PurePosixPath(path).name
        if path.startswith("/") or ".." in path.split("/") or not base:
            continue
        if base.endswith((".sh", ".bash")) or base.lower().startswith(("run", "runtests")):
            out.add(path)
        if base == "make":
            out.update({"Makefile", "makefile", "GNUmakefile"})
    return out


def _is_test_dir(name: str) -> bool:
    n = name.lower()
    return n in ("test", "tests", "testing") or n.startswith("test_") or n.endswith(("_test", "_tests"))


def is_test_module(name: str) -> bool:
    n = name.lower()
    return n.endswith(".py") and (n.startswith("test_") or n.endswith("_test.py") or n == "tests.py")


def official_test_folders(test_paths: Iterable[str]) -> tuple[str, ...]:
    """The test folders (lower case, ending in ``/``): the topmost test-named directory of each path."""
    out: set[str] = set()
    for path in test_paths:
        parts = PurePosixPath(path).parts[:-1]
        for i, part in enumerate(parts):
            if _is_test_dir(part):
                out.add("/".join(parts[: i + 1]).lower() + "/")
                break
    return tuple(sorted(out))


@dataclass(frozen=True)
class InfraContext:
    """Everything ``plan_reset`` needs to know about the task, all names in lower case."""

    config_names: frozenset[str]
    cmd_files: frozenset[str]
    official: frozenset[str]
    test_dirs: tuple[str, ...]
    env_dirs: tuple[str, ...]
    env_files: frozenset[str]
    shadow_names: frozenset[str]
    probed: bool

    @classmethod
    def build(cls, base: Iterable[str], cmd: str, test_paths: Iterable[str], probe: Probe | None) -> InfraContext:
        tests = list(test_paths)
        env_dirs = {p.rsplit("/", 1)[0].lower() + "/" for p in base if p.lower().endswith("/pyvenv.cfg")}
        env_files: set[str] = set()
        tok, via_script = interpreter_of(cmd)
        if not via_script and "/" in tok and not tok.startswith("/"):
            env_files.add(str(PurePosixPath(tok)).lower())
        configs = set(PYTEST_CONFIG_NAMES)
        shadows: set[str] = set(FALLBACK_SHADOWS)
        if probe is not None:
            configs.update(probe.configs)
            shadows = set(probe.modules) | {"sitecustomize", "usercustomize", "conftest"}
            prefix = _rel(probe.prefix, probe.wd)
            if prefix:
                env_dirs.add(prefix.lower() + "/")
            for entry, names in probe.path:
                rel = _rel(entry, probe.wd)
                if rel is None:
                    shadows.update(names)  # the environment's own modules, outside the repository
                elif rel and (prefix and (rel + "/").startswith(prefix + "/") or set(rel.split("/")) & SITE_DIRS):
                    env_dirs.add(rel.lower() + "/")
                    shadows.update(names)
                # else: a repository folder on sys.path (an editable install's src/): the code under test
        return cls(
            config_names=frozenset(c.lower() for c in configs) | {"conftest.py"},
            cmd_files=frozenset(p.lower() for p in command_files(cmd)),
            official=frozenset(p.lower() for p in tests),
            test_dirs=official_test_folders(tests),
            env_dirs=tuple(sorted(env_dirs)),
            env_files=frozenset(env_files),
            shadow_names=frozenset(n.lower() for n in shadows),
            probed=probe is not None,
        )


def protected_by(path: str, ctx: InfraContext) -> str | None:
    """The rule that protects ``path`` (a short reason for the log), or None for the code under test.
    ``pyproject.toml`` is judged separately (``changes_tool_config``)."""
    lp = path.lower()
    parts = lp.split("/")
    name = parts[-1]
    if lp in ctx.official:
        return None  # the official test patch writes it next
    if name in ctx.config_names and name not in JUDGED_NAMES:
        return "runner configuration"
    if name in HOOK_NAMES or name.endswith(".pth"):
        return "runs in every interpreter"
    if lp in ctx.cmd_files:
        return "script the test command runs"
    if any(p in METADATA_DIRS or p.endswith(METADATA_DIR_SUFFIXES) for p in parts[:-1]) or name.endswith(BYTECODE):
        return "metadata or bytecode"
    if lp in ctx.env_files or any(p in SITE_DIRS for p in parts[:-1]) or lp.startswith(ctx.env_dirs):
        return "interpreter environment"
    if lp.startswith(ctx.test_dirs):
        return "test folder"
    if is_test_module(name):
        return "test module"
    return None


def _module_name(name: str) -> str | None:
    """The top-level module a file name would import as (``json.py`` -> ``json``), or None."""
    if name.endswith(MODULE_SUFFIXES):
        return name.split(".", 1)[0]
    return None


def shadows(path: str, kind: str, base_lower: set[str], now_lower: set[str], names: frozenset[str]) -> bool:
    """An added ``path`` that makes a protected name importable as a top-level module: a module file, a
    new package (its ``__init__.py`` added) or a symlink (it may point at one), in a folder that is not a
    package itself."""
    parts = path.lower().split("/")
    for i, part in enumerate(parts):
        parent = "/".join(parts[:i])
        if (f"{parent}/__init__.py" if parent else "__init__.py") in now_lower:
            return False  # inside a package: imports as pkg.name, not as a top-level name
        if i == len(parts) - 1:
            mod = part.split(".", 1)[0] if kind == "l" else _module_name(part)
            return mod is not None and mod in names
        init = "/".join(parts[: i + 1]) + "/__init__.py"
        if part in names and init in now_lower and init not in base_lower:
            return True  # a new package with a protected name
    return False


@dataclass
class ResetPlan:
    """What the grader does to the tree between the agent patch and the test patch."""

    restore: list[str] = field(default_factory=list)
    """Base paths the patch changed or deleted, written back from the saved base copy."""
    remove: list[str] = field(default_factory=list)
    """Paths the agent added that may not exist at grading time."""
    judge: list[str] = field(default_factory=list)
    """Base ``pyproject.toml`` files the patch changed: restored when ``changes_tool_config``."""
    why: dict[str, str] = field(default_factory=dict)
    """Path -> the rule that protects it (for the log)."""
    kept: list[str] = field(default_factory=list)
    """Files the patch added or changed that stay: the code under test (official paths left out: the test
    patch writes them next)."""


def changed_paths(base: Listing, now: Listing) -> tuple[list[str], list[str], list[str]]:
    """(added, modified, deleted) between two listings."""
    added = sorted(set(now) - set(base))
    deleted = sorted(set(base) - set(now))
    modified = sorted(p for p in set(base) & set(now) if base[p] != now[p])
    return added, modified, deleted


def plan_reset(base: Listing, now: Listing, ctx: InfraContext) -> ResetPlan:
    """The reset for a tree that went from ``base`` to ``now``."""
    plan = ResetPlan()
    added, modified, deleted = changed_paths(base, now)
    base_lower, now_lower = {p.lower() for p in base}, {p.lower() for p in now}
    for path in modified + deleted:
        if PurePosixPath(path).name.lower() in JUDGED_NAMES and path.lower() not in ctx.official:
            if path in now and now[path][0] == "f" and base[path][0] == "f":
                plan.judge.append(path)
                continue
            rule: str | None = "runner configuration"  # deleted, or turned into a symlink: never read through it
        else:
            rule = protected_by(path, ctx)
        if rule is not None:
            plan.restore.append(path)
            plan.why[path] = rule
        elif path in now and path.lower() not in ctx.official:
            plan.kept.append(path)
    for path in added:
        if PurePosixPath(path).name.lower() in JUDGED_NAMES:
            rule = "runner configuration"
        else:
            rule = protected_by(path, ctx)
        if rule is None and shadows(path, now[path][0], base_lower, now_lower, ctx.shadow_names):
            rule = "shadows a module the runner's interpreter imports"
        if rule is not None:
            plan.remove.append(path)
            plan.why[path] = rule
        elif path.lower() not in ctx.official:
            plan.kept.append(path)
    plan.kept.sort()
    return plan


def changes_tool_config(base_text: str, current_text: str) -> bool:
    """True unless both ``pyproject.toml`` texts parse with ``tomllib`` (pytest's parser) to the same
    ``[tool]`` table: the runner's and its plugins' configuration; build metadata may differ."""
    try:
        return bool(tomllib.loads(current_text).get("tool") != tomllib.loads(base_text).get("tool"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return True  # nobody can vouch for what pytest's parser reads in it


def saved_paths(base: Mapping[str, object], patch_paths: Iterable[str]) -> list[str]:
    """Base paths whose content the grader saves before the patch: those the patch names, matched
    case-insensitively (on a case-insensitive view ``Tests/Helpers.py`` writes ``tests/helpers.py``)."""
    want = {p.lower() for p in patch_paths}
    return sorted(p for p in base if p.lower() in want)
