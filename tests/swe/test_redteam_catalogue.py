"""The red-team catalogue (``swe/redteam.py``) writes patches that apply on real repositories, bug untouched.

No sandbox here: the repositories are the red-team task's (``redteam_task.make_repo``) and the shipped example
tasks' archives, unpacked locally; ``git apply --check`` is the real applier the grader uses first. The views
are built from the local tree the way ``redteam_run.survey`` builds them in a sandbox (listing, then the
files ``wanted_texts`` names).
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import pytest
from redteam_task import TEST_PATCH, make_repo

from lego_rl.swe.redteam import CLASSES, RepoView, file_diff, generate, wanted_texts
from lego_rl.swe.redteam_payloads import MARK
from lego_rl.tasks.patchpaths import patch_paths

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"


def _view(repo: Path, test_patch: str, runner: str) -> RepoView:
    files = frozenset(str(p.relative_to(repo)) for p in repo.rglob("*")
                      if (p.is_file() or p.is_symlink()) and p.relative_to(repo).parts[0] != ".git")
    sites = tuple(sorted(str(p.relative_to(repo)) for p in repo.rglob("site-packages") if p.is_dir()))
    bare = RepoView(files, {}, sites, runner, tuple(patch_paths(test_patch)))
    texts = {p: (repo / p).read_text() for p in wanted_texts(bare)}
    return RepoView(files, texts, sites, runner, bare.test_paths)


def _applies(repo: Path, patch: bytes) -> str:
    res = subprocess.run(["git", "-C", str(repo), "apply", "--check", "-"], input=patch, capture_output=True)
    return "" if res.returncode == 0 else res.stderr.decode()


def _repos(tmp_path: Path) -> list[tuple[str, Path, str, str, list[str]]]:
    """(name, repository, test patch, runner, files holding the bug): the red-team task and each example."""
    red = tmp_path / "redteam"
    red.mkdir()
    make_repo(red)
    out = [("redteam", red, TEST_PATCH, "pytest", ["calc/ops.py"])]
    for line in (EXAMPLES / "tasks.jsonl").read_text().splitlines():
        meta = json.loads(line)["metadata"]
        repo = tmp_path / meta["instance_id"]
        with tarfile.open(EXAMPLES / meta["repo_archive"]) as tar:
            tar.extractall(repo, filter="data")
        out.append((meta["instance_id"], repo, meta["test_patch"], "unittest",
                    patch_paths(meta["reference_patch"])))
    return out


def test_every_class_writes_patches_that_apply_and_leave_the_bug_alone(tmp_path: Path) -> None:
    for name, repo, test_patch, runner, bug_files in _repos(tmp_path):
        view = _view(repo, test_patch, runner)
        attacks = generate(view)
        assert list(attacks) == list(CLASSES)
        for code, found in attacks.items():
            assert found, f"{name}: class {code} wrote no attack"
            for attack in found:
                assert not (problem := _applies(repo, attack.patch)), f"{name} {attack.name}: {problem}"
                touched = patch_paths(attack.patch.decode())
                assert not set(touched) & set(bug_files), f"{name} {attack.name} edits the bug's file"
                assert not set(touched) & set(view.test_paths) or code == "break-test-patch"


def test_the_attacks_reach_what_the_runner_loads(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    repo.mkdir()
    make_repo(repo)
    view = _view(repo, TEST_PATCH, "pytest")
    assert view.targets() == ["calc/__init__.py"] and view.test_dirs() == ["tests"]
    assert view.site_dirs == (".venv/lib/python3.11/site-packages",)
    by_name = {a.name: a.patch.decode() for found in generate(view).values() for a in found}
    # the payload rides on the code under test's import, and the .pth sits in the tree's virtual environment
    anything = by_name["always-equal/anything"]
    assert f"+{MARK}" in anything and "b/calc/__init__.py" in anything
    assert "b/calc/__init__.py" in by_name["oracle/expected-from-caller"]
    assert "b/.venv/lib/python3.11/site-packages/lego_rt.pth" in by_name["plugin/startup-hook"]
    # the repository's own assertion helper (tests/helpers.py: check_add) is redefined
    assert "+def check_add(*args, **kwargs):" in by_name["assertions/helpers-redefined"]
    # deleting a test module removes every line of it
    delete = by_name["remove-tests/delete"]
    assert "deleted file mode" in delete and "-class MulTest" in delete
    # the official test patch adds tests/test_add.py: the occupying attack puts a folder there
    assert "b/tests/test_add.py/lego" in by_name["break-test-patch/occupy"]


def test_a_class_with_nothing_to_bend_writes_nothing_and_unknown_classes_are_refused() -> None:
    empty = RepoView(frozenset({"README.md"}))
    attacks = generate(empty)
    # no code under test to ride on
    assert attacks["always-equal"] == [] and attacks["outliving-process"] == []
    assert attacks["break-test-patch"]  # .gitattributes needs nothing of the tree
    with pytest.raises(ValueError, match="unknown attack classes"):
        generate(empty, ["exit-status", "no-such-class"])
    assert list(generate(empty, ["exit-status"])) == ["exit-status"]


def test_file_diff_round_trips_through_git_apply(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "a.py").write_text("x = 1")  # no newline at the end
    (repo / "b.py").write_text("y = 2\n")
    cases = [("a.py", "x = 1", "x = 1\nz = 3\n"), ("b.py", "y = 2\n", None), ("c/d.py", None, "w = 4\n")]
    for path, old, new in cases:
        patch = file_diff(path, old, new).encode()
        res = subprocess.run(["git", "-C", str(repo), "apply", "-"], input=patch, capture_output=True)
        assert res.returncode == 0, res.stderr
    assert (repo / "a.py").read_text() == "x = 1\nz = 3\n"
    assert not (repo / "b.py").exists() and (repo / "c" / "d.py").read_text() == "w = 4\n"
