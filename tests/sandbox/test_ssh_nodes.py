"""sunabako sandboxes on a node reached over SSH: the second host is real (tests/support/sshnode.py: an
sshd in its own network namespace behind a veth pair), and so are OpenSSH, the sunabako SDK and binary,
and the node's sandboxes. The node dies mid-command (its sshd, or the whole host), and `lego sandbox gc`
collects what it left once it is back.

Times here (2 shared cores): a node comes up in ~1 s; a create over SSH 2-10 s (the SDK's start-up race
retried, docs/sandboxes.md); each RPC is one SSH connection, ~0.4 s."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sandbox_helpers import ROOTFS, check_available
from support.sshnode import SshNode, missing_requirements, ssh_node
from typer.testing import CliRunner

from lego_rl.cli.main import app
from lego_rl.errors import SandboxError, SandboxLost
from lego_rl.sandbox import ImageSpec
from lego_rl.sandbox.sunabako_admin import gc_nodes, list_nodes, nodes_for
from lego_rl.sandbox.sunabako_provider import SunabakoProvider, SunabakoSandbox, load_cluster_nodes, ssh_argv

IMAGE = ImageSpec(name="bookworm-test", rootfs=ROOTFS, workdir="/testbed")
runner = CliRunner()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SshNode]:
    check_available("sunabako")
    if (why := missing_requirements()) is not None:
        pytest.fail(f"{why} (make system-deps)")
    with ssh_node(tmp_path / "node") as n:
        n.init_sunabako(uid_range_size=65536, allow_unbounded_memory_for_tests=True)
        yield n


@pytest.fixture
async def provider(node: SshNode) -> AsyncIterator[SunabakoProvider]:
    p = SunabakoProvider(cluster=str(node.cluster_json), ssh_config=str(node.ssh_config), allow_test_memory=True)
    yield p
    await p.aclose()


def _records(node: SshNode) -> dict[str, dict[str, object]]:
    out = subprocess.run([node.binary, "--state", str(node.state_dir), "list"], check=True, capture_output=True,
                         text=True).stdout
    return {r["spec"]["id"]: r["status"] for r in json.loads(out)}


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


async def _gc(node: SshNode, *extra: str, exit_code: int = 0) -> str:
    """`lego sandbox gc` on the node's cluster (in a thread: the CLI runs its own event loop)."""
    result = await asyncio.to_thread(runner.invoke, app, [
        "sandbox", "gc", "-p", "sunabako", "--cluster", str(node.cluster_json), "--ssh-config",
        str(node.ssh_config), *extra])
    assert result.exit_code == exit_code, result.output
    return result.output


@pytest.mark.root
@pytest.mark.slow
def test_the_node_is_a_separate_host_and_leaves_nothing(tmp_path: Path) -> None:
    """The node has its own network (only lo and the veth; no route out), and its teardown removes the
    namespaces, the veth pair, its processes and its state dir, also after a failure inside the block."""
    if (why := missing_requirements()) is not None:
        pytest.fail(why)
    with pytest.raises(RuntimeError, match="inside the block"), ssh_node(tmp_path / "n") as n:
        seen = n.ssh("ip -o -4 addr show; ip route get 1.1.1.1 || echo NO-ROUTE; hostname -I")
        assert seen.returncode == 0, seen.stderr
        assert n.address in seen.stdout and "NO-ROUTE" in seen.stdout  # nothing outside is reachable
        names, pids, state = (n.client_ns, n.node_ns), n.node_processes(), n.state_dir
        assert pids and state.is_dir()
        raise RuntimeError("inside the block")
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in listed for name in names)
    # A killed session child reparented to this container's PID 1 may stay a zombie a moment: not running.
    assert [pid for pid in pids if _running(pid)] == []
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"lsn{n.tag}" not in links and not state.exists()


def test_cluster_file_errors_name_the_node_and_key(tmp_path: Path) -> None:
    pytest.importorskip("sunabako")
    path = tmp_path / "cluster.json"
    cases = {
        '{"nodes": []}': "needs a non-empty `nodes` list",
        '{"nodes": [{"host": "h"}]}': "node 0 needs a `name`",
        '{"nodes": [{"name": "a", "host": ""}]}': "node 0 (a): host must be a non-empty string, got ''",
        '{"nodes": [{"name": "a", "host": "h", "prot": 22}]}': "node 0 has unknown key(s) ['prot']",
        '{"nodes": [{"name": "a", "host": "h"}, {"name": "b", "host": "h", "port": 70000}]}':
            "node 1 (b): port must be an integer 1..65535, got 70000",
        '{"nodes": [{"name": "a", "host": "h"}, {"name": "a", "host": "g"}]}': "node names must be distinct",
        "{nodes": "Expecting property name",
    }
    for text, message in cases.items():
        path.write_text(text)
        with pytest.raises(SandboxError, match=None) as info:
            load_cluster_nodes(path)
        assert str(path) in str(info.value) and message in str(info.value), (text, str(info.value))
    path.write_text('{"nodes": [{"name": "here", "state_dir": "/var/lib/sunabako"}]}')
    (here,) = load_cluster_nodes(path)
    assert here.host is None  # a node without host is this machine, reached without SSH
    path.write_text('{"nodes": [{"name": "a", "host": "h"}, {"name": "b", "host": "g", "port": 2200}]}')
    a, b = load_cluster_nodes(path, ssh_config="/etc/lego/ssh_config", ssh_port=2222)
    assert (a.port, b.port) == (2222, 2200)  # cluster.ssh_port is the default, a node's own port wins
    # The SDK's own command, with the client config in front (what every RPC to the node runs).
    argv = a._command(("capacity",))
    assert argv[:5] == ["ssh", "-F", "/etc/lego/ssh_config", "-p", "2222"] and argv[-2] == "h"
    assert ssh_argv(b, "true")[:5] == ["ssh", "-F", "/etc/lego/ssh_config", "-p", "2200"]
    with pytest.raises(SandboxError, match="ssh_config /nonexistent is not a file"):
        SunabakoProvider(cluster=path, ssh_config="/nonexistent")


