"""The supervised test run on this host: the real supervisor, the real shims, real pytest and unittest.

What the grader does in its sandbox (swe/insandbox), done here in a temporary folder as root: the per-test
records, their sealing, the integrity check, the kill of what the command leaves, and the host's reading of
the record (``supervised.parse``), including what a forged, cut or flooded record becomes.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from lego_rl.errors import GraderError
from lego_rl.swe.supervised import (
    MAX_RECORD_BYTES,
    RunPlan,
    Supervised,
    failure_frames,
    parse,
    shim_source,
    supervisor_source,
    unittest_command,
)
from lego_rl.swe.testresults import format_results

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the supervisor starts the command as eval_user (root)")

TESTS = """import unittest

import pytest


class CalcTest(unittest.TestCase):
    def test_ok(self):
        pass

    def test_bad(self):
        self.assertEqual(1, 2)

    @unittest.expectedFailure
    def test_xfail(self):
        self.assertEqual(1, 2)

    def test_sub(self):
        for i in range(2):
            with self.subTest(i=i):
                self.assertEqual(i, 0)


def test_fn():
    pass


@pytest.mark.parametrize("x", [1, "a b"])
def test_param(x):
    pass


def test_skip():
    pytest.skip("no")
"""


@dataclass
class Ran:
    sup: Supervised
    stdout: str
    record: bytes | None
    exit_code: int
    stderr: str
    plan: RunPlan

    def reparse(self, record: bytes | None, stdout: str | None = None) -> Supervised:
        return parse(self.stdout if stdout is None else stdout, record, exit_code=self.exit_code,
                     stderr=self.stderr, runner="pytest")


def supervise(tmp_path: Path, files: dict[str, str], runner: str, cmd: str, timeout: float = 60) -> Ran:
    work = tmp_path / "work"
    for rel, text in files.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    tok = secrets.token_hex(8)
    plan = RunPlan(str(tmp_path / f"run-{tok}"), tok)
    Path(plan.run_dir).mkdir(mode=0o700)
    Path(plan.shim_dir).mkdir()
    Path(plan.supervisor).write_text(supervisor_source())
    Path(plan.shim).write_text(shim_source(runner))
    if runner == "unittest":
        cmd = unittest_command(cmd, plan.shim)
    Path(plan.config).write_bytes(plan.config_json(cmd, user="root", cwd=str(work), timeout=timeout, runner=runner))
    proc = subprocess.run(plan.start(), capture_output=True, text=True, check=False, timeout=timeout + 30)
    record = Path(plan.record).read_bytes() if Path(plan.record).exists() else None
    sup = parse(proc.stdout, record, exit_code=proc.returncode, stderr=proc.stderr, runner=runner)
    return Ran(sup, proc.stdout, record, proc.returncode, proc.stderr, plan)


PYTEST = f"{sys.executable} -m pytest -q -p no:cacheprovider -p no:randomly tests"


def test_pytest_records_each_test_with_its_node_id_status_and_failing_frames(tmp_path: Path) -> None:
    sup = supervise(tmp_path, {"tests/test_a.py": TESTS}, "pytest", PYTEST).sup
    assert sup.run.statuses == {
        "tests/test_a.py::CalcTest::test_ok": "PASSED",
        "tests/test_a.py::CalcTest::test_bad": "FAILED",
        "tests/test_a.py::CalcTest::test_xfail": "XFAIL",
        "tests/test_a.py::CalcTest::test_sub": "FAILED",
        "tests/test_a.py::test_fn": "PASSED",
        "tests/test_a.py::test_param[1]": "PASSED",
        "tests/test_a.py::test_param[a b]": "PASSED",
        "tests/test_a.py::test_skip": "SKIPPED",
    }, (sup.evidence, sup.run.problems)
    assert sup.complete and not sup.evidence and not sup.blocked and sup.exit_code == 1
    assertion, frames = failure_frames(sup.details["tests/test_a.py::CalcTest::test_bad"])
    assert assertion and "test_a.py:11" in frames
    assert "FAILED   tests/test_a.py::CalcTest::test_bad" in format_results(sup.run)


def test_pytest_collection_error_is_not_a_test(tmp_path: Path) -> None:
    sup = supervise(tmp_path, {"tests/test_a.py": TESTS, "tests/test_b.py": "def f(:\n"}, "pytest", PYTEST).sup
    assert sup.run.collection_errors == ["tests/test_b.py"] and sup.run.statuses == {}  # pytest stops
    assert sup.complete and not sup.evidence


def test_unittest_shim_reports_each_test_and_replaces_only_the_module(tmp_path: Path) -> None:
    files = {
        "tests/test_a.py": TESTS.replace("import pytest\n", "").split("\n\ndef test_fn")[0],
        "tests/test_broken.py": "import nope_not_a_module\n",
        "unittest.py": "raise SystemExit(0)\n",  # a shadow in the working directory
    }
    ran = supervise(tmp_path, files, "unittest", f"{sys.executable} -m unittest discover -s tests -v")
    sup = ran.sup
    assert sup.run.statuses == {
        "test_a.CalcTest.test_ok": "PASSED",
        "test_a.CalcTest.test_bad": "FAILED",
        "test_a.CalcTest.test_xfail": "XFAIL",
        "test_a.CalcTest.test_sub": "FAILED",
    }
    assert sup.run.collection_errors == ["test_broken"] and sup.complete and not sup.evidence
    log = Path(ran.plan.log).read_text()
    assert "test_ok (test_a.CalcTest.test_ok) ... ok" in log  # the runner's own output, unchanged


CHEATS = {
    # The package replaces an assertion method: found by the end-of-run integrity check.
    "assert_method": ("import unittest\nunittest.TestCase.assertEqual = lambda self, a, b, msg=None: None\n",
                      "unittest.case.TestCase.assertEqual was replaced"),
    # A pytest plugin registered from repository code, rewriting reports.
    "plugin": ("""import gc, pytest

