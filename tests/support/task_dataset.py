"""A generated task dataset for `lego tasks check` at scale: rows built offline from the example tasks
(examples/tasks), most of them gradable, some broken on purpose, each broken row with the reason code the
checker must give it.

Nothing here is a test double: every row is a real task (a real git repository archive, real unittest
tests, run in the real sandbox by the real grader). The broken kinds are the ways real datasets break:

* ``base passes``: the repository archive already carries the fix (the tests pass before the agent acts);
* ``reference fails``: the reference patch applies but fixes nothing;
* ``flaky``: the hidden tests add 20 coin-flip tests (each passes with probability 1/2), so two runs of
  one tree disagree on some test with probability 1 - 2**-20;
* ``future history``: the fix is committed beyond HEAD and kept in a ``.keep`` pack, which ``git gc``
  (the workspace's history stripping) never repacks or prunes;
* ``hidden tests reachable``: the hidden test file was committed and deleted in an ancestor of HEAD, so
  its contents are in the object store the agent can read;
* ``malformed row``: a line that is not JSON, a row without an ``eval_cmd``, a row whose repository
  archive does not exist.

    python tests/support/task_dataset.py OUT_DIR [ROWS]
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"
GIT_ENV = {
    **os.environ, "GIT_AUTHOR_NAME": "lego-rl", "GIT_AUTHOR_EMAIL": "examples@lego-rl.invalid",
    "GIT_COMMITTER_NAME": "lego-rl", "GIT_COMMITTER_EMAIL": "examples@lego-rl.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}
BROKEN_KINDS = ("base passes", "reference fails", "flaky", "future history", "hidden tests reachable")
MALFORMED_KINDS = ("invalid JSON", "missing eval_cmd", "missing archive")

FLAKY_TESTS = '''import os
import unittest


class CoinFlips(unittest.TestCase):
    """Each test passes with probability 1/2: the kind of test a determinism check must catch."""


for _n in range(20):
    setattr(CoinFlips, f"test_coin_{_n:02d}", lambda self: self.assertTrue(os.urandom(1)[0] & 1))
'''


@dataclass
class GeneratedDataset:
    path: Path
    """The task JSONL."""
    images: Path
    """images.json mapping the examples' image to the shared rootfs."""
    expected: dict[int, str] = field(default_factory=dict)
    """Row number -> the reason code the checker must give it (``valid`` for a gradable row)."""
    ids: dict[int, str | None] = field(default_factory=dict)
    """Row number -> instance id (None for the line that is not JSON)."""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, env=GIT_ENV, check=True, capture_output=True, text=True).stdout


def _unpack(archive: Path, into: Path) -> Path:
    into.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="tar")
    return into


def _pack(repo: Path) -> bytes:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        for path in sorted(repo.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(repo)))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 1767225600, 0, 0, "", ""
            if info.isfile():
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    return data.getvalue()


def _apply(repo: Path, patch: str) -> None:
    subprocess.run(["git", "apply", "-"], cwd=repo, input=patch, text=True, check=True, capture_output=True)


def _variant_archive(kind: str, archive: Path, meta: dict[str, Any], work: Path) -> bytes:
    """The example's repository changed the way ``kind`` needs (``base passes``, ``future history``,
    ``hidden tests reachable``)."""
    repo = _unpack(archive, work / f"{kind.replace(' ', '-')}-{archive.stem}")
    if kind == "base passes":
        _apply(repo, meta["reference_patch"])
        _git(repo, "commit", "-qam", "Fix it already")
    elif kind == "future history":
        base = _git(repo, "rev-parse", "HEAD").strip()
        _git(repo, "checkout", "-qb", "future")
        _apply(repo, meta["reference_patch"])
        _git(repo, "commit", "-qam", "The fix, from the future")
        _git(repo, "repack", "-adq")
        for pack in (repo / ".git" / "objects" / "pack").glob("*.pack"):
            pack.with_suffix(".keep").write_text("kept\n")
        _git(repo, "checkout", "-q", "main")
        _git(repo, "branch", "-qD", "future")
        _git(repo, "reflog", "expire", "--expire=now", "--all")
        assert _git(repo, "rev-parse", "HEAD").strip() == base
    elif kind == "hidden tests reachable":
        # the hidden tests once committed, then deleted: gone from the tree, still in the object store
        base = _git(repo, "rev-parse", "HEAD").strip()
        _apply(repo, meta["test_patch"])
        _git(repo, "add", "-A")
        _git(repo, "commit", "-qm", "Add tests")
        added = [line[len("+++ b/"):] for line in meta["test_patch"].splitlines() if line.startswith("+++ b/")]
        _git(repo, "rm", "-qf", *added)
        _git(repo, "commit", "-qm", "Drop tests for now")
        assert _git(repo, "rev-parse", "HEAD").strip() != base
    else:
        raise ValueError(kind)
    return _pack(repo)


