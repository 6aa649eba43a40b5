"""``cluster.start_ray`` with ``cluster.train_head``: ``lego train`` starts the Ray cluster on the training nodes
itself (over SSH), and stops what it started when the run ends, however it ends.

One ``ray start --block`` per node, each under ``ray_node_agent.py`` (its docstring says why): the head on
``cluster.train_head``, then a worker on each of ``cluster.train_workers``. A node whose address is this machine's
runs its agent here, without SSH (the reference example launches from the first training node); when none of
them is this machine, a resourceless Ray node starts here too (``--num-cpus=0 --num-gpus=0``: a Ray driver must
run on a node of its cluster, and nothing is placed on it). Readiness is ``ray start``'s own "Ray runtime
started." line, printed once the node's raylet is registered with the head; ``cluster.actors`` then joins
the cluster and checks that every node is alive in it.

SSH is OpenSSH (``ssh`` with ``cluster.ssh_port`` and ``cluster.ssh_config``), as for the sunabako sandbox nodes
and ``lego validate --remote``: docs/cluster.md says why not fabric. Variables ``RAY_*`` of ``lego train``'s
environment (``RAY_TMPDIR``, ``RAY_AUTH_MODE``, ...) are passed to every node's ``ray start``: the nodes and the
driver must agree on them. No Ray import here: this module only starts and stops processes.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from lego_rl.config.remote import (
    RAY_PORT,
    is_local_address,
    local_address_towards,
    node_address,
    ssh_host_argv,
    ssh_try_command,
    training_nodes,
)
from lego_rl.config.schema import ClusterConfig
from lego_rl.errors import ConfigError
from lego_rl.driver.loop import TrainingError
from lego_rl.cluster.ray_node_agent import MARK

START_TIMEOUT_S = 180.0
"""How long a node's ``ray start`` may take until its raylet is registered with the head."""
STOP_TIMEOUT_S = 70.0
"""How long a node's agent may take to stop Ray (its SIGTERM grace, then SIGKILL) before its SSH is killed."""
AGENT = Path(__file__).with_name("ray_node_agent.py")
READY = "Ray runtime started."
_RAY_ENV = re.compile(r"RAY_[A-Z0-9_]+")


LegoErrorType = ConfigError | TrainingError


@dataclass(frozen=True)
class RayNode:
    """One node ``lego train`` starts Ray on."""

    host: str
    """As configured (an address or an SSH alias); ``driver`` for the resourceless node on this machine."""
    ip: str
    """The address Ray advertises for it (``--node-ip-address``)."""
    role: Literal["head", "worker", "driver"]
    key: str
    """The config key naming the node (what an error about it names)."""
    local: bool
    """This machine: its agent runs here, not over SSH."""

    @property
    def what(self) -> str:
        if self.role == "driver":
            return f"this machine ({self.ip}, the driver's own Ray node)"
        return f"training node {self.host} ({self.key}{', this machine' if self.local else ''})"


def plan_nodes(cl: ClusterConfig) -> list[RayNode]:
    """The nodes to start, the head first; a driver node last when none of them is this machine."""
    nodes: list[RayNode] = []
    for key, host in training_nodes(cl):
        ip = node_address(host, cl, key)
        if any(n.ip == ip for n in nodes):
            raise ConfigError(f"{key} = {host!r} is {ip}, a node already named (one Ray node per address)",
                              parameter=key, value=host)
        nodes.append(RayNode(host, ip, "head" if not nodes else "worker", key, is_local_address(ip)))
    if nodes and not any(n.local for n in nodes):
        mine = local_address_towards(nodes[0].ip)
        if mine is None:
            raise ConfigError(f"cluster.train_head = {nodes[0].host!r} ({nodes[0].ip}): this machine has no route "
                              "to it", parameter="cluster.train_head", value=nodes[0].host)
        nodes.append(RayNode("driver", mine, "driver", "cluster.train_head", True))
    return nodes


def ray_start_args(node: RayNode, head_ip: str) -> list[str]:
    """``ray start`` arguments of ``node`` (blocking: the agent's child lives as long as the node)."""
    common = ["--block", f"--node-ip-address={node.ip}", "--disable-usage-stats"]
    if node.role == "head":
        return ["start", "--head", f"--port={RAY_PORT}", "--include-dashboard=false", *common]
    extra = ["--num-cpus=0", "--num-gpus=0"] if node.role == "driver" else []
    return ["start", f"--address={head_ip}:{RAY_PORT}", *common, *extra]