@pytest.mark.root
@pytest.mark.slow
async def test_sandbox_on_the_node_then_the_node_dies_and_gc_collects_it(
    node: SshNode, provider: SunabakoProvider
) -> None:
    sb = await provider.create(IMAGE, network="none")
    assert isinstance(sb, SunabakoSandbox) and sb.node_name == "sandbox-0"
    res = await sb.exec("echo $(id -un) in $(pwd); cat /proc/1/comm", user="agent")
    assert res.ok and res.stdout.startswith("agent in /testbed"), res
    assert sb.id in _records(node)  # it lives in the node's state, created through its sshd

    running = asyncio.create_task(sb.exec("sleep 60", timeout=120))
    await asyncio.sleep(1.5)
    node.kill_node()  # the host goes down under the command: sshd, supervisor and sandbox all killed
    with pytest.raises(SandboxLost) as lost:
        await asyncio.wait_for(running, 30)
    assert "node sandbox-0" in str(lost.value) and "stopped answering over SSH" in str(lost.value)
    assert "lego sandbox gc" in str(lost.value)
    await sb.close()  # nothing can reach the node: logged and left for gc, never raised over the loss
    with pytest.raises(SandboxError, match="is closed"):
        await sb.exec("true")
    # While it is down, gc names the node rather than pretending it is clean.
    assert "sandbox-0" in await _gc(node, exit_code=3)

    node.start_sshd()  # the node is back with the sandbox's record on disk
    # sunabako 0.1.2 may still record "running" (its supervisor died before it could write anything: what a
    # power cut leaves) or already "failed": lego shows the first as "dead"; both are leftovers.
    nodes = nodes_for(cluster=str(node.cluster_json), ssh_config=str(node.ssh_config))
    [row] = await list_nodes(nodes)
    assert (row["node"], row["id"]) == ("sandbox-0", sb.id) and row["state"] in ("dead", "failed"), row
    if row["state"] == "dead":
        assert row["recorded_state"] == "running" and "supervisor" in row["reason"]
    assert f"removed 1 sandbox(es): sandbox-0/{sb.id}" in await _gc(node)
    assert _records(node) == {} and not any(node.state_dir.glob("s-*"))


@pytest.mark.root
@pytest.mark.slow
async def test_sshd_lost_sandbox_keeps_running_until_gc_all(node: SshNode, provider: SunabakoProvider) -> None:
    """Only the node's sshd dies: the command fails as lost, but the sandbox still runs there, so plain gc
    keeps it (it may belong to another run) and `--all` takes it."""
    sb = await provider.create(IMAGE, network="none")
    running = asyncio.create_task(sb.exec("sleep 60", timeout=120))
    await asyncio.sleep(1.5)
    node.kill_sshd()
    with pytest.raises(SandboxLost, match="sandbox-0"):
        await asyncio.wait_for(running, 30)
    await sb.close()
    node.start_sshd()
    status = _records(node)[sb.id]
    assert status["state"] == "running" and os.path.exists(f"/proc/{status['init_pid']}")
    assert "removed 0 sandbox(es)" in await _gc(node)
    assert f"removed 1 sandbox(es): sandbox-0/{sb.id}" in await _gc(node, "--all")
    assert _records(node) == {} and not os.path.exists(f"/proc/{status['init_pid']}")
    assert await gc_nodes(nodes_for(cluster=str(node.cluster_json), ssh_config=str(node.ssh_config))) == []


# Real OpenSSH client messages for a node lost under a command. Which one a dying node produces depends on
# timing (CI printed the last one when the node's namespace went away mid-RPC; this machine the others).
SSH_LOSS_MESSAGES = [
    "ssh: connect to host 10.251.132.122 port 22: Connection refused",
    "kex_exchange_identification: Connection closed by remote host",
    "client_loop: send disconnect: Broken pipe",
    "Connection reset by 10.251.3.4 port 22",
    "ssh: connect to host node-7 port 22: No route to host",
    "Connection to 10.251.245.6 closed by remote host.",
]


@pytest.mark.parametrize("message", SSH_LOSS_MESSAGES)
def test_openssh_transport_failures_are_a_lost_node(message: str) -> None:
    from types import SimpleNamespace

    from lego_rl.sandbox.sunabako_provider import transport_lost

    assert transport_lost(RuntimeError(message), SimpleNamespace(host="10.251.245.6"))
    # The same text from a node on this machine (no SSH in between) is the runtime's own failure.
    assert not transport_lost(RuntimeError(message), SimpleNamespace(host=None))


@pytest.mark.parametrize("message", [
    "sandbox s-1 not found", "startup failed: mount /testbed: permission denied", "exec: exit status 1",
    "Connection to the database closed", "no space left on device",
])
def test_runtime_failures_on_a_reachable_node_are_not_a_lost_node(message: str) -> None:
    from types import SimpleNamespace

    from lego_rl.sandbox.sunabako_provider import transport_lost

    assert not transport_lost(RuntimeError(message), SimpleNamespace(host="10.251.245.6"))
