"""Patch capture on a 10k-file repository with 50 agent edits, in a real bwrap sandbox.

    sudo .venv/bin/python benchmarks/patch_bench.py [--files 10000] [--edits 50] [--runs 3]

Per run: a fresh sandbox of an image whose /testbed holds the repository; ``prepare_workspace``
(without history stripping, the repository has one commit); ``take_snapshot``; 50 edits by the agent
user (modified, new, deleted files); then ``capture_patch``. Baselines measured in the same sandbox
right after: plain ``git diff HEAD --binary`` in the repository (what a naive capture would run; it
misses untracked files and commits) and a full copy of the tree (what a copy-based before/after
snapshot costs per capture). Needs root, bwrap and scripts/build_rootfs.sh's rootfs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from lego_rl.sandbox.base import ImageSpec, Sandbox
from lego_rl.sandbox.factory import create_sandbox
from lego_rl.swe import capture_patch, prepare_workspace, take_snapshot

BASE = Path(os.environ.get("LEGO_ROOTFS_CACHE", "/var/cache/lego-rl/rootfs-bookworm"))
WD = "/testbed"


def build_image(dest: Path, files: int) -> ImageSpec:
    subprocess.run(["cp", "-al", str(BASE), str(dest)], check=True)
    shutil.rmtree(dest / "testbed")
    repo = dest / "testbed"
    for i in range(files):
        p = repo / f"pkg{i % 100:02d}" / f"mod{i:05d}.py"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"# module {i}\n" + "".join(f"def f{j}(x):\n    return x + {j}\n" for j in range(20)))
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b",
           "GIT_COMMITTER_EMAIL": "b@b", "GIT_CONFIG_GLOBAL": "/dev/null"}
    # packed, as in an image whose repository was cloned
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"], ["gc", "-q", "--force"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, env=env)
    dest.chmod(0o755)
    return ImageSpec(name="bench/10k", rootfs=str(dest), workdir=WD)


def edits_script(n: int) -> str:
    """n edits: 70% modified files, 20% new files, 10% deleted files."""
    lines = []
    for k in range(n):
        i = (k * 197) % 10000
        path = f"pkg{i % 100:02d}/mod{i:05d}.py"
        if k % 10 < 7:
            lines.append(f"sed -i 's/return x + 3$/return x - 3  # edit {k}/' {path}")
        elif k % 10 < 9:
            lines.append(f"printf 'NEW = {k}\\n' > pkg{k % 100:02d}/new_{k}.py")
        else:
            lines.append(f"rm {path}")
    return "\n".join(lines)


async def timed(sb: Sandbox, cmd: str) -> float:
    t = time.perf_counter()
    res = await sb.exec(["bash", "-c", cmd], cwd=WD, timeout=600)
    assert res.exit_code == 0, res.stderr
    return time.perf_counter() - t


async def one_run(spec: ImageSpec, edits: int) -> dict[str, float]:
    async with create_sandbox(spec, provider="bwrap") as sb:
        await prepare_workspace(sb, workdir=WD, problem_statement="bench", strip_history=False)
        t = time.perf_counter()
        snap = await take_snapshot(sb, WD)
        snap_s = time.perf_counter() - t
        res = await sb.exec(["bash", "-c", edits_script(edits)], user="agent", cwd=WD, timeout=600)
        assert res.exit_code == 0, res.stderr
        t = time.perf_counter()
        patch = await capture_patch(sb, snap)
        capture_s = time.perf_counter() - t
        assert patch.count(b"diff --git") == edits, patch.count(b"diff --git")
        diff_s = await timed(sb, "git -c safe.directory='*' diff HEAD --binary > /tmp/plain.patch")
        copy_s = await timed(sb, "cp -a /testbed /tmp/tree-copy")
        noop_s = await timed(sb, "true")
    return {"snapshot": snap_s, "capture": capture_s, "git_diff": diff_s, "tree_copy": copy_s, "exec": noop_s}


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=10000)
    ap.add_argument("--edits", type=int, default=50)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lego-patch-bench-", dir="/var/tmp"))
    work.chmod(0o755)
    try:
        spec = build_image(work / "rootfs", args.files)
        runs = [await one_run(spec, args.edits) for _ in range(args.runs)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"{args.files} files, {args.edits} edits, median of {args.runs} fresh bwrap sandboxes")
    for k, v in med.items():
        print(f"  {k:10s} {v * 1000:8.1f} ms")
    print(f"  capture / plain git diff = {med['capture'] / med['git_diff']:.2f}x")
    print(f"  capture / full tree copy = {med['capture'] / med['tree_copy']:.2f}x")
    print(f"  target capture < 1 s: {'met' if med['capture'] < 1.0 else 'MISSED'}")


if __name__ == "__main__":
    asyncio.run(main())
