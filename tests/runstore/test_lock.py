"""The run directory's lock (``runstore.lock``) between real processes: a second opener is refused with the
holder named, a holder killed with SIGKILL releases it, and the next opener names the dead one."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lego_rl.errors import RunDirLocked
from lego_rl.runstore import RunDir, read_events
from lego_rl.runstore.lock import RunLock, read_holder

HOLD = """
import sys, time
from pathlib import Path
from lego_rl.runstore import RunDir
run = RunDir.open(Path(sys.argv[1]), config={}, resume=sys.argv[2] == "resume")
print("locked", flush=True)
time.sleep(600)
"""

OPEN = """
import sys
from pathlib import Path
from lego_rl.runstore import RunDir
RunDir.open(Path(sys.argv[1]), config={}, resume=True).close()
"""


def _holder(root: Path, mode: str = "new") -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(root), mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked", proc.stderr
    return proc


def test_second_process_is_refused_naming_the_holder_and_a_killed_holder_releases(tmp_path: Path) -> None:
    root = tmp_path / "run"
    first = _holder(root)
    try:
        other = subprocess.run([sys.executable, "-c", OPEN, str(root)], capture_output=True, text=True)
        assert other.returncode != 0
        assert "RunDirLocked" in other.stderr and f"pid {first.pid} on {socket.gethostname()}, since" in other.stderr
        with pytest.raises(RunDirLocked, match=f"in use by pid {first.pid} "):
            RunDir.open(root, config={}, resume=True)
        assert not (root / "config.resume-1.json").exists()  # the refused opener wrote nothing
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # The kernel released the flock; the file still names the dead holder, and the taker says so.
    assert read_holder(root) is not None and read_holder(root).pid == first.pid  # type: ignore[union-attr]
    # The dead holder had published step 2's checkpoint: the taker continues with step 3, and says so.
    (root / "checkpoints" / "step-000002").mkdir(parents=True)
    (root / "checkpoints" / "latest").write_text("step-000002\n")
    second = _holder(root, "resume")
    second.send_signal(signal.SIGKILL)
    second.wait()
    kinds = [(e.kind, getattr(e, "previous_pid", None), getattr(e, "step", None))
             for e in read_events(root / "events.jsonl")]
    assert kinds == [("run_started", None, None), ("stale_lock_taken", first.pid, 3),
                     ("run_resumed", None, None)]


def test_clean_close_names_nobody_and_releases(tmp_path: Path) -> None:
    root = tmp_path / "run"
    run = RunDir.open(root, config={})
    assert run.lock is not None and run.lock.holder.pid == os.getpid()
    with pytest.raises(RunDirLocked):  # a second open file description is refused even in one process
        RunLock.acquire(root)
    run.close()
    assert read_holder(root) is None
    again = RunDir.open(root, config={}, resume=True)
    again.close()
    assert [e.kind for e in read_events(root / "events.jsonl")] == ["run_started", "run_resumed"]


def test_a_refused_fresh_run_releases_the_lock(tmp_path: Path) -> None:
    root = tmp_path / "run"
    RunDir.open(root, config={}).close()
    with pytest.raises(Exception, match="never overwritten"):
        RunDir.open(root, config={})
    lock = RunLock.acquire(root)  # not left held by the refused open
    lock.release()
    assert time.time() >= lock.holder.since
