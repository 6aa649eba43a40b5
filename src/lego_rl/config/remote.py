"""Checks that touch the network, run by ``lego validate --remote`` only, each within a timeout:
SSH to every sandbox node, the adapter's advertised address, and the serving engines' health."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from pathlib import Path

import aiohttp

from lego_rl.config.findings import Finding, error
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
    # fabric imports paramiko: keep it out of the CLI's start-up. It ships no type hints.
    from fabric import Connection  # type: ignore[import-untyped]

    try:
        with Connection(host, port=port, connect_timeout=timeout) as conn:
            result = conn.run("true", hide=True, warn=True, timeout=timeout)
            return None if result.ok else f"`true` exited {result.exited}"
    except Exception as exc:  # noqa: BLE001 - paramiko/socket raise many types; all mean "unreachable"
        return f"{type(exc).__name__}: {exc}"


async def remote_findings(r: ResolvedConfig, timeout: float = 5.0) -> list[Finding]:
    c = r.config
    findings: list[Finding] = []
    jobs: list[tuple[str, Awaitable[str | None]]] = []
    if c.serving.backend == "vllm":
        for url in c.serving.urls:
            jobs.append((f"serving {url}", _http_ok(url.rstrip("/") + "/health", timeout)))
    host = c.adapter.public_host
    if host not in ("auto", "0.0.0.0"):
        jobs.append((f"adapter {host}:{c.adapter.port}", _http_ok(f"http://{host}:{c.adapter.port}/health", timeout)))
    if c.sandbox.cluster and Path(c.sandbox.cluster).is_file():
        nodes = json.loads(Path(c.sandbox.cluster).read_text()).get("nodes", [])
        for node in nodes:
            port = int(node.get("port", c.cluster.ssh_port))
            jobs.append((f"ssh {node['host']}:{port}", asyncio.to_thread(_ssh_ok, node["host"], port, timeout)))
    results = await asyncio.gather(*(job for _, job in jobs))
    for (what, _), reason in zip(jobs, results, strict=True):
        if reason is not None:
            findings.append(error("unreachable", f"{what}: {reason}",
                                  "check the address, that the service is running, and firewalls", what))
    return findings
