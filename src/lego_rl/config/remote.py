"""Checks that touch the network, run by ``lego validate --remote`` only, each within a timeout.

They test what must already exist before a launch: the health of every configured vLLM server; every
sandbox node of cluster.json (sunabako): reachable over SSH (OpenSSH with ``cluster.ssh_config``, the
transport the sunabako SDK uses), its sunabako binary there and initialised, room for one more sandbox,
the settings the provider needs, and the root filesystems of ``sandbox.images`` at the same paths, one
finding per failure naming the node; (``cluster.mode = "ray"`` with ``cluster.ray_address``) the Ray
cluster's alive nodes against the placement groups ``lego train`` will ask for; and (``cluster.start_ray`` with
``cluster.train_head``) each training node ``lego train`` would start Ray on over SSH: it answers, with ``ray``
at this machine's path. Never the adapter: the job itself starts it, so before launch its
address answering would mean another job holds the port, not that this one is ready."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import math
import shlex
import socket
import subprocess
import sys
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from lego_rl.config.checks import opens_sandboxes
from lego_rl.config.findings import Finding, error
from lego_rl.config.placement import key_for, placement_plan, shortfalls
from lego_rl.config.resolve import ResolvedConfig
from lego_rl.config.schema import ClusterConfig
from lego_rl.errors import ConfigError


async def _http_ok(url: str, timeout: float) -> str | None:
    """None when ``url`` answers 2xx, else the reason."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http:
            async with http.get(url) as resp:
                return None if resp.status < 300 else f"HTTP {resp.status}"
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except aiohttp.ClientError as exc:
        return str(exc) or type(exc).__name__


@dataclass(frozen=True)
class NodeTarget:
    """One sandbox node of cluster.json, as ``lego validate --remote`` checks it."""

    name: str
    host: str
    port: int
    state_dir: str
    binary: str


# One SSH session checks the node: the binary, then its capacity (JSON), then each image rootfs. Markers
# split the output, so one round trip answers everything (each connection costs a key exchange).
_NODE_SCRIPT = """
b="$1"; s="$2"; shift 2
if [ ! -x "$b" ]; then echo "@@binary-missing"; exit 0; fi
echo "@@capacity"; "$b" --state "$s" capacity 2>&1; echo "@@capacity-exit $?"
echo "@@images"; for p in "$@"; do [ -d "$p" ] || echo "$p"; done
"""


def ssh_argv(node: NodeTarget, ssh_config: str | None, command: str, timeout: float) -> list[str]:
    """The OpenSSH command the sunabako SDK runs for every RPC to ``node`` (plus ``-F`` for cluster.ssh_config).

    Not fabric/paramiko: paramiko expands a config's ``ProxyCommand %p`` from the config file's port, not
    the node's, and accepts unknown host keys, so it can pass a node the rollouts then cannot reach."""
    return ssh_host_argv(node.host, node.port, ssh_config, command, timeout)


def ssh_host_argv(host: str, port: int, ssh_config: str | None, command: str, timeout: float) -> list[str]:
    """OpenSSH running the shell ``command`` on ``host`` (non-interactive: no password prompt, no terminal)."""
    config = ["-F", ssh_config] if ssh_config else []
    return ["ssh", *config, "-p", str(port), "-o", "BatchMode=yes", "-o",
            f"ConnectTimeout={max(1, math.ceil(timeout))}", host, command]