def _useless_patch(archive: Path, meta: dict[str, Any], work: Path) -> str:
    """A reference patch that applies and changes nothing the tests look at."""
    repo = _unpack(archive, work / f"useless-{archive.stem}")
    first = next(line[len("+++ b/"):] for line in meta["reference_patch"].splitlines() if line.startswith("+++ b/"))
    with (repo / first).open("a") as fh:
        fh.write("# TODO: fix the bug\n")
    return _git(repo, "diff")


def generate(out: Path, rows: int = 50, broken_each: int = 3) -> GeneratedDataset:
    """Write ``out/tasks.jsonl``, ``out/repos/*.tar.gz`` and ``out/images.json``: ``broken_each`` rows of each
    broken kind, one of each malformed kind, the rest gradable copies of the example tasks."""
    n_broken = broken_each * len(BROKEN_KINDS) + len(MALFORMED_KINDS)
    if rows < n_broken + 1:
        raise ValueError(f"{rows} rows cannot hold {n_broken} broken ones and a valid one")
    examples = [json.loads(line) for line in (EXAMPLES / "tasks.jsonl").read_text().splitlines() if line.strip()]
    (out / "repos").mkdir(parents=True, exist_ok=True)
    shutil.copy(EXAMPLES / "images.json", out / "images.json")
    for ex in examples:
        shutil.copy(EXAMPLES / ex["metadata"]["repo_archive"], out / ex["metadata"]["repo_archive"])
    kinds = [k for k in BROKEN_KINDS for _ in range(broken_each)] + list(MALFORMED_KINDS)
    kinds += ["valid"] * (rows - len(kinds))
    # spread the broken rows through the file (every third row, then the rest valid), deterministically
    order = sorted(range(rows), key=lambda i: (i % 3, i))
    plan = ["valid"] * rows
    for slot, kind in zip(order, kinds, strict=True):
        plan[slot] = kind
    dataset = GeneratedDataset(out / "tasks.jsonl", out / "images.json")
    lines: list[str] = []
    archives: dict[tuple[str, str], str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, kind in enumerate(plan):
            ex = examples[(i // 3 + i) % len(examples)]  # broken rows sit at i % 3 == 0: vary them too
            row = json.loads(json.dumps(ex))
            meta = row["metadata"]
            iid = f"gen-{i + 1:03d}-{kind.replace(' ', '-')}-{meta['instance_id'].removeprefix('lego-example-')}"
            meta["instance_id"] = row["label"] = iid
            source = EXAMPLES / ex["metadata"]["repo_archive"]
            if kind in ("base passes", "future history", "hidden tests reachable"):
                key = (kind, source.name)
                if key not in archives:
                    name = f"repos/{kind.replace(' ', '-')}-{source.name}"
                    (out / name).write_bytes(_variant_archive(kind, source, meta, Path(tmp)))
                    archives[key] = name
                meta["repo_archive"] = archives[key]
            elif kind == "reference fails":
                meta["reference_patch"] = _useless_patch(source, meta, Path(tmp) / iid)
            elif kind == "flaky":
                meta["test_patch"] += _new_file_patch("tests/test_coin_flips.py", FLAKY_TESTS)
            elif kind == "missing eval_cmd":
                del meta["eval_cmd"]
            elif kind == "missing archive":
                meta["repo_archive"] = "repos/not-there.tar.gz"
            line = json.dumps(row)
            if kind == "invalid JSON":
                line = line[: len(line) // 2]
            lines.append(line)
            dataset.expected[i + 1] = "malformed row" if kind in MALFORMED_KINDS else kind
            dataset.ids[i + 1] = None if kind == "invalid JSON" else iid
    (out / "tasks.jsonl").write_text("".join(line + "\n" for line in lines))
    return dataset


def _new_file_patch(path: str, text: str) -> str:
    body = "".join(f"+{line}\n" for line in text.splitlines())
    return (f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
            f"@@ -0,0 +1,{len(text.splitlines())} @@\n{body}")


if __name__ == "__main__":
    target = Path(sys.argv[1])
    made = generate(target, int(sys.argv[2]) if len(sys.argv) > 2 else 50)
    print(f"wrote {len(made.expected)} rows to {made.path}")