class P:
    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item, call):
        rep = yield
        rep.outcome = "passed"
        return rep

for o in gc.get_objects():
    if type(o).__name__ == "Config" and type(o).__module__.startswith("_pytest"):
        o.pluginmanager.register(P(), "p")
        break
""", "a pytest plugin was registered from repository code"),
    # A trace function from the repository: it could skip lines or rewrite locals.
    "tracer": ("import sys\nsys.settrace(lambda *a: None)\n", "sys.settrace holds a function from the repository"),
    # The shim's own send, called by the code under test for a test that never ran.
    "ghost_result": ("""import sys
shim = next(m for n, m in sys.modules.items() if n.startswith("lego_shim_"))
shim.send("T", "tests/test_a.py::test_ghost", "PASSED", "")
""", "'tests/test_a.py::test_ghost', which the runner never collected"),
    # class 7: the snapshot compared id()s, and an id is an address: the original freed first, a replacement
    # allocated right after takes its address (a loop of defs finds it), so the id check saw nothing.
    "identity_reuse": ("""import unittest
cls, name = unittest.TestCase, "_callTestMethod"
old = id(cls.__dict__[name])
delattr(cls, name)
made = []
for _ in range(5000):
    def fake(self, method):
        pass
    made.append(fake)
    if id(fake) == old:
        break
setattr(cls, name, made[-1])
""", "unittest.case.TestCase._callTestMethod was replaced"),
    # class 7: one line blinds a check that calls builtins.sorted after the repository ran.
    "blinding_builtin": ("""import builtins, unittest
builtins.sorted = lambda *a, **k: []
unittest.TestCase.assertEqual = lambda self, a, b, msg=None: None
""", "unittest.case.TestCase.assertEqual was replaced"),
    # Records written straight to the channel, next to the shim's own.
    "forged_records": ("""import os, stat
for fd in range(3, 1024):
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.write(fd, b"T\\t1\\ttests/test_a.py::test_it\\tPASSED\\t\\n")
    except OSError:
        pass
""", "a record was forged, repeated or dropped"),
}


@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_what_the_code_under_test_changes_is_evidence(tmp_path: Path, cheat: str) -> None:
    code, evidence = CHEATS[cheat]
    files = {"pkg.py": code, "tests/test_a.py": "import pkg\n\n\ndef test_it():\n    assert 1 == 2\n"}
    sup = supervise(tmp_path, files, "pytest", f"{sys.executable} -m pytest -q -p no:cacheprovider -p no:randomly "
                    "--rootdir . tests").sup
    assert any(evidence in e for e in sup.evidence), (sup.evidence, sup.notes)


def test_an_honest_run_with_runtime_effects_has_no_evidence(tmp_path: Path) -> None:
    """Exit handlers, threads, subprocesses, sys.path entries, logging, a forked child that exits: all fine."""
    code = """import atexit, logging, os, subprocess, sys, tempfile, threading
