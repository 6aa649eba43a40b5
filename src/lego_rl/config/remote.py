"""Checks that touch the network, run by ``lego validate --remote`` only, each within a timeout.

They test what must already exist before a launch: the health of every configured vLLM server, SSH to
every sandbox node of cluster.json, and (``cluster.mode = "ray"`` with ``cluster.ray_address``) the Ray
cluster's alive nodes against the placement groups ``lego train`` will ask for. Never the adapter: the job itself starts it, so before launch its
address answering would mean another job holds the port, not that this one is ready."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Awaitable
from pathlib import Path

import aiohttp

from lego_rl.config.findings import Finding, error
from lego_rl.config.placement import key_for, placement_plan, shortfalls
from lego_rl.config.resolve import ResolvedConfig


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


def _ssh_ok(host: str, port: int, timeout: float) -> str | None:
    from fabric import Connection  # fabric imports paramiko: keep it out of the CLI's start-up

    try:
        with Connection(host, port=port, connect_timeout=timeout) as conn:
            result = conn.run("true", hide=True, warn=True, timeout=timeout)
            return None if result.ok else f"`true` exited {result.exited}"
    except Exception as exc:  # noqa: BLE001 - paramiko/socket raise many types; all mean "unreachable"
        return f"{type(exc).__name__}: {exc}"


def _cluster_nodes(r: ResolvedConfig) -> list[tuple[str, int]]:
    """``(host, port)`` of every node in ``sandbox.cluster``; an unreadable file is the offline checks' finding."""
    c = r.config
    if not c.sandbox.cluster or not Path(c.sandbox.cluster).is_file():
        return []
    try:
        nodes = json.loads(Path(c.sandbox.cluster).read_text()).get("nodes", [])
        return [(str(node["host"]), int(node.get("port", c.cluster.ssh_port))) for node in nodes]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return []


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


async def remote_findings(r: ResolvedConfig, timeout: float = 5.0) -> list[Finding]:
    c = r.config
    findings: list[Finding] = []
    jobs: list[tuple[str, Awaitable[str | None]]] = []
    if c.serving.backend == "vllm":
        for url in c.serving.urls:
            jobs.append((f"serving {url}", _http_ok(url.rstrip("/") + "/health", timeout)))
    for host, port in _cluster_nodes(r):
        jobs.append((f"ssh {host}:{port}", asyncio.to_thread(_ssh_ok, host, port, timeout)))
    ray_job = None
    if c.cluster.mode == "ray" and c.cluster.ray_address:  # without an address lego train starts its own Ray
        ray_job = asyncio.to_thread(_ray_nodes, c.cluster.ray_address, timeout)
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
    return findings
