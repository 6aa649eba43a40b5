"""`--remote` checks against real loopback endpoints: a live health route, a closed port, a dead SSH port;
and never the adapter, which only exists while a job runs."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

from aiohttp import web

from lego_rl.config.remote import remote_findings
from lego_rl.config.resolve import resolve


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_remote_checks(base_toml: Path, workdir: Path) -> None:
    app = web.Application()
    async def health(_: web.Request) -> web.Response:
        return web.json_response({})

    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    live = runner.addresses[0][1]
    dead = _closed_port()
    cluster = workdir / "cluster.json"
    cluster.write_text(json.dumps({"nodes": [{"name": "s0", "host": "127.0.0.1", "port": _closed_port()}]}))
    try:
        r = resolve(base_toml, environ={}, overrides=[
            "serving.backend=\"vllm\"", f"serving.urls=[\"http://127.0.0.1:{live}\", \"http://127.0.0.1:{dead}\"]",
            "adapter.public_host=\"127.0.0.1\"", f"adapter.port={live}", f"sandbox.cluster=\"{cluster}\"",
        ])
        start = time.monotonic()
        findings = await remote_findings(r, timeout=2.0)
        assert time.monotonic() - start < 10
    finally:
        await runner.cleanup()
    failed = " | ".join(f.message for f in findings)
    assert f"serving http://127.0.0.1:{dead}" in failed
    assert f"serving http://127.0.0.1:{live}" not in failed
    assert "adapter" not in failed
    assert "ssh 127.0.0.1" in failed
    assert all(f.severity == "error" for f in findings)


async def test_remote_checks_pass_without_a_running_adapter(base_toml: Path) -> None:
    """Before launch nothing listens on the adapter's port: that is not a finding (the job starts it)."""
    r = resolve(base_toml, environ={}, overrides=[
        "adapter.public_host=\"127.0.0.1\"", f"adapter.port={_closed_port()}", "adapter.bind_host=\"127.0.0.1\"",
    ])
    assert await remote_findings(r, timeout=2.0) == []


async def test_remote_checks_skip_an_unreadable_cluster_file(base_toml: Path, workdir: Path) -> None:
    """A malformed cluster.json is the offline checks' finding; the remote pass must not crash on it."""
    cluster = workdir / "cluster.json"
    cluster.write_text('{"nodes": [{"port": 22}]}')
    r = resolve(base_toml, environ={}, overrides=[f"sandbox.cluster=\"{cluster}\""])
    assert await remote_findings(r, timeout=2.0) == []


async def test_a_dead_ray_head_is_unreachable_at_once(base_toml: Path) -> None:
    """ray.init retries a dead address for minutes: the check answers within its timeout instead."""
    port = _closed_port()
    r = resolve(base_toml, environ={}, overrides=["cluster.mode=\"ray\"", f"cluster.ray_address=\"127.0.0.1:{port}\""])
    start = time.monotonic()
    [f] = await remote_findings(r, timeout=2.0)
    assert time.monotonic() - start < 10
    assert (f.code, f.severity, f.keys) == ("unreachable", "error", ("cluster.ray_address",))
    assert f.message == f"ray 127.0.0.1:{port}: cannot connect to 127.0.0.1:{port}: Connection refused"
    # Without an address `lego train` starts its own one-node Ray: nothing to reach before launch.
    r = resolve(base_toml, environ={}, overrides=["cluster.mode=\"ray\""])
    assert await remote_findings(r, timeout=2.0) == []
