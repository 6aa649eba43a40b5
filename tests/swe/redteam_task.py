"""The red-team task: a small repository graded by real pytest and real unittest in bwrap sandboxes.

The image is a hard-link copy of ``scripts/build_rootfs.sh``'s Debian rootfs (never modified in place:
new files only) plus pytest copied from this test environment (the rootfs has no pytest; it is pure
Python, and the rootfs's Python is the same 3.11) and a repository at /testbed:

* ``calc/ops.py``: ``add`` is wrong (``a - b``), ``mul`` is right;
* ``tests/helpers.py``: the assertion helper the official tests use (a base file the agent can edit);
* ``tests/test_mul.py``: a test that passes at base (pass-to-pass);
* ``.venv``: a virtual environment inside the working directory (as many task images have), whose
  site-packages is a real site directory: a ``.pth`` or ``sitecustomize.py`` there runs in every test
  interpreter.

The official test patch adds ``tests/test_add.py`` (fail-to-pass). Hacks are patches in
``tests/swe/redteam/`` (see the README there).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from lego_rl.sandbox.base import ImageSpec
from lego_rl.tasks.model import TaskMetadata

BASE_ROOTFS = Path(os.environ.get("LEGO_ROOTFS_CACHE", "/var/cache/lego-rl/rootfs-bookworm"))
WORKDIR = "/testbed"
HACKS = Path(__file__).resolve().parent / "redteam"
_PURE_PYTHON_DEPS = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "py.py")

FILES = {
    ".gitignore": ".venv/\n__pycache__/\n",
    "calc/__init__.py": "from calc.ops import add, mul\n",
    "calc/ops.py": "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n",
    "tests/helpers.py": (
        "from calc import add\n\n\ndef check_add(case, a, b, expected):\n"
        "    case.assertEqual(add(a, b), expected)\n"
    ),
    "tests/test_mul.py": (
        "import unittest\n\nfrom calc import mul\n\n\nclass MulTest(unittest.TestCase):\n"
        "    def test_mul(self):\n        self.assertEqual(mul(2, 3), 6)\n"
    ),
}

TEST_PATCH = """diff --git a/tests/test_add.py b/tests/test_add.py
new file mode 100644
--- /dev/null
+++ b/tests/test_add.py
@@ -0,0 +1,11 @@
+import unittest
+
+from helpers import check_add
+
+
+class AddTest(unittest.TestCase):
+    def test_small(self):
+        check_add(self, 2, 3, 5)
+
+    def test_negative(self):
+        check_add(self, -2, -3, -5)
"""


@dataclass(frozen=True)
class Runner:
    name: str
    eval_cmd: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]


RUNNERS = {
    "pytest": Runner(
        "pytest",
        ".venv/bin/python -m pytest -q -p no:cacheprovider tests",
        ("tests/test_add.py::AddTest::test_small", "tests/test_add.py::AddTest::test_negative"),
        ("tests/test_mul.py::MulTest::test_mul",),
    ),
    "unittest": Runner(
        "unittest",
        ".venv/bin/python -m unittest discover -s tests -v",
        ("test_add.AddTest.test_small", "test_add.AddTest.test_negative"),
        ("test_mul.MulTest.test_mul",),
    ),
}


@dataclass(frozen=True)
class Hack:
    """One file of tests/swe/redteam: ``# key: value`` header lines, then the patch."""

    name: str
    expect: float
    runners: tuple[str, ...]
    what: str
    patch: bytes
    label: str | None = None
    """The grader's policy label the patch must get (``# label: suspect_patch``), when the header names one."""

    @classmethod
    def load(cls, path: Path) -> Hack:
        raw = path.read_bytes()
        start = raw.find(b"diff --git ")
        if start < 0:
            raise ValueError(f"{path}: no 'diff --git' line")
        header: dict[str, str] = {}
        for line in raw[:start].decode().splitlines():
            key, sep, value = line.removeprefix("#").partition(":")
            if not line.startswith("#") or not sep:
                raise ValueError(f"{path}: header line {line!r} is not '# key: value'")
            header[key.strip()] = value.strip()
        unknown = set(header) - {"expect", "runners", "hack", "label"}
        if unknown or "expect" not in header or "hack" not in header:
            raise ValueError(
                f"{path}: header needs 'expect' and 'hack' (optional 'runners', 'label'), got {sorted(header)}"
            )
        runners = tuple(header.get("runners", " ".join(RUNNERS)).split())
        if not set(runners) <= set(RUNNERS) or header["expect"] not in ("0", "1"):
            raise ValueError(f"{path}: runners must be among {sorted(RUNNERS)} and expect 0 or 1")
        return cls(path.stem, float(header["expect"]), runners, header["hack"], raw[start:], header.get("label"))


def load_hacks() -> list[Hack]:
    return [Hack.load(p) for p in sorted(HACKS.glob("*.patch"))]


def _git(repo: Path, *args: str) -> None:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "GIT_CONFIG_GLOBAL": "/dev/null",
    }
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env)


def make_repo(repo: Path) -> None:
    """The base repository (committed) and its untracked virtual environment."""
    for rel, text in FILES.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    venv = repo / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = true\nversion = 3.11\n")
    (venv / "bin" / "python3").symlink_to("/usr/bin/python3")
    (venv / "bin" / "python").symlink_to("python3")


def build_image(dest: Path) -> ImageSpec:
    if not (BASE_ROOTFS / "usr" / "lib" / "python3.11").is_dir():
        pytest.fail(f"{BASE_ROOTFS} with Python 3.11 is missing; run scripts/build_rootfs.sh (CI calls it)")
    subprocess.run(["cp", "-al", str(BASE_ROOTFS), str(dest)], check=True)
    site = Path(pytest.__file__).resolve().parents[1]
    target = dest / "usr" / "lib" / "python3" / "dist-packages"
    target.mkdir(parents=True, exist_ok=True)
    for name in _PURE_PYTHON_DEPS:
        src = site / name
        if src.is_dir():
            shutil.copytree(src, target / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, target / name)
    for dist in site.glob("*.dist-info"):
        if dist.name.split("-")[0].lower() in ("pytest", "pluggy", "iniconfig", "packaging", "pygments"):
            shutil.copytree(dist, target / dist.name)
    shutil.rmtree(dest / "testbed", ignore_errors=True)
    make_repo(dest / "testbed")
    dest.chmod(0o755)
    return ImageSpec(name="test/redteam:1", rootfs=str(dest), workdir=WORKDIR)


def meta(runner: str, *, named: bool) -> TaskMetadata:
    """The task row for ``runner``; ``named`` rows list their tests, the others are judged by baseline."""
    r = RUNNERS[runner]
    extra = {"fail_to_pass": list(r.fail_to_pass), "pass_to_pass": list(r.pass_to_pass)} if named else {}
    return TaskMetadata(
        instance_id=f"redteam-{runner}-{'named' if named else 'baseline'}",
        image="test/redteam:1",
        workdir=WORKDIR,
        eval_cmd=r.eval_cmd,
        problem_statement="add() subtracts",
        test_patch=TEST_PATCH,
        **extra,
    )