sys.path.append(tempfile.mkdtemp())
logging.getLogger("pkg").addHandler(logging.NullHandler())
atexit.register(print, "bye")
threading.Thread(target=lambda: None, daemon=True).start()
subprocess.run([sys.executable, "-c", "pass"], check=True)
pid = os.fork()
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
"""
    files = {"pkg.py": code, "tests/test_a.py": "import pkg\n\n\ndef test_it():\n    assert pkg\n"}
    for runner, cmd in (("pytest", f"{sys.executable} -m pytest -q -p no:cacheprovider --rootdir . tests"),
                        ("unittest", f"{sys.executable} -m unittest discover -s tests")):
        if runner == "unittest":
            files["tests/test_a.py"] = "import unittest\nimport pkg\n\n\nclass T(unittest.TestCase):\n" \
                                       "    def test_it(self):\n        self.assertTrue(pkg)\n"
        sup = supervise(tmp_path / runner, files, runner, cmd).sup
        assert sup.complete and not sup.evidence and not sup.blocked, (runner, sup.evidence, sup.blocked)
        assert list(sup.run.statuses.values()) == ["PASSED"], sup.run.statuses


def test_a_repository_that_is_the_runner_is_not_evidence_against_itself(tmp_path: Path) -> None:
    """pytest-dev/pytest's own rows: the runner imported from the repository registers its plugins from
    repository files as it runs; only what comes from outside the repository is compared."""
    import _pytest
    import pluggy

    work = tmp_path / "work"
    for mod in (pytest, _pytest, pluggy):  # the installed runner, copied into the repository (python -m finds it first)
        src = Path(mod.__file__).parent
        shutil.copytree(src, work / src.name, ignore=shutil.ignore_patterns("__pycache__"))
    files = {"tests/test_a.py": "import _pytest\n\n\ndef test_it():\n    assert _pytest.__file__.startswith('" +
             str(work) + "')\n"}
    sup = supervise(tmp_path, files, "pytest", f"{sys.executable} -m pytest -q -p no:cacheprovider --rootdir . tests").sup
    assert sup.complete and not sup.evidence and not sup.blocked, (sup.evidence, sup.blocked)
    assert sup.run.statuses == {"tests/test_a.py::test_it": "PASSED"}
    assert any("the runner is code under test" in n for n in sup.notes), sup.notes


def test_an_early_exit_is_an_incomplete_run_and_records_after_the_end_do_not_count(tmp_path: Path) -> None:
    files = {"tests/conftest.py": "import os\nos._exit(0)\n", "tests/test_a.py": "def test_it():\n    pass\n"}
    sup = supervise(tmp_path, files, "pytest", PYTEST).sup
    assert not sup.complete and not sup.run.statuses and sup.run.problems  # never a pass


def test_no_process_outlives_the_command(tmp_path: Path) -> None:
    """A double-forked daemon in a new session, started by the tests: killed before anything is read back."""
    marker = tmp_path / "late"
    # It waits for the test process to end, then writes: what a late forger of results would do.
    daemon = (f"import os, time\nparent = os.getpid()\nif os.fork() == 0:\n    os.setsid()\n"
              f"    if os.fork() == 0:\n        while os.path.exists('/proc/%d' % parent):\n"
              f"            time.sleep(0.05)\n        time.sleep(0.3)\n"
              f"        open({str(marker)!r}, 'w').write('late')\n        os._exit(0)\n    os._exit(0)\n")
    files = {"tests/test_a.py": daemon + "\n\ndef test_it():\n    pass\n"}
    sup = supervise(tmp_path, files, "pytest", PYTEST).sup
    assert sup.complete and sup.summary.get("killed_after", 0) >= 1, sup.summary
    time.sleep(1.0)
    assert not marker.exists()


def test_a_flood_on_the_channel_blocks_grading(tmp_path: Path) -> None:
    flood = """import os, stat
chunk = (b"x" * 1023 + b"\\n") * 1024
for fd in range(3, 1024):
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            for _ in range(40):
                os.write(fd, chunk)
    except OSError:
        pass
"""
    sup = supervise(tmp_path, {"tests/test_a.py": flood + "\n\ndef test_it():\n    pass\n"}, "pytest", PYTEST).sup
    assert sup.blocked and "cap" in sup.blocked[0] and sup.summary["overflow"] is True
    assert MAX_RECORD_BYTES < 40 << 20


def test_the_host_detects_a_changed_cut_or_missing_record(tmp_path: Path) -> None:
    ran = supervise(tmp_path, {"tests/test_a.py": "def test_it():\n    assert 1 == 2\n"}, "pytest", PYTEST)
    assert ran.record is not None and ran.sup.run.statuses == {"tests/test_a.py::test_it": "FAILED"}
    forged = ran.record.replace(b"\tFAILED\t", b"\tPASSED\t")
    assert forged != ran.record
    assert any("not written by the supervisor" in e for e in ran.reparse(forged).evidence)
    lines = ran.record.split(b"\n")
    appended = ran.record + lines[0] + b"\n"  # a valid line replayed at the end
    assert ran.reparse(appended).evidence
    cut = b"\n".join(lines[:-2]) + b"\n"  # without the summary
    assert ran.reparse(cut).blocked and not ran.reparse(cut).evidence
    assert "gone" in ran.reparse(None).blocked[0]
    with pytest.raises(GraderError, match="did not start"):
        ran.reparse(ran.record, stdout="K forged\n")
    with pytest.raises(GraderError, match="supervisor failed"):
        parse(ran.stdout, None, exit_code=70, stderr="Traceback", runner="pytest")
