"""`--remote` checks against real loopback endpoints: a live health route, a closed port, a dead SSH port;
and never the adapter, which only exists while a job runs. Sandbox nodes are checked on a real second host
(an sshd in its own network namespace, tests/support/sshnode.py)."""

from __future__ import annotations

import json
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from support.sshnode import SshNode, missing_requirements, ssh_node

from lego_rl.config.remote import remote_findings
from lego_rl.config.resolve import resolve

SUNABAKO = shutil.which("sunabako") or str(Path(sys.executable).with_name("sunabako"))


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


# -- sandbox nodes over SSH: a real second host (tests/support/sshnode.py) ----------------------------


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SshNode]:
    if (why := missing_requirements()) is not None:
        pytest.fail(f"{why} (make system-deps)")
    if not Path(SUNABAKO).exists():
        pytest.fail("the sunabako binary is not installed (pip install 'lego-rl[sunabako]')")
    with ssh_node(tmp_path / "node", sunabako_binary=SUNABAKO) as n:
        yield n


def _init(node: SshNode, state: Path, **config: object) -> str:
    res = node.ssh(f"{SUNABAKO} --state {state} init-node -", input=json.dumps({"uid_range_size": 65536, **config}))
    assert res.returncode == 0, res.stderr
    return str(state)


@pytest.mark.root
async def test_remote_checks_each_sandbox_node_with_one_finding_per_failure(
    base_toml: Path, workdir: Path, node: SshNode
) -> None:
    """Six nodes of one cluster.json on the test host's sshd (one per state dir, binary or port): each
    failure is one finding naming its node, and the healthy node has none."""
    good = _init(node, workdir / "good", allow_unbounded_memory_for_tests=True)
    small = _init(node, workdir / "small", allow_unbounded_memory_for_tests=True, memory_capacity_bytes=1 << 30)
    # No guest uids: the only node setting a test can break here (init-node refuses cgroup mode without a
    # delegated cgroup subtree, so a node without the test memory mode cannot be made on this machine).
    strict = _init(node, workdir / "strict", allow_unbounded_memory_for_tests=True, uid_range_size=1)
    nodes = [
        {"name": "good", "state_dir": good},
        {"name": "nobinary", "state_dir": good, "binary": "/opt/nowhere/sunabako"},
        {"name": "fresh", "state_dir": str(workdir / "never-initialised")},
        {"name": "small", "state_dir": small},
        {"name": "strict", "state_dir": strict},
        {"name": "down", "state_dir": good, "port": 2222},  # nothing listens there
    ]
    cluster = workdir / "cluster.json"
    cluster.write_text(json.dumps({"nodes": [{"host": node.alias, "binary": SUNABAKO, **n} for n in nodes]}))
    r = resolve(base_toml, environ={}, overrides=[
        f"sandbox.cluster=\"{cluster}\"", f"cluster.ssh_config=\"{node.ssh_config}\"",
        "sandbox.allow_test_memory=true", "sandbox.memory_mb=2048",
    ])
    findings = await remote_findings(r, timeout=5.0)
    by_node: dict[str, list[str]] = {}
    for f in findings:
        name = f.message.split("(node ", 1)[1].split(")", 1)[0]
        by_node.setdefault(name, []).append(f.code)
        assert f.severity == "error" and f.message.startswith(f"ssh {node.alias}:"), f
    assert by_node == {
        "nobinary": ["node_binary_missing"], "fresh": ["node_uninitialised"], "small": ["node_full"],
        "strict": ["node_config"], "down": ["unreachable"],
    }, findings
    text = {f.message.split("(node ", 1)[1].split(")", 1)[0]: f.message for f in findings}
    assert "/opt/nowhere/sunabako" in text["nobinary"] and "never-initialised" in text["fresh"]
    assert "1024 MiB of sandbox memory left, one sandbox needs 2048 MiB" in text["small"]
    assert "uid_range_size=1" in text["strict"] and ":2222" in text["down"]

    # The images of sandbox.images must exist on every node at the same path.
    images = workdir / "images.json"
    images.write_text(json.dumps({"here": {"rootfs": str(workdir)}, "gone": {"rootfs": "/srv/images/gone"}}))
    cluster.write_text(json.dumps({"nodes": [{"host": node.alias, "binary": SUNABAKO, **nodes[0]}]}))
    r = resolve(base_toml, environ={}, overrides=[
        f"sandbox.cluster=\"{cluster}\"", f"cluster.ssh_config=\"{node.ssh_config}\"",
        "sandbox.allow_test_memory=true", f"sandbox.images=\"{images}\"",
    ])
    [missing] = await remote_findings(r, timeout=5.0)
    assert missing.code == "node_images_missing" and "1 of 2 image root filesystems" in missing.message
    assert "/srv/images/gone" in missing.message and str(workdir) not in missing.message.split(": ", 1)[1]


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


@pytest.mark.root
async def test_remote_checks_the_training_nodes_cluster_start_ray_would_start_ray_on(
    base_toml: Path, node: SshNode
) -> None:
    """cluster.start_ray with cluster.train_head: each training node answers over SSH and has `ray` at this
    machine's path (the same venv path on every node), or one finding names it with the command to try."""
    from lego_rl.config.remote import _ray_node_findings

    config = node.ssh_config.read_text()
    block = config[config.index(f"Host {node.alias}"):]
    dead = "lego-dead-worker"  # no route to it from the node's client side: ssh fails at once
    node.ssh_config.write_text(config + "\n" + block.replace(f"Host {node.alias}", f"Host {dead}")
                               .replace(f"HostName {node.address}", "HostName 10.250.0.9"))
    r = resolve(base_toml, environ={}, overrides=[
        "cluster.mode=\"ray\"", f"cluster.train_head=\"{node.alias}\"", f"cluster.train_workers=[\"{dead}\"]",
        f"cluster.ssh_config=\"{node.ssh_config}\""])
    [f] = await remote_findings(r, timeout=5.0)
    assert (f.code, f.keys) == ("unreachable", ("cluster.train_workers", "cluster.ssh_config")), f
    assert f.message.startswith(f"training node {dead} (cluster.train_workers): cannot start Ray there over SSH: ")
    assert "10.250.0.9" in f.message, f.message
    assert f"try by hand: `ssh -F {node.ssh_config} -p 22 -o BatchMode=yes -o ConnectTimeout=10 {dead} true`" in f.fix
    # The head answers; without Ray at the same path there it is named too.
    [missing] = await _ray_node_findings("cluster.train_head", node.alias, r.config.cluster, "/opt/nowhere/ray", 5.0)
    assert missing.code == "ray_missing" and "/opt/nowhere/ray" in missing.message, missing
    assert missing.message.startswith(f"training node {node.alias} (cluster.train_head): ")
    # Joining a running cluster (start_ray = false) starts nothing over SSH: nothing to check there.
    r = resolve(base_toml, environ={}, overrides=[
        "cluster.mode=\"ray\"", "cluster.start_ray=false", f"cluster.train_head=\"{dead}\"",
        f"cluster.ssh_config=\"{node.ssh_config}\"", "cluster.ray_address=\"127.0.0.1:1\""])
    assert [f.keys for f in await remote_findings(r, timeout=2.0)] == [("cluster.ray_address",)]
