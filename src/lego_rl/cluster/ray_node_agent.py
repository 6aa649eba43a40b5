"""Runs ``ray start --block ...`` on one node for ``lego train`` and stops it when its stdin closes.

Run as a script (``python ray_node_agent.py [--grace S] RAY_BINARY start --block ...``), over SSH on a training
node or locally, by ``lego_rl.cluster.ray_nodes``. It imports nothing from lego_rl: only the interpreter and this
file have to be at the same path on the node, which cluster mode asks for anyway.

Why an agent and not plain ``ssh node ray start``: without a terminal, closing an SSH session sends the remote
command no signal, and ``ray stop`` ends *every* Ray process of the node's user (another job's too). Here the
session's stdin is a dead man's switch: ``lego train`` closing it (at the end, on Ctrl-C or a failure), the
``lego train`` process dying (its end of the pipe closes with it) or the SSH link dropping all end in the same
place: SIGTERM to the ``ray start`` it started (Ray drains and stops the node's raylet, GCS, workers), then
SIGKILL to whatever of that process tree is still there after ``STOP_GRACE_S``. Nothing else is touched.

Output: ``ray start``'s own lines, relayed, plus lines starting with ``@@lego-ray-node``: ``started PID`` first,
``exited CODE`` when Ray ended by itself, ``stopped`` after a requested stop. Exit codes: 0 stopped on request,
3 Ray exited by itself, 4 the Ray binary is missing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

MARK = "@@lego-ray-node"
STOP_GRACE_S = 45.0
"""SIGTERM → SIGKILL: Ray drains a node for up to 30 s before it stops it."""


def _say(text: str) -> None:
    with contextlib.suppress(OSError):  # lego train may be gone already (its end of the pipe closed)
        sys.stdout.write(f"{MARK} {text}\n")
        sys.stdout.flush()


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat): a pid reused by another process differs."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _tree(root: int) -> dict[int, str]:
    """``root`` and its descendants, pid → start time, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
    out: dict[int, str] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        started = _start_time(pid)
        if started is not None and pid not in out:
            out[pid] = started
            todo.extend(children.get(pid, []))
    return out


def _alive(procs: dict[int, str]) -> dict[int, str]:
    """The members of a snapshot still running as the same processes (not zombies, not a reused pid)."""
    out = {}
    for pid, started in procs.items():
        with contextlib.suppress(OSError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z" and fields[19] == started:
                out[pid] = started
    return out


def main(argv: list[str]) -> int:
    grace = STOP_GRACE_S
    if argv[:1] == ["--grace"]:  # tests: how a node whose Ray ignores SIGTERM is stopped, without the wait
        grace, argv = float(argv[1]), argv[2:]
    if not argv or not Path(argv[0]).is_file():
        _say(f"missing {argv[0] if argv else 'RAY_BINARY'}")
        return 4
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    _say(f"started {proc.pid}")

    def relay() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with contextlib.suppress(OSError):
                sys.stdout.buffer.write(line)
                sys.stdout.flush()

    stop = threading.Event()

    def watch_stdin() -> None:
        with contextlib.suppress(OSError):
            while os.read(0, 4096):
                pass
        stop.set()

    relaying = threading.Thread(target=relay, daemon=True)
    relaying.start()
    threading.Thread(target=watch_stdin, daemon=True).start()
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while proc.poll() is None and not stop.wait(0.2):
        pass
    if not stop.is_set():
        relaying.join(5)  # Ray's last lines say why it ended: before our own
        _say(f"exited {proc.returncode}")
        return 3
    tree = _tree(proc.pid)  # before the signal: once Ray's leader is gone its children are re-parented
    proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(grace)
    deadline = time.monotonic() + (10.0 if proc.poll() is not None else 0.0)
    while _alive(tree) and time.monotonic() < deadline:  # the leader is gone; its agents stop on their own
        time.sleep(0.2)
    for pid in _alive(tree):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
    _say("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
