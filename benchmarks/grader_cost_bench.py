"""What reward integrity costs a grade: the full grader vs an exit-status grade of the same task, same run.

    sudo .venv/bin/python benchmarks/grader_cost_bench.py [--files 10000] [--runs 5]

The task is synthetic: /testbed holds ``--files`` Python modules (``grader_bench.build_image``), a unittest suite
of 20 passing tests, and pytest installed in the image (copied from this environment: pure Python, the rootfs's
Python is the same 3.11); the official test patch adds 2 failing tests and the graded patch is the fix. One task,
graded in fresh bwrap sandboxes, these ways (``--runs`` rounds, each grading every way back to back; times are
medians, ratios the median of the rounds' ratios, so that a shared box's load hits both sides of a ratio alike):

* **exit status, unittest** (baseline of the unittest ratios): the same tests through a script the grader cannot
  read per test (``python3 tests/run.py``), so only the exit status decides;
* **exit status, pytest** (baseline of the pytest ratios): ``python3 tests/run_all.py``, a script calling
  ``pytest.main``: the same for pytest;
* **full, unittest named / pytest named**: ``python3 -m unittest discover -s tests -v`` and ``python3 -m pytest
  -q tests`` with the row naming its tests: every integrity step of the grader (interpreter probe, base
  listing and test-infrastructure reset, canaries, the per-test channel, tamper checks, process reaping,
  suspect-patch scan);
* **full, unittest baseline (warm)**: the unittest row naming no tests, its baseline already cached (every
  grade of a task after the first).

Per grade it also reports the grader's own overhead, **reset + integrity** = grade wall time - sandbox
create/destroy - the test command's run - the two patch applications (agent's, official): everything the
grader does to trust the verdict on this 10k-file tree, including its Python side and each exec's round trip;
and the part of it spent inside the sandbox's logged steps. An exit-status grade still runs the reset, so the
difference between a full grade and its exit-status twin is what the per-test verdict and its checks add.
The targets (issue 26): full / exit status <= 1.3x, reset + integrity < 1 s. The slowest integrity steps of
the last full pytest grade are printed.

Needs root, bwrap and scripts/build_rootfs.sh's rootfs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_bench import FIX, TEST_PATCH, WD, build_image  # noqa: E402 - a sibling benchmark's task

from lego_rl.sandbox.base import ImageSpec, Sandbox  # noqa: E402
from lego_rl.sandbox.factory import create_sandbox  # noqa: E402
from lego_rl.swe.baseline import BaselineCache  # noqa: E402
from lego_rl.swe.grader import grade  # noqa: E402
from lego_rl.tasks.model import TaskMetadata  # noqa: E402

_PURE_PYTHON = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "py.py")
_STEP = re.compile(r"^===== (.+?): (?:exit -?\d+|TIMED OUT) \((\d+\.\d+) s\)$", re.MULTILINE)
_NOT_OVERHEAD = re.compile(r"^(eval as |run_script|agent patch \(|apply official test patch)")
UNITTEST_NAMES = ["test_add.AddTest.test_small", "test_add.AddTest.test_large"]
PYTEST_NAMES = ["tests/test_add.py::AddTest::test_small", "tests/test_add.py::AddTest::test_large"]


def add_pytest(dest: Path) -> None:
    """pytest in the image, and a script running it that the grader cannot read per test; committed."""
    site = Path(pytest.__file__).resolve().parents[1]
    target = dest / "usr" / "lib" / "python3" / "dist-packages"
    target.mkdir(parents=True, exist_ok=True)
    for name in _PURE_PYTHON:
        src = site / name
        if src.is_dir():
            shutil.copytree(src, target / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            shutil.copy2(src, target / name)
    for dist in site.glob("*.dist-info"):
        if dist.name.split("-")[0].lower() in ("pytest", "pluggy", "iniconfig", "packaging", "pygments"):
            shutil.copytree(dist, target / dist.name)
    repo = dest / "testbed"
    (repo / "tests" / "run_all.py").write_text(
        "import sys\nsys.path.insert(0, '.')\nimport pytest\nsys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', 'tests']))\n")
    env = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b",
           "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b", "PATH": "/usr/bin:/bin"}
    for args in (["add", "-A"], ["commit", "-q", "-m", "pytest runner script"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, env=env)


def row(cmd: str, names: list[str] | None) -> TaskMetadata:
    extra = {"fail_to_pass": names} if names else {}
    return TaskMetadata(instance_id="bench-cost", image="bench/grader:1", workdir=WD, eval_cmd=cmd,
                        problem_statement="add", test_patch=TEST_PATCH, **extra)


class Timed:
    """An opener that adds its sandboxes' create and destroy time to ``sandbox_s``."""

    def __init__(self, spec: ImageSpec) -> None:
        self.spec = spec
        self.sandbox_s = 0.0

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[Sandbox]:
        t0 = time.perf_counter()
        manager = create_sandbox(self.spec, provider="bwrap")
        sb = await manager.__aenter__()
        self.sandbox_s += time.perf_counter() - t0
        try:
            yield sb
        finally:
            t0 = time.perf_counter()
            await manager.__aexit__(None, None, None)
            self.sandbox_s += time.perf_counter() - t0


