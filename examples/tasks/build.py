"""Regenerate the example tasks (tasks.jsonl and repos/*.tar.gz) from src/.

Each task in src/<name>/ has: repo/ (the buggy repository), tests/ (the official tests, hidden from the
agent: they become the row's test patch), fix/ (the reference solution, for `lego tasks check`) and
problem.md (the public problem statement). The script proves each task is gradable on the host before it
writes anything: the repository with the test patch fails, and with the reference fix it passes.

    python examples/tasks/build.py
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
IMAGE = "lego-rl/examples:bookworm"
EVAL_CMD = "python3 -m unittest discover -s tests -v"
GIT_ENV = {
    **os.environ, "GIT_AUTHOR_NAME": "lego-rl", "GIT_AUTHOR_EMAIL": "examples@lego-rl.invalid",
    "GIT_COMMITTER_NAME": "lego-rl", "GIT_COMMITTER_EMAIL": "examples@lego-rl.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, env=GIT_ENV, check=True, capture_output=True, text=True).stdout


def diff_after_copy(repo: Path, overlay: Path, prefix: str = "") -> str:
    """The unified diff that copying ``overlay`` over ``repo`` makes (the repo is left unchanged)."""
    shutil.copytree(overlay, repo / prefix, dirs_exist_ok=True)
    git(repo, "add", "-A")
    patch = git(repo, "diff", "--cached", "--binary")
    git(repo, "reset", "-q", "--hard", "HEAD")
    git(repo, "clean", "-qfdx")
    return patch


def tests_pass(repo: Path) -> bool:
    return subprocess.run(EVAL_CMD.split(), cwd=repo, capture_output=True).returncode == 0


def apply(repo: Path, patch: str) -> None:
    subprocess.run(["git", "apply", "-"], cwd=repo, input=patch, text=True, check=True)


def build_task(name: str, work: Path) -> tuple[dict, bytes]:
    src = HERE / "src" / name
    repo = work / name
    shutil.copytree(src / "repo", repo)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "Initial import")
    test_patch = diff_after_copy(repo, src / "tests", "tests")
    fix_patch = diff_after_copy(repo, src / "fix")
    apply(repo, test_patch)
    if tests_pass(repo):
        sys.exit(f"{name}: the official tests already pass on the unmodified repository")
    apply(repo, fix_patch)
    if not tests_pass(repo):
        sys.exit(f"{name}: the reference fix does not make the official tests pass")
    git(repo, "reset", "-q", "--hard", "HEAD")
    git(repo, "clean", "-qfdx")
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        for path in sorted(repo.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(repo)))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 1767225600, 0, 0, "", ""
            if info.isfile():
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    statement = (src / "problem.md").read_text().strip()
    instance_id = f"lego-example-{name}"
    row = {
        "prompt": [{"role": "user", "content": statement}],
        "label": instance_id,
        "metadata": {
            "instance_id": instance_id, "dataset": "lego-rl/examples", "image": IMAGE, "workdir": "/testbed",
            "problem_statement": statement, "eval_cmd": EVAL_CMD, "eval_user": "root",
            "test_patch": test_patch, "reference_patch": fix_patch, "repo_archive": f"repos/{instance_id}.tar.gz",
        },
    }
    return row, archive.getvalue()


def main() -> None:
    names = sorted(p.name for p in (HERE / "src").iterdir() if p.is_dir())
    rows = []
    (HERE / "repos").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            row, archive = build_task(name, Path(tmp))
            (HERE / row["metadata"]["repo_archive"]).write_bytes(archive)
            rows.append(row)
    out = HERE / "tasks.jsonl"
    tmp_out = out.with_suffix(".jsonl.tmp")
    tmp_out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    os.replace(tmp_out, out)
    print(f"wrote {len(rows)} tasks to {out}")


if __name__ == "__main__":
    main()
