import pytest

from lego_rl.errors import TaskDataError
from lego_rl.tasks.patchpaths import patch_paths

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