def steps(output: str) -> list[tuple[str, float]]:
    return [(m.group(1), float(m.group(2))) for m in _STEP.finditer(output)]


async def main(files: int, runs: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="lego-grader-cost-", dir="/var/tmp"))
    tmp.chmod(0o755)
    try:
        spec = build_image(tmp / "rootfs", files)
        add_pytest(tmp / "rootfs")
        unit, pyt = "python3 -m unittest discover -s tests -v", "python3 -m pytest -q -p no:cacheprovider tests"
        warm = BaselineCache()
        ways = {
            "exit status, unittest": (row("python3 tests/run.py", None), None),
            "exit status, pytest": (row("python3 tests/run_all.py", None), None),
            "full, unittest named": (row(unit, UNITTEST_NAMES), None),
            "full, pytest named": (row(pyt, PYTEST_NAMES), None),
            "full, unittest baseline (warm)": (row(unit, None), warm),
        }
        opener = Timed(spec)
        async with opener.open() as sb:  # one exec's round trip on this box, for the overhead's breakdown
            rts = []
            for _ in range(10):
                t0 = time.perf_counter()
                await sb.exec(["true"], cwd="/")
                rts.append(time.perf_counter() - t0)
        exec_rt = statistics.median(rts)
        await grade(row(unit, None), FIX, open_sandbox=opener.open, baselines=warm)  # fills the warm cache
        times: dict[str, list[float]] = {name: [] for name in ways}
        overhead: dict[str, list[float]] = {name: [] for name in ways}
        in_steps: dict[str, list[float]] = {name: [] for name in ways}
        last: dict[str, list[tuple[str, float]]] = {}
        execs: dict[str, int] = {}
        for _ in range(runs):
            for name, (meta, cache) in ways.items():
                opener.sandbox_s = 0.0
                t0 = time.perf_counter()
                res = await grade(meta, FIX, open_sandbox=opener.open, timeout=300, baselines=cache)
                wall = time.perf_counter() - t0
                assert res.reward == 1.0, (name, res.reason, res.output[-3000:])
                run_and_apply = sum(s for title, s in steps(res.output) if _NOT_OVERHEAD.match(title))
                times[name].append(wall)
                overhead[name].append(wall - opener.sandbox_s - run_and_apply)
                in_steps[name].append(sum(s for title, s in steps(res.output) if not _NOT_OVERHEAD.match(title)))
                last[name] = steps(res.output)
                execs[name] = len(last[name])
        load = Path("/proc/loadavg").read_text().split()[:3]
        print(f"{files} files, {runs} runs each (median), bwrap, {os.cpu_count()} CPUs, load average "
              f"{' '.join(load)}; grader commit: {grader_commit()}; one exec round trip {exec_rt * 1000:.0f} ms")
        base = {"unittest": statistics.median(times["exit status, unittest"]),
                "pytest": statistics.median(times["exit status, pytest"])}
        for name in ways:
            med = statistics.median(times[name])
            twin = "exit status, " + ("pytest" if "pytest" in name else "unittest")
            # each round grades every way back to back: its ratio sees the same load, so the median of the
            # rounds' ratios is steadier on a shared box than the ratio of the medians
            ratio = statistics.median(t / r for t, r in zip(times[name], times[twin], strict=True))
            print(f"  {name:32} {med:6.2f} s  {ratio:4.2f}x exit status (ratio of medians "
                  f"{med / base['pytest' if 'pytest' in name else 'unittest']:4.2f}x)   reset + integrity "
                  f"{statistics.median(overhead[name]):5.2f} s (max {max(overhead[name]):.2f}; in logged "
                  f"steps {statistics.median(in_steps[name]):.2f} s; {execs[name]} logged steps)")
        print("slowest integrity steps of the last full pytest grade:")
        for title, s in sorted((x for x in last["full, pytest named"] if not _NOT_OVERHEAD.match(x[0])),
                               key=lambda x: -x[1])[:6]:
            print(f"  {s:5.2f} s  {title}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def grader_commit() -> str:
    """The last commit that touched the grader's modules, and whether the tree differs from it."""
    root = Path(__file__).resolve().parents[1]
    paths = ["src/lego_rl/swe", ":(exclude)src/lego_rl/swe/redteam*"]
    sha = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%h", "--", *paths],
                         capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", *paths],
                           capture_output=True, text=True).stdout.strip()
    return f"{sha or '?'}{' + uncommitted changes' if dirty else ''}"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=10000)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    asyncio.run(main(a.files, a.runs))