async def _node_findings(node: NodeTarget, ssh_config: str | None, memory_mb: int, test_memory: bool,
                         rootfs: list[str], timeout: float) -> list[Finding]:
    """Every finding about one node: reachable, sunabako installed and initialised, room for a sandbox,
    the settings the provider needs, and the images' root filesystems present at the same paths."""
    what = f"ssh {node.host}:{node.port} (node {node.name})"
    fix_key = "sandbox.cluster"
    script = shlex.join(["sh", "-c", _NODE_SCRIPT, "sh", node.binary, node.state_dir, *rootfs])
    proc = await asyncio.create_subprocess_exec(
        *ssh_argv(node, ssh_config, script, timeout), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), max(timeout, 30.0))
    except TimeoutError:
        proc.kill()
        await proc.wait()
        out, err = b"", f"no answer within {max(timeout, 30.0):g} s".encode()
    text, errors = out.decode(errors="replace"), err.decode(errors="replace").strip()
    if proc.returncode == 255 or "@@" not in text:  # 255: ssh itself failed (the command never ran)
        return [error("unreachable", f"{what}: {errors[-400:] or f'ssh exited {proc.returncode}'}",
                      "check the address, that sshd runs there, the SSH credentials (cluster.ssh_config) and "
                      "firewalls", fix_key, "cluster.ssh_config")]
    if proc.returncode != 0:
        return [error("node_check_failed", f"{what}: the node check exited {proc.returncode}: {errors[-300:]}",
                      "check the node's shell", fix_key)]
    if "@@binary-missing" in text:
        return [error("node_binary_missing", f"{what}: no executable sunabako binary at {node.binary}",
                      "install sunabako on the node, or set the node's `binary` in cluster.json", fix_key)]
    capacity = text.partition("@@capacity\n")[2].partition("@@capacity-exit ")[0]
    exit_line = text.partition("@@capacity-exit ")[2].split("\n", 1)[0].strip()
    missing_images = [line for line in text.partition("@@images\n")[2].splitlines() if line.strip()]
    findings: list[Finding] = []
    if exit_line != "0":
        uninit = "node.json" in capacity
        findings.append(error(
            "node_uninitialised" if uninit else "node_capacity_failed",
            f"{what}: `sunabako --state {node.state_dir} capacity` exited {exit_line}: {capacity.strip()[-300:]}",
            "initialise the node (sunabako --state DIR init-node -) with the configuration docs/sandboxes.md "
            "gives" if uninit else "check the node's sunabako state dir and binary", fix_key))
    else:
        findings += _capacity_findings(what, capacity, memory_mb, test_memory)
    if missing_images:
        shown = ", ".join(missing_images[:3]) + (f" and {len(missing_images) - 3} more" if len(missing_images) > 3
                                                 else "")
        findings.append(error("node_images_missing", f"{what}: {len(missing_images)} of {len(rootfs)} image root "
                              f"filesystems of sandbox.images are missing there: {shown}",
                              "import the images on every node at the same absolute path (lego images)",
                              "sandbox.images"))
    return findings


def _capacity_findings(what: str, text: str, memory_mb: int, test_memory: bool) -> list[Finding]:
    try:
        cap = json.loads(text)
        cfg = cap["config"]
        free = int(cfg["memory_capacity_bytes"] * cfg.get("memory_overcommit", 1) - cap["memory_reserved"])
        active, most = int(cap.get("active", 0)), int(cfg.get("max_sandboxes", 0))
    except (ValueError, KeyError, TypeError) as exc:
        return [error("node_capacity_failed", f"{what}: unreadable capacity answer ({exc}): {text.strip()[:200]}",
                      "check the node's sunabako version (0.1.2)", "sandbox.cluster")]
    out: list[Finding] = []
    if free < memory_mb << 20:
        out.append(error("node_full", f"{what}: {free >> 20} MiB of sandbox memory left, one sandbox needs "
                         f"{memory_mb} MiB (sandbox.memory_mb)", "free the node (lego sandbox gc), lower "
                         "sandbox.memory_mb, or raise the node's memory_capacity_bytes", "sandbox.memory_mb"))
    if most and active >= most:
        out.append(error("node_full", f"{what}: {active} of max_sandboxes={most} sandboxes already run",
                         "free the node (lego sandbox gc) or raise its max_sandboxes", "sandbox.cluster"))
    if int(cfg.get("uid_range_size", 1)) <= 1:
        out.append(error("node_config", f"{what}: uid_range_size={cfg.get('uid_range_size')} leaves no uid for "
                         "the guest user 'agent'", "re-run init-node with uid_range_size 65536", "sandbox.cluster"))
    if test_memory and not cfg.get("allow_unbounded_memory_for_tests"):
        out.append(error("node_config", f"{what}: sandbox.allow_test_memory is true but the node lacks "
                         "allow_unbounded_memory_for_tests", "re-run init-node with it, or set "
                         "sandbox.allow_test_memory = false (cgroups)", "sandbox.allow_test_memory"))
    return out


def _cluster_nodes(r: ResolvedConfig) -> list[NodeTarget]:
    """Every node in ``sandbox.cluster``; an unreadable file is the offline checks' finding."""
    c = r.config
    if not c.sandbox.cluster or not Path(c.sandbox.cluster).is_file():
        return []
    try:
        nodes = json.loads(Path(c.sandbox.cluster).read_text()).get("nodes", [])
        return [NodeTarget(str(node["name"]), str(node["host"]), int(node.get("port", c.cluster.ssh_port)),
                           str(node.get("state_dir", "/var/lib/sunabako")), str(node.get("binary", "sunabako")))
                for node in nodes if node.get("host")]  # a node without host is this machine: no SSH to check
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return []


