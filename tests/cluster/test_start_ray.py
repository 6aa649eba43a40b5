"""``cluster.start_ray`` with ``cluster.train_head``: ``lego train`` starts Ray on a training node over SSH, trains
on it, and stops everything it started, also when a node cannot be reached.

The node is real (tests/support/sshnode.py): an sshd in its own network namespace behind a veth pair, reached with
OpenSSH through the test's SSH client config, sharing this filesystem (so the venv's ``ray`` runs there). ``lego
train`` itself runs in the client-side namespace: the only addresses there and on the node are loopback and the
veth pair's, so Ray listens on nothing else. What runs on the node: the Ray head (``ray start --head`` under
lego's node agent, started over SSH), the trainer rank and the engine replica; here: the driver and a
resourceless Ray node for it (a driver must run on a node of its cluster).

Times here (2 shared cores): the run ~30 s (Ray's head over SSH, the driver's node, two toy steps), a failing
start 4-11 s, a run stopped mid-way ~33 s.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.sshnode import SshNode, missing_requirements, netns_pids, ssh_node

from lego_rl.driver.toy_env import make_rows

BIN = Path(sys.executable).parent

TOML = """
[serving]
device = "cpu"
port = 0

[sandbox]
provider = "bwrap"

[rollout]
prompt_data = "toy.jsonl"
batch_size = 2
samples_per_prompt = 4
top_p = 1.0
max_staleness = 0

[train]
environment = "first_letter"
num_rollout = 2

[paths]
run_root = "runs/toy"

[cluster]
mode = "ray"
start_ray = true
cpus_per_actor = 0.5
train_head = "{head}"
ssh_config = "{ssh_config}"
"""


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SshNode]:
    if (why := missing_requirements()) is not None:
        pytest.fail(f"{why} (make system-deps)")
    pytest.importorskip("ray", reason="the `cluster` extra (make test-deps installs it)")
    with ssh_node(tmp_path / "node", name="train-head") as n:
        yield n


@pytest.fixture
def ray_tmp() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="lego-sr-", dir="/tmp")  # short: Ray's socket paths live under it
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _workdir(root: Path, node: SshNode, **cluster: object) -> Path:
    root.mkdir()
    (root / "toy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in make_rows(8, letters="a")))
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in cluster.items())
    (root / "lego.toml").write_text(TOML.format(head=node.alias, ssh_config=node.ssh_config) + extra)
    return root


def _env(ray_tmp: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LEGO_", "SWE_", "ADAPTER_", "RAY_", "TRAIN_", "SUNABAKO_"))
           and k not in {"PROMPT_DATA", "RUN_ROOT", "RUN_LOG", "HF_CHECKPOINT", "DATA_ROOT"}}
    # RAY_*: lego passes them on to every node's `ray start` (the session files go under the test's directory).
    return {**env, "OMP_NUM_THREADS": "1", "RAY_TMPDIR": ray_tmp, "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0"}


def _lego_train(node: SshNode, work: Path, ray_tmp: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``lego train`` in the client-side namespace (the driver's host), as an operator runs it there."""
    return subprocess.run(["ip", "netns", "exec", node.client_ns, str(BIN / "lego"), "train", "-c", "lego.toml",
                           "--json"], cwd=work, env=_env(ray_tmp), capture_output=True, text=True, timeout=timeout)


def _left_running(node: SshNode, ray_tmp: str) -> list[str]:
    """Every process of this test's Ray still alive: anything but sshd on the node or in the client namespace,
    and anything on this machine whose command line names the test's Ray directory."""
    out = []
    for ns in (node.client_ns, node.node_ns):
        for pid in netns_pids(ns):
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if not comm.startswith("sshd"):
                out.append(f"{ns} {pid} {cmd[:200]}")
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if ray_tmp in cmd:
                out.append(f"{proc.name} {cmd[:200]}")
    return out


def _settle(node: SshNode, ray_tmp: str, seconds: float = 10) -> list[str]:
    """What is still running once processes that are on their way out had ``seconds`` to go."""
    deadline = time.monotonic() + seconds
    while (left := _left_running(node, ray_tmp)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


@pytest.mark.root
@pytest.mark.timeout(900)
def test_lego_train_starts_ray_on_the_head_over_ssh_trains_and_stops_it(tmp_path: Path, node: SshNode,
                                                                      ray_tmp: str) -> None:
    work = _workdir(tmp_path / "run", node)
    t0 = time.monotonic()
    res = _lego_train(node, work, ray_tmp)
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-4000:]
    summary = json.loads(res.stdout)
    assert summary["status"] == "completed" and summary["steps_done"] == 2 and summary["weight_version"] == 2
    # The engine replica served from the node: its URL is the node's address, not this side's.
    events = (work / "runs/toy/events.jsonl").read_text()
    urls = [json.loads(line)["serving"] for line in events.splitlines() if '"serving_ready"' in line]
    assert urls and all(u.startswith(f"http://{node.address}:") for u in urls[0]), urls
    # Ray's head ran there: its session (under RAY_TMPDIR, passed on over SSH) names the node's address.
    sessions = [p for p in Path(ray_tmp, "ray").glob("session_2*") if p.is_dir() and not p.is_symlink()]
    assert len(sessions) == 1, sessions  # the cluster's session (the driver's node joined it)
    gcs = sessions[0] / "logs" / "gcs_server.out"
    assert node.address in gcs.read_text(errors="replace"), gcs.read_text(errors="replace")[-2000:]
    left = _settle(node, ray_tmp)
    print(f"lego train with Ray started over SSH: {took:.0f} s; left running afterwards: {left}")
    assert not left