@dataclass
class NodeProcess:
    """The agent of one node (run here, or ``ssh`` running it there) and what it printed."""

    node: RayNode
    argv: list[str]
    cl: ClusterConfig
    proc: subprocess.Popen[bytes] = field(init=False)
    lines: deque[str] = field(default_factory=lambda: deque(maxlen=60))
    hello: bool = False
    ready: threading.Event = field(default_factory=threading.Event)
    stopped: bool = False
    done: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        # Its own session: a Ctrl-C at the terminal reaches lego train, which stops the nodes in order; the
        # agents see only their stdin close.
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        threading.Thread(target=self._read, daemon=True, name=f"ray-node-{self.node.host}").start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            self.lines.append(line)
            if line.startswith(f"{MARK} started"):
                self.hello = True
            elif line.startswith(f"{MARK} stopped"):
                self.stopped = True
            elif READY in line:
                self.ready.set()
        self.proc.wait()
        self.done.set()

    def tail(self, n: int = 12) -> str:
        shown = [ln for ln in self.lines if ln.strip()][-n:]
        return " | ".join(shown)[-1500:] or "no output"

    def failure(self) -> LegoErrorType | None:
        """Why this node's agent has ended, or None while it runs."""
        if not self.done.is_set():
            return None
        rc = self.proc.returncode
        n = self.node
        if not n.local and rc == 255 and not self.hello:
            return ConfigError(f"cannot reach {n.what} over SSH: {self.tail(3)}; try by hand: "
                               f"`{ssh_try_command(n.host, self.cl)}` (cluster.ssh_port, cluster.ssh_config)",
                               parameter=n.key, value=n.host)
        if not self.hello:
            return ConfigError(f"cannot start Ray on {n.what}: `{sys.executable} {AGENT}` exited {rc}: "
                               f"{self.tail(3)}; the checkout and its virtual environment must be at the same "
                               "path on every node (docs/cluster.md)", parameter=n.key, value=n.host)
        if rc == 4:
            return ConfigError(f"cannot start Ray on {n.what}: {self.tail(1)}; install lego-rl[cluster] in the "
                               "same virtual environment path on every node", parameter=n.key, value=n.host)
        if self.ready.is_set():
            return TrainingError(f"Ray stopped on {n.what} during the run (exit {rc}): {self.tail()}")
        return TrainingError(f"`ray start` failed on {n.what} (exit {rc}): {self.tail()}")

    def begin_stop(self) -> None:
        """Close the agent's stdin: it stops Ray on its node."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()

    def finish_stop(self, deadline: float) -> str | None:
        """Wait for the agent; None when it confirmed Ray stopped (or Ray had ended before), else what is wrong."""
        if not self.done.wait(max(0.0, deadline - time.monotonic())):
            self.proc.kill()  # ssh (or the local agent): the remote agent sees its stdin close all the same
            self.proc.wait(10)
            self.done.wait(5)
            return f"{self.node.what}: no confirmation that Ray stopped within {STOP_TIMEOUT_S:g} s"
        if self.stopped or not self.hello or self.proc.returncode == 3:
            return None
        return f"{self.node.what}: the agent exited {self.proc.returncode} without confirming ({self.tail(3)})"


@dataclass
class RayNodes:
    """The Ray cluster ``lego train`` started: its address, and the node agents to stop at the end."""

    address: str
    nodes: list[NodeProcess]

    @property
    def expected(self) -> dict[str, str]:
        """The address of every node that must be alive in the cluster → what to call it in an error."""
        return {p.node.ip: p.node.what for p in self.nodes}

    def check(self) -> None:
        """Raise why, if a node's Ray has ended."""
        for p in self.nodes:
            failed = p.failure()
            if failed is not None:
                raise failed

    def stop(self) -> list[str]:
        """Stop Ray on every node (workers and this machine's node first, the head last); what went wrong."""
        problems: list[str] = []
        heads = [p for p in self.nodes if p.node.role == "head"]
        for batch in ([p for p in self.nodes if p not in heads], heads):
            for p in batch:
                p.begin_stop()
            deadline = time.monotonic() + STOP_TIMEOUT_S
            problems += [why for p in batch if (why := p.finish_stop(deadline)) is not None]
        return problems


def _wait_ready(procs: list[NodeProcess], timeout: float) -> None:
    """Until every node's raylet is registered with the head; the first failure (or the timeout) raises."""
    deadline = time.monotonic() + timeout
    while True:
        for p in procs:
            failed = p.failure()
            if failed is not None:
                raise failed
        late = [p for p in procs if not p.ready.is_set()]
        if not late:
            return
        if time.monotonic() > deadline:
            raise TrainingError(f"Ray on {late[0].node.what} did not join the cluster within {timeout:g} s "
                                f"(`ray start` output: {late[0].tail()})")
        late[0].ready.wait(0.1)


def _launch(node: RayNode, head_ip: str, cl: ClusterConfig) -> NodeProcess:
    ray = Path(sys.executable).with_name("ray")
    command = [sys.executable, str(AGENT), str(ray), *ray_start_args(node, head_ip)]
    if node.local:
        argv = command
    else:
        env = [f"{k}={v}" for k, v in sorted(os.environ.items()) if _RAY_ENV.fullmatch(k) and k != "RAY_ADDRESS"]
        remote = shlex.join(["env", *env, *command] if env else command)
        argv = ssh_host_argv(node.host, cl.ssh_port, cl.ssh_config, remote, 10)
        # The session lasts the whole run: keep-alives keep idle NAT/firewall state from dropping it, and make a
        # dead link end this ssh (the agent there sees its stdin close and stops Ray) rather than hang.
        argv[1:1] = ["-o", "ServerAliveInterval=30", "-o", "ServerAliveCountMax=4"]
    p = NodeProcess(node, argv, cl)
    p.start()
    return p


def start_ray_nodes(cl: ClusterConfig, *, timeout: float = START_TIMEOUT_S) -> RayNodes:
    """Start the head, then every other node; return once each one's raylet is registered with the head.

    A node that cannot be reached over SSH, or whose ``ray start`` fails or does not finish within ``timeout``,
    is an error naming it, raised after everything already started has been stopped again.
    """
    ray = Path(sys.executable).with_name("ray")
    if not ray.is_file():
        raise ConfigError(f"cluster.start_ray with cluster.train_head needs Ray's `ray` at {ray} (pip install "
                          "'lego-rl[cluster]')", parameter="cluster.start_ray", value=True)
    plan = plan_nodes(cl)
    head = plan[0]
    started: list[NodeProcess] = []
    try:
        started.append(_launch(head, head.ip, cl))
        _wait_ready(started, timeout)  # the workers need the head's GCS
        for n in plan[1:]:
            started.append(_launch(n, head.ip, cl))
        _wait_ready(started, timeout)
    except BaseException:
        RayNodes("", started).stop()
        raise
    return RayNodes(f"{head.ip}:{RAY_PORT}", started)