def _image_roots(r: ResolvedConfig) -> list[str]:
    """The root filesystems of sandbox.images (each must exist on every node); unreadable = none to check."""
    path = r.config.sandbox.images
    try:
        data = json.loads(Path(path).read_text()) if path else {}
        return sorted({str(e["rootfs"]) for e in data.values() if isinstance(e, dict) and e.get("rootfs")})
    except (OSError, ValueError, AttributeError):
        return []


RAY_PORT = 6379
"""The head's GCS port when ``lego train`` starts Ray on ``cluster.train_head`` (Ray's own default)."""


def training_nodes(cl: ClusterConfig) -> list[tuple[str, str]]:
    """``(key, host)`` of every node ``cluster.start_ray`` starts Ray on: the head first, then the workers."""
    head = [("cluster.train_head", cl.train_head)] if cl.train_head else []
    return head + [("cluster.train_workers", w) for w in cl.train_workers]


def ssh_try_command(host: str, cl: ClusterConfig) -> str:
    """The command an operator runs by hand to see why ``host`` cannot be reached (the options lego uses)."""
    return shlex.join(ssh_host_argv(host, cl.ssh_port, cl.ssh_config, "true", 10))


def node_address(host: str, cl: ClusterConfig, key: str) -> str:
    """The IP address Ray uses for training node ``host`` (an IP, a DNS name, or an alias of the SSH client
    config whose ``HostName`` is the node's address on the training network)."""
    name = host
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    config = ["-F", cl.ssh_config] if cl.ssh_config else []
    with contextlib.suppress(OSError, subprocess.SubprocessError):  # no ssh client: resolve the name as given
        shown = subprocess.run(["ssh", *config, "-p", str(cl.ssh_port), "-G", host], capture_output=True,
                               text=True, timeout=10)
        for line in shown.stdout.splitlines() if shown.returncode == 0 else []:
            if line.startswith("hostname "):
                name = line.split(None, 1)[1].strip()
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        pass
    try:
        return str(socket.getaddrinfo(name, RAY_PORT, socket.AF_INET, socket.SOCK_STREAM)[0][4][0])
    except (OSError, IndexError) as exc:
        raise ConfigError(f"{key} = {host!r}: cannot resolve {name!r} to an address: {exc}", parameter=key,
                          value=host) from None


def local_address_towards(ip: str) -> str | None:
    """This machine's address on the route to ``ip`` (what Ray must advertise for this node), or None when
    there is no route. No packet is sent: connecting a UDP socket only picks the route."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((ip, RAY_PORT))
            return str(s.getsockname()[0])
    except OSError:
        return None


def is_local_address(ip: str) -> bool:
    """Whether ``ip`` is one of this machine's own addresses."""
    return ipaddress.ip_address(ip).is_loopback or local_address_towards(ip) == ip


def ray_head_unreachable(address: str, timeout: float) -> str | None:
    """None when something accepts TCP connections at the Ray head's ``host:port`` (6379 when no port is given),
    else why not. Checked first because ``ray.init`` retries a dead address for minutes before it gives up."""
    host, _, port = address.removeprefix("ray://").rpartition(":") if ":" in address else (address, "", "6379")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return None
    except ValueError:
        return f"not a host:port address: {address!r}"
    except TimeoutError:
        return f"no answer from {host}:{port} within {timeout:g} s"
    except OSError as exc:
        return f"cannot connect to {host}:{port}: {exc.strerror or type(exc).__name__}"


def _ray_nodes(address: str, timeout: float) -> list[dict[str, float]] | str:
    """Total resources of every alive node of the Ray cluster at ``address``, or why it cannot be read."""
    try:
        import ray  # the `cluster` extra; imported here: only a Ray-mode check needs it
    except ImportError:
        return "Ray is not installed (pip install 'lego-rl[cluster]')"
    dead = ray_head_unreachable(address, timeout)
    if dead is not None:
        return dead
    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    except Exception as exc:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, gRPC errors: all mean "unreachable"
        return f"{type(exc).__name__}: {exc}"
    try:
        return [{k: float(v) for k, v in n["Resources"].items()} for n in ray.nodes() if n.get("Alive")]
    finally:
        ray.shutdown()


