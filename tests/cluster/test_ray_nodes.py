"""The pieces of ``cluster.start_ray`` over SSH that need no second host: which nodes Ray is started on and at
which address, the ``ray start`` arguments, and the node agent's stop (its dead man's switch and its SIGKILL
escalation) on real processes. The end-to-end runs over SSH are tests/cluster/test_start_ray.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lego_rl.config.schema import ClusterConfig
from lego_rl.errors import ConfigError
from lego_rl.cluster.ray_node_agent import MARK
from lego_rl.cluster.ray_nodes import AGENT, RayNode, plan_nodes, ray_start_args


def _ssh_config(tmp_path: Path, **aliases: str) -> str:
    path = tmp_path / "ssh_config"
    path.write_text("".join(f"Host {a}\n    HostName {h}\n    Port 22\n" for a, h in aliases.items()))
    return str(path)


def test_a_head_on_this_machine_runs_here_and_needs_no_driver_node() -> None:
    [head] = plan_nodes(ClusterConfig(mode="ray", train_head="127.0.0.1"))
    assert head == RayNode("127.0.0.1", "127.0.0.1", "head", "cluster.train_head", True)


def test_ssh_aliases_resolve_to_their_hostname_and_one_address_is_one_node(tmp_path: Path) -> None:
    cfg = _ssh_config(tmp_path, gpu1="127.0.0.1", gpu2="127.0.0.1")
    with pytest.raises(ConfigError) as err:
        plan_nodes(ClusterConfig(mode="ray", train_head="gpu1", train_workers=["gpu2"], ssh_config=cfg))
    assert str(err.value).startswith("cluster.train_workers = 'gpu2' is 127.0.0.1, a node already named")
    assert err.value.parameter == "cluster.train_workers"


def test_an_unresolvable_node_is_named_with_its_key() -> None:
    with pytest.raises(ConfigError) as err:
        plan_nodes(ClusterConfig(mode="ray", train_head="127.0.0.1", train_workers=["no-such-node.invalid"]))
    assert str(err.value).startswith("cluster.train_workers = 'no-such-node.invalid': cannot resolve "
                                     "'no-such-node.invalid' to an address")


def test_ray_start_arguments_per_role() -> None:
    head = RayNode("h", "10.0.0.1", "head", "cluster.train_head", False)
    worker = RayNode("w", "10.0.0.2", "worker", "cluster.train_workers", False)
    driver = RayNode("driver", "10.0.0.9", "driver", "cluster.train_head", True)
    assert ray_start_args(head, "10.0.0.1") == [
        "start", "--head", "--port=6379", "--include-dashboard=false", "--block", "--node-ip-address=10.0.0.1",
        "--disable-usage-stats"]
    assert ray_start_args(worker, "10.0.0.1") == [
        "start", "--address=10.0.0.1:6379", "--block", "--node-ip-address=10.0.0.2", "--disable-usage-stats"]
    # The driver's own node holds nothing the placement groups could use.
    assert ray_start_args(driver, "10.0.0.1")[-2:] == ["--num-cpus=0", "--num-gpus=0"]


STUBBORN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                          "signal.SIG_IGN); time.sleep(600)"])
print("pids", os.getpid(), child.pid, flush=True)
print("Ray runtime started.", flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_agent_kills_a_node_that_ignores_sigterm_once_its_stdin_closes(tmp_path: Path) -> None:
    """A stand-in for ``ray start`` that ignores SIGTERM, with a child that does too (real Ray honours SIGTERM:
    this is the path where it does not): closing the agent's stdin ends both, and the agent says so."""
    stub = tmp_path / "stubborn-ray"
    stub.write_text(f"#!{sys.executable}\n{STUBBORN}")
    stub.chmod(0o755)
    agent = subprocess.Popen([sys.executable, str(AGENT), "--grace", "1", str(stub)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert agent.stdin is not None and agent.stdout is not None
    lines = [agent.stdout.readline() for _ in range(3)]
    assert lines[0].startswith(f"{MARK} started ") and lines[2] == "Ray runtime started.\n", lines
    pids = [int(p) for p in lines[1].split()[1:]]
    assert all(_alive(p) for p in pids)
    t0 = time.monotonic()
    agent.stdin.close()
    rest = agent.stdout.read()
    assert agent.wait(30) == 0 and rest.endswith(f"{MARK} stopped\n"), rest
    assert time.monotonic() - t0 < 15
    assert not [p for p in pids if _alive(p)]


def test_the_agent_reports_ray_ending_by_itself_and_a_missing_binary(tmp_path: Path) -> None:
    stub = tmp_path / "failing-ray"
    stub.write_text(f"#!{sys.executable}\nimport sys\nprint('port 6379 already in use')\nsys.exit(1)\n")
    stub.chmod(0o755)
    agent = subprocess.Popen([sys.executable, str(AGENT), str(stub)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)  # stdin stays open: Ray ends by itself, nobody asked it to stop
    assert agent.stdout is not None
    out = agent.stdout.read()
    assert agent.wait(30) == 3 and out.endswith(f"port 6379 already in use\n{MARK} exited 1\n"), out
    done = subprocess.run([sys.executable, str(AGENT), "/opt/nowhere/ray"], capture_output=True, text=True,
                          timeout=30, env={**os.environ})
    assert done.returncode == 4 and done.stdout == f"{MARK} missing /opt/nowhere/ray\n"