@pytest.mark.root
@pytest.mark.timeout(900)
def test_the_reference_layout_head_here_and_a_worker_over_ssh(tmp_path: Path, node: SshNode, ray_tmp: str) -> None:
    """The reference example's launch: `lego train` on TRAIN_HEAD (this side's address: Ray's head starts here,
    without SSH), a worker on TRAIN_WORKER over SSH; one engine replica on each node (STRICT_SPREAD), so the
    weights of every step travel to the other node through Ray's object store."""
    here = str(ipaddress.ip_address(node.address) - 1)  # the client side of the veth /30
    work = _workdir(tmp_path / "run", node, train_workers=[node.alias], engine_replicas=2,
                    engine_placement="STRICT_SPREAD")
    text = (work / "lego.toml").read_text().replace(f'train_head = "{node.alias}"', f'train_head = "{here}"')
    (work / "lego.toml").write_text(text)
    t0 = time.monotonic()
    res = _lego_train(node, work, ray_tmp)
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-4000:]
    summary = json.loads(res.stdout)
    assert summary["status"] == "completed" and summary["steps_done"] == 2 and summary["weight_version"] == 2
    events = (work / "runs/toy/events.jsonl").read_text()
    [urls] = [json.loads(line)["serving"] for line in events.splitlines() if '"serving_ready"' in line]
    assert sorted(u.split("//")[1].split(":")[0] for u in urls) == sorted([here, node.address]), urls
    left = _settle(node, ray_tmp)
    print(f"head here, worker over SSH, an engine on each: {took:.0f} s; left running afterwards: {left}")
    assert not left


@pytest.mark.root
def test_an_unreachable_head_is_named_with_the_command_to_try_and_nothing_starts(tmp_path: Path, node: SshNode,
                                                                               ray_tmp: str) -> None:
    node.kill_sshd()
    work = _workdir(tmp_path / "run", node)
    res = _lego_train(node, work, ray_tmp, timeout=120)
    said = " ".join(res.stderr.split())
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-3000:]
    assert f"cannot reach training node {node.alias} (cluster.train_head) over SSH" in said, said
    assert f"try by hand: `ssh -F {node.ssh_config} -p 22 -o BatchMode=yes -o ConnectTimeout=10 {node.alias} true`" \
        in said, said
    assert not _settle(node, ray_tmp)


@pytest.mark.root
@pytest.mark.timeout(600)
def test_a_worker_that_never_joins_stops_the_head_already_started(tmp_path: Path, node: SshNode,
                                                                  ray_tmp: str) -> None:
    """The head starts over SSH, the worker's SSH fails: the error names the worker, and the head is stopped."""
    config = node.ssh_config.read_text()
    block = config[config.index(f"Host {node.alias}"):]
    # An alias whose address has no route from the driver's side (the veth pair is a /30): ssh fails at once.
    dead = "lego-dead-worker"
    node.ssh_config.write_text(config + "\n" + block.replace(f"Host {node.alias}", f"Host {dead}")
                               .replace(f"HostName {node.address}", "HostName 10.250.0.9"))
    work = _workdir(tmp_path / "run", node, train_workers=[dead])
    res = _lego_train(node, work, ray_tmp, timeout=300)
    said = " ".join(res.stderr.split())
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-3000:]
    assert f"cannot reach training node {dead} (cluster.train_workers) over SSH" in said, said
    assert "ssh: connect to host 10.250.0.9 port 22" in said, said
    # The head had started (its session dir exists) and is gone again.
    assert [p for p in Path(ray_tmp, "ray").glob("session_2*") if p.is_dir()], sorted(Path(ray_tmp).iterdir())
    assert not _settle(node, ray_tmp)


@pytest.mark.root
@pytest.mark.timeout(600)
@pytest.mark.parametrize("sig", [
    # Ctrl-C ends in the same `finally` as a normal end (the first test): CI runs only the SIGKILL case.
    pytest.param(signal.SIGINT, id="ctrl-c", marks=pytest.mark.slow),
    pytest.param(signal.SIGKILL, id="kill-9"),
])
def test_a_run_stopped_or_killed_mid_run_leaves_nothing_running(tmp_path: Path, node: SshNode, ray_tmp: str,
                                                               sig: signal.Signals) -> None:
    """Ctrl-C: lego train stops the run and then Ray on the nodes. SIGKILL: lego train cannot stop anything, but
    its end of each node agent's stdin closes with it, and the agents stop Ray (here and on the node)."""
    work = _workdir(tmp_path / "run", node)
    (work / "lego.toml").write_text((work / "lego.toml").read_text().replace("num_rollout = 2", "num_rollout = 50"))
    proc = subprocess.Popen(["ip", "netns", "exec", node.client_ns, str(BIN / "lego"), "train", "-c", "lego.toml",
                             "--json"], cwd=work, env=_env(ray_tmp), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    events = work / "runs/toy/events.jsonl"
    deadline = time.monotonic() + 300
    while not (events.exists() and '"serving_ready"' in events.read_text()):  # Ray is up, the actors placed
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.5)
    assert _left_running(node, ray_tmp), "no Ray process seen while the run is on: the check below proves nothing"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=240)
    t0 = time.monotonic()
    left = _settle(node, ray_tmp, seconds=60)
    print(f"{sig.name}: lego train exited {proc.returncode}; Ray gone {time.monotonic() - t0:.1f} s later: {left}")
    assert not left, err[-3000:]
