"""SIGTERM to `lego rollout-check` cleans up like Ctrl-C: a real `lego` process, stopped mid-rollout.

Issue 18: SIGTERM (what a scheduler or `kill` sends) ended the process at once, leaking the agent
sandbox's overlay mount and bwrap state and writing no outcome. Now it cancels the run: the rollout
cleans up its sandbox, saves its artifacts and an ``interrupted`` outcome, the report is written, and the
process exits 143. The policy is the scripted TEST DOUBLE at the model boundary, served over vLLM's
generate route from this process; everything else (CLI, adapter, sandbox) is real and in the `lego`
process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO
from support.scripted_engine import tool_call_text
from test_rollout_check_cli import engine_thread  # noqa: F401 - the fixture

from lego_rl.sandbox.bwrap_state import DEFAULT_STATE_ROOT, destroy_state, list_state

pytestmark = [pytest.mark.slow, pytest.mark.cli, pytest.mark.root]


def sandboxes_of(pid: int) -> list[Any]:
    return [e for e in list_state(DEFAULT_STATE_ROOT) if e.owner_pid == pid]


def leftovers(paths: list[str]) -> tuple[list[str], list[int]]:
    """Mounts and processes that still name one of ``paths`` (a sandbox's state dir)."""
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if any(p in line for p in paths)]
    procs = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if any(p in cmdline for p in paths):
                procs.append(int(entry))
    return mounts, procs


def test_sigterm_mid_rollout_cleans_up_and_saves_the_outcome(
    engine_thread: Any, toolchain: Any, tmp_path: Path  # noqa: F811
) -> None:
    def policy(prompt: str, index: int) -> str:
        # Claude Code refuses a plain long `sleep`; a Python one holds its Bash tool.
        return tool_call_text(
            "Bash", {"command": "python3 -c 'import time; time.sleep(3600)'", "description": "wait"}
        )

    engine = engine_thread(policy)
    run_root = tmp_path / "run"
    lego = Path(sys.executable).with_name("lego")
    args = [
        str(lego), "rollout-check", "-c", "lego.toml", "--ids", "lego-example-median", "-n", "1",
        "--harness", "claude_code", "--vllm-url", engine.url, "--json",
        "--set", f'paths.run_root="{run_root}"', "--set", "adapter.port=0",
        "--set", "model.max_response_tokens=1024", "--set", "agent.time_budget_s=600",
    ]  # fmt: skip
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen: list[Any] = []
    try:
        deadline = time.monotonic() + 240
        while not engine.engine.calls and time.monotonic() < deadline and proc.poll() is None:
            seen = sandboxes_of(proc.pid) or seen
            time.sleep(0.2)
        assert engine.engine.calls, f"the CLI never asked the policy: {proc.poll()}"
        time.sleep(3)  # the CLI runs the policy's tool call now
        seen = sandboxes_of(proc.pid) or seen
        assert seen, "no sandbox of the lego process while its CLI ran"
        proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        out, err = proc.communicate(timeout=120)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for entry in sandboxes_of(proc.pid):  # a safety net for this machine: the assertions below report it
            destroy_state(entry.path)
    stderr = err.decode(errors="replace")
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, stderr[-3000:])
    assert took < 90, took
    assert "stopped by SIGTERM" in stderr
    # Nothing left: no state dir, no overlay mount, no process of the sandbox.
    paths = [str(e.path) for e in seen]
    assert not [p for p in paths if Path(p).exists()], paths
    mounts, procs = leftovers(paths)
    assert not mounts and not procs, (mounts, procs)
    # The outcome: in the report, in the rollout's folder and in the event log.
    [result] = [json.loads(line) for line in (run_root / "rollout-check" / "outcomes.jsonl").read_text().splitlines()]
    assert result["termination"] == "interrupted" and result["infrastructure_failure"], result
    folder = run_root / "sandboxes" / "lego-example-median-s0"
    assert json.loads((folder / "outcome.json").read_text())["termination"] == "interrupted"
    names = {p.name for p in folder.iterdir()}
    assert {"commands-agent.jsonl", "patch.diff"} <= names, sorted(names)
    events = [json.loads(line) for line in (run_root / "events.jsonl").read_text().splitlines()]
    kinds = [e["kind"] for e in events]
    assert "rollout_finished" in kinds and kinds[-1] == "rollout_check_finished", kinds[-5:]
