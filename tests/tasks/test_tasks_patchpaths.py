import re
from pathlib import Path

import pytest

from lego_rl.errors import TaskDataError
from lego_rl.tasks.patchpaths import check_patch_structure, patch_paths

RENAME = """diff --git a/old name.py b/new.py
similarity index 90%
rename from old name.py
rename to new.py
"""


def test_paths_from_git_headers_in_order_without_duplicates() -> None:
    patch = (
        "diff --git a/src/a.py b/src/a.py\n--- a/src/a.py\n+++ b/src/a.py\n@@ -1,2 +1,2 @@\n"
        "--- a/looks/like/a/header.py\n+++ b/neither/is/this.py\n"
        "diff --git a/tests/t.py b/tests/t.py\ndeleted file mode 100644\n--- a/tests/t.py\n+++ /dev/null\n"
        "@@ -1 +0,0 @@\n-x\n"
    )
    assert patch_paths(patch) == ["src/a.py", "tests/t.py"]


def test_rename_and_quoted_paths() -> None:
    assert patch_paths(RENAME) == ["old name.py", "new.py"]
    quoted = 'diff --git "a/caf\\303\\251.py" "b/caf\\303\\251.py"\n'
    assert patch_paths(quoted) == ["café.py"]


@pytest.mark.parametrize("bad", ["/etc/passwd", "../outside.py", "tests/../../x.py"])
def test_absolute_or_parent_paths_are_rejected(bad: str) -> None:
    patch = f"--- a/{bad}\n+++ b/{bad}\n" if not bad.startswith("/") else f"--- {bad}\n+++ {bad}\n"
    with pytest.raises(TaskDataError, match="test patch path"):
        patch_paths(patch)


def test_paths_of_a_real_git_patch(tmp_path) -> None:
    """Names git has to quote, a rename, a binary file and a mode change, as `git diff` writes them."""
    import os
    import subprocess

    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=tmp_path, env=env, check=True, capture_output=True).stdout.decode()

    names = ["a b.py", "café.py", 'quote"d.py', "tab\there.py", "-- dashes.py", "old.py", "mode.sh"]
    for n in names:
        (tmp_path / n).write_text("x = 1\n" * 20)
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "base")
    for n in names[:5]:
        (tmp_path / n).write_text("x = 2\n" * 20)
    (tmp_path / "sub").mkdir()
    git("mv", "old.py", "sub/new.py")
    (tmp_path / "mode.sh").chmod(0o755)
    (tmp_path / "blob.bin").write_bytes(bytes(range(256)))
    git("add", "-A")
    patch = git("diff", "--cached", "--binary", "-M", "HEAD")
    assert sorted(patch_paths(patch)) == sorted([*names[:5], "old.py", "sub/new.py", "mode.sh", "blob.bin"])


def _git_diff(tmp_path: Path) -> tuple[str, str]:
    """A real ``git diff --cached`` (with and without --binary) of every kind of change git writes."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=tmp_path, check=True,
                              capture_output=True, text=True).stdout

    git("init", "-q", ".")
    (tmp_path / "x.txt").write_text("a\nb\nc\n")
    (tmp_path / "y.txt").write_text("moved\n")
    (tmp_path / "b.bin").write_bytes(b"\x00\x01bin")
    (tmp_path / "m.sh").write_text("echo\n")
    (tmp_path / "gone.txt").write_text("bye\n")
    git("add", "-A")
    git("commit", "-qm", "init")
    (tmp_path / "x.txt").write_text("a\nB\nc\nd")  # no newline at the end
    git("mv", "y.txt", "z.txt")
    (tmp_path / "b.bin").write_bytes(b"\x00\x02bin2")
    (tmp_path / "m.sh").chmod(0o755)
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "gone.txt").unlink()
    (tmp_path / "caf\u00e9.py").write_text("x = 1\n")
    git("add", "-A")
    return git("diff", "--cached", "--binary"), git("diff", "--cached")


def test_structure_accepts_what_git_writes(tmp_path: Path) -> None:
    for patch in _git_diff(tmp_path):
        check_patch_structure(patch)
    check_patch_structure("")  # f2p/swepro rows have none
    check_patch_structure("From 1234 Mon Sep 17 00:00:00 2001\nSubject: fix\n\n---\n" + FIX_ONE + "-- \n2.39.2\n")


FIX_ONE = "diff --git a/c.py b/c.py\n--- a/c.py\n+++ b/c.py\n@@ -1,2 +1,2 @@\n def f():\n-    return 1\n+    return 2\n"


@pytest.mark.parametrize(("patch", "message"), [
    ("fix the bug please\n", "not a unified diff"),
    (FIX_ONE.replace("-1,2 +1,2", "-1,3 +1,2"), "test patch line 4: hunk @@ -1,3 +1,2 @@ of 'c.py' is short"),
    (FIX_ONE.replace("-1,2 +1,2", "-1,1 +1,1"), "test patch line 6: a '-' line after the end of hunk"),
    ("--- a/c.py\n@@ -1 +1 @@\n-a\n+b\n", "'---' file header is not followed by a '+++' header"),
    ("@@ -1 +1 @@\n-a\n+b\n", "before any file header"),
    ("--- a/c.py\n+++ b/c.py\n", "has file headers but no hunk"),
])
def test_structure_refuses_what_git_refuses(patch: str, message: str) -> None:
    import subprocess

    with pytest.raises(TaskDataError, match=re.escape(message)):
        check_patch_structure(patch)
    git = subprocess.run(["git", "apply", "--numstat"], input=patch.encode(), capture_output=True)
    assert git.returncode != 0, "git itself accepts this patch: the structural check would be stricter than git"