def ray_findings(r: ResolvedConfig, nodes: list[dict[str, float]]) -> list[Finding]:
    """One ``ray_resources`` error per resource the cluster's ``nodes`` lack for the run's placement."""
    cl = r.config.cluster
    found = []
    for resource, why in shortfalls(placement_plan(r.config), nodes):
        key = key_for(resource, cl)
        found.append(error("ray_resources", f"Ray cluster {cl.ray_address}: {why}",
                           "start more nodes (`ray start --address ... --resources ...`) or ask for less "
                           "(cluster.trainer_nodes, cluster.engine_replicas, cluster.*_placement)", key))
    return found


async def _ray_node_findings(key: str, host: str, cl: ClusterConfig, ray_bin: str, timeout: float) -> list[Finding]:
    """``lego train`` will start Ray on ``host`` over SSH: it answers, and has ``ray`` at this machine's path."""
    try:
        ip = node_address(host, cl, key)
    except ConfigError as exc:
        return [error("ray_node_address", str(exc), f"set {key} to the node's address on the training network", key)]
    if is_local_address(ip):
        return []  # started here, without SSH (Ray's own binary was checked by the Ray import already)
    what = f"training node {host} ({key})"
    proc = await asyncio.create_subprocess_exec(
        *ssh_host_argv(host, cl.ssh_port, cl.ssh_config, shlex.join(["test", "-x", ray_bin]), timeout),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        _, err = await asyncio.wait_for(proc.communicate(), max(timeout, 30.0))
    except TimeoutError:
        proc.kill()
        await proc.wait()
        err = f"no answer within {max(timeout, 30.0):g} s".encode()
    if proc.returncode == 0:
        return []
    if proc.returncode == 1:  # test -x: the command ran, the file is not there
        return [error("ray_missing", f"{what}: no executable {ray_bin} there (cluster.start_ray runs Ray from the "
                      "same virtual environment path on every node)", "install the checkout and its virtual "
                      "environment (with the cluster extra) at the same path on the node", key)]
    reason = err.decode(errors="replace").strip()[-400:] or f"ssh exited {proc.returncode}"
    return [error("unreachable", f"{what}: cannot start Ray there over SSH: {reason}",
                  f"try by hand: `{ssh_try_command(host, cl)}`; check the address, sshd, the credentials "
                  "(cluster.ssh_config, cluster.ssh_port) and firewalls", key, "cluster.ssh_config")]


async def remote_findings(r: ResolvedConfig, timeout: float = 5.0) -> list[Finding]:
    c = r.config
    findings: list[Finding] = []
    jobs: list[tuple[str, Awaitable[str | None]]] = []
    if c.serving.backend == "vllm":
        for url in c.serving.urls:
            jobs.append((f"serving {url}", _http_ok(url.rstrip("/") + "/health", timeout)))
    sandbox_nodes = _cluster_nodes(r) if opens_sandboxes(r) else []  # an environment or SFT run uses no node
    roots = _image_roots(r) if sandbox_nodes else []
    node_jobs = [_node_findings(node, c.cluster.ssh_config, c.sandbox.memory_mb, bool(c.sandbox.allow_test_memory),
                                roots, timeout) for node in sandbox_nodes]
    ray_job = None
    if c.cluster.mode == "ray" and c.cluster.ray_address:  # without an address lego train starts its own Ray
        ray_job = asyncio.to_thread(_ray_nodes, c.cluster.ray_address, timeout)
    cl = c.cluster
    ray_nodes = []
    if cl.mode == "ray" and cl.start_ray and not cl.ray_address:
        ray_bin = str(Path(sys.executable).with_name("ray"))
        ray_nodes = [_ray_node_findings(key, host, cl, ray_bin, timeout) for key, host in training_nodes(cl)]
    results = await asyncio.gather(*(job for _, job in jobs))
    if ray_job is not None:
        nodes = await ray_job
        if isinstance(nodes, str):
            findings.append(error("unreachable", f"ray {c.cluster.ray_address}: {nodes}",
                                  "start the head with `ray start --head` and check the address and firewalls",
                                  "cluster.ray_address"))
        else:
            findings.extend(ray_findings(r, nodes))
    for (what, _), reason in zip(jobs, results, strict=True):
        if reason is not None:
            findings.append(error("unreachable", f"{what}: {reason}",
                                  "check the address, that the service is running, and firewalls", what))
    for node_findings in await asyncio.gather(*node_jobs, *ray_nodes):
        findings += node_findings
    return findings
