"""What the per-test verdict costs a grade, on a 10k-file repository, in real bwrap sandboxes.

    sudo .venv/bin/python benchmarks/grader_bench.py [--files 10000] [--runs 3]

The image holds /testbed: ``--files`` modules and a unittest suite (20 passing tests), whose official test
patch adds 2 failing ones; the graded patch is the fix. One row, four ways, medians of ``--runs``:

* exit status (baseline of the ratios): the command runs the tests through a script (``python3
  tests/run.py``), which the grader cannot read per test, so the exit status decides. This is the old
  grader's work plus the test-infrastructure reset;
* named tests: ``python3 -m unittest discover -v`` with the row naming its tests: the reporting unittest
  main and the canary are added;
* baseline, cold: the row names no tests and the baseline cache is empty: a second fresh sandbox runs the
  baseline beside the candidate;
* baseline, warm: the same with the baseline cached (every later grade of the task in the process).

Needs root, bwrap and scripts/build_rootfs.sh's rootfs.
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

from lego_rl.sandbox.base import ImageSpec
from lego_rl.sandbox.factory import create_sandbox
from lego_rl.swe.baseline import BaselineCache
from lego_rl.swe.grader import grade
from lego_rl.tasks.model import TaskMetadata

BASE = Path(os.environ.get("LEGO_ROOTFS_CACHE", "/var/cache/lego-rl/rootfs-bookworm"))
WD = "/testbed"
TEST_PATCH = """diff --git a/tests/test_add.py b/tests/test_add.py
new file mode 100644
--- /dev/null
+++ b/tests/test_add.py
@@ -0,0 +1,9 @@
+import unittest
+
+from calc import add
+
+
+class AddTest(unittest.TestCase):
+    def test_small(self):
+        self.assertEqual(add(2, 3), 5)
+    test_large = lambda self: self.assertEqual(add(10**9, 1), 10**9 + 1)
"""
FIX = """diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b
"""


def build_image(dest: Path, files: int) -> ImageSpec:
    subprocess.run(["cp", "-al", str(BASE), str(dest)], check=True)
    shutil.rmtree(dest / "testbed")
    repo = dest / "testbed"
    for i in range(files):
        p = repo / f"pkg{i % 100:02d}" / f"mod{i:05d}.py"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"def f(x):\n    return x + {i}\n")
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "tests").mkdir()
    body = "".join(f"    def test_{i}(self):\n        self.assertEqual({i}, {i})\n" for i in range(20))
    (repo / "tests" / "test_other.py").write_text(
        f"import unittest\n\n\nclass Other(unittest.TestCase):\n{body}"
    )
    (repo / "tests" / "run.py").write_text(
        "import sys, unittest\nsys.path.insert(0, '.')\n"
        "unittest.main(module=None, argv=['run', 'discover', '-s', 'tests'])\n"
    )
    env = {
        **os.environ,
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_AUTHOR_NAME": "b",
        "GIT_AUTHOR_EMAIL": "b@b",
        "GIT_COMMITTER_NAME": "b",
        "GIT_COMMITTER_EMAIL": "b@b",
    }
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, env=env)
    dest.chmod(0o755)
    return ImageSpec(name="bench/grader:1", rootfs=str(dest), workdir=WD)


def row(cmd: str, *, named: bool) -> TaskMetadata:
    extra = {"fail_to_pass": ["test_add.AddTest.test_small", "test_add.AddTest.test_large"]} if named else {}
    return TaskMetadata(
        instance_id="bench",
        image="bench/grader:1",
        workdir=WD,
        eval_cmd=cmd,
        problem_statement="add",
        test_patch=TEST_PATCH,
        **extra,
    )


async def main(files: int, runs: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="lego-grader-bench-", dir="/var/tmp"))
    tmp.chmod(0o755)
    try:
        spec = build_image(tmp / "rootfs", files)
        opener = lambda: create_sandbox(spec, provider="bwrap")
        unittest_cmd = "python3 -m unittest discover -s tests -v"
        ways = {
            "exit status": lambda: (row("python3 tests/run.py", named=False), None),
            "named tests": lambda: (row(unittest_cmd, named=True), None),
            "baseline, cold": lambda: (row(unittest_cmd, named=False), BaselineCache()),
            "baseline, warm": lambda: (row(unittest_cmd, named=False), warm),
        }
        warm = BaselineCache()
        await grade(row(unittest_cmd, named=False), FIX, open_sandbox=opener, baselines=warm)  # fills it
        times: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(runs):
            for name, make in ways.items():
                meta, cache = make()
                t0 = time.perf_counter()
                res = await grade(meta, FIX, open_sandbox=opener, timeout=300, baselines=cache)
                times[name].append(time.perf_counter() - t0)
                assert res.reward == 1.0, (name, res.reason)
        ref = statistics.median(times["exit status"])
        print(f"{files} files, median of {runs}:")
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"  {name:15} {med:6.2f} s   {med / ref:4.2f}x exit status")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=10000)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    asyncio.run(main(a.files, a.runs))
