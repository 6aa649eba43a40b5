"""A tiny task image for grader tests: the shared Debian rootfs plus a git repository at /testbed.

The image is a hard-link copy of ``scripts/build_rootfs.sh``'s rootfs (cheap, and never modified in
place: sandboxes write to their own overlay layer) with a small Python project whose ``add()`` is
wrong, a future commit holding the fix (which the agent must not be able to reach), files the image
ships beyond HEAD (one modified, one untracked) and an official test patch that fails at HEAD.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from lego_rl.sandbox.base import ImageSpec
from lego_rl.tasks.model import TaskMetadata

BASE_ROOTFS = Path(os.environ.get("LEGO_ROOTFS_CACHE", "/var/cache/lego-rl/rootfs-bookworm"))
WORKDIR = "/testbed"

TEST_PATCH = """diff --git a/tests/test_calc.py b/tests/test_calc.py
new file mode 100644
--- /dev/null
+++ b/tests/test_calc.py
@@ -0,0 +1,3 @@
+from calc import add
+
+assert add(2, 3) == 5, f"add(2, 3) returned {add(2, 3)}"
diff --git a/tests/test_existing.py b/tests/test_existing.py
--- a/tests/test_existing.py
+++ b/tests/test_existing.py
@@ -1,2 +1,3 @@
 from calc import add
+# touched by the official patch, so the grader resets it before applying
 assert add(0, 0) == 0
"""

FIX_PATCH = """diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b
"""

WRONG_PATCH = """diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a * b
"""

# python3-minimal has no unittest/pytest: the official tests are plain asserting scripts.
EVAL_CMD = "export PYTHONPATH=.; python3 tests/test_calc.py && python3 tests/test_existing.py"


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": "/dev/null"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


def make_repo(repo: Path) -> str:
    """Build the task repository; returns the future commit id (the answer the agent must not see)."""
    repo.mkdir(parents=True)
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "tests").mkdir()
    (repo / "tests" / "test_existing.py").write_text("from calc import add\nassert add(0, 0) == 0\n")
    (repo / "README.md").write_text("calc\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    base = _git(repo, "rev-parse", "HEAD").strip()
    _git(repo, "checkout", "-q", "-b", "future")
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b  # THE ANSWER\n")
    _git(repo, "commit", "-q", "-am", "fix")
    future = _git(repo, "rev-parse", "HEAD").strip()
    _git(repo, "tag", "v-future")
    _git(repo, "checkout", "-q", "main")
    _git(repo, "remote", "add", "origin", "https://example.invalid/repo.git")
    _git(repo, "update-ref", "refs/remotes/origin/future", future)
    assert _git(repo, "rev-parse", "HEAD").strip() == base
    # shipped in the image beyond HEAD: one modified tracked file, one untracked file
    (repo / "README.md").write_text("calc (image build notes)\n")
    (repo / "local_settings.py").write_text("DEBUG = True\n")
    return future


def build_task_image(dest: Path) -> tuple[ImageSpec, str]:
    if not (BASE_ROOTFS / "usr" / "bin" / "git").exists():
        pytest.fail(f"{BASE_ROOTFS} is missing; run scripts/build_rootfs.sh (CI calls it)")
    subprocess.run(["cp", "-al", str(BASE_ROOTFS), str(dest)], check=True)
    shutil.rmtree(dest / "testbed")
    future = make_repo(dest / "testbed")
    dest.chmod(0o755)
    return ImageSpec(name="test/calc:1", rootfs=str(dest), workdir=WORKDIR), future


def task_meta(**over: object) -> TaskMetadata:
    fields: dict = {"instance_id": "calc-1", "image": "test/calc:1", "workdir": WORKDIR, "eval_cmd": EVAL_CMD,
                    "problem_statement": "add() is wrong", "test_patch": TEST_PATCH, "reference_patch": FIX_PATCH}
    fields.update(over)
    return TaskMetadata(**fields)


def require_setup(provider: str) -> None:
    """Fail (or skip with LEGO_SKIP_MISSING_SETUP=1) when the provider cannot run here."""
    reason = None
    if os.geteuid() != 0:
        reason = "grader tests need root (sandbox providers)"
    elif not (BASE_ROOTFS / ".lego-rootfs-stamp").is_file():
        reason = f"no test rootfs at {BASE_ROOTFS}: run scripts/build_rootfs.sh"
    elif provider == "bwrap" and shutil.which("bwrap") is None:
        reason = "bubblewrap is not installed (apt-get install bubblewrap)"
    if reason:
        if os.environ.get("LEGO_SKIP_MISSING_SETUP") == "1":
            pytest.skip(reason)
        pytest.fail(f"{reason} (set LEGO_SKIP_MISSING_SETUP=1 to skip instead)")


def provider_options(provider: str) -> dict:
    if provider == "sunabako":
        import sys

        binary = shutil.which("sunabako") or str(Path(sys.executable).with_name("sunabako"))
        state = os.environ.get("LEGO_SUNABAKO_TEST_STATE", "/var/lib/lego-rl/sunabako-test")
        return {"state_dir": state, "test_memory": True, "binary": binary}
    return {}
