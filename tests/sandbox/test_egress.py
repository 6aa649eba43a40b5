"""network="allowlist": from inside an agent sandbox the adapter answers and nothing else does.

Real bwrap and real sunabako (local node), root; e2b is skipped (a remote sandbox has no way to this
host's loopback). Each denial is paired with a control on ``network="host"`` so the test fails when the
confinement does nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sandbox_helpers import MakeSandbox

from lego_rl.errors import SandboxError
from lego_rl.sandbox.egress import parse_endpoint, url_endpoint
from lego_rl.sandbox.factory import get_provider

@pytest.fixture(autouse=True)
def _real_network(host_network: None) -> None:
    """Egress is tested against this machine's real addresses, routes and resolver, even when an earlier test
    module left the session in a loopback-only namespace (tests/conftest.py's host_network)."""


# Prints what the endpoint said, or the errno name of why it could not connect.
_PROBE = (
    "import errno, socket, sys\n"
    "try:\n"
    "    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)\n"
    "    print('ANSWER', s.recv(64).decode().strip())\n"
    "except socket.gaierror as e:\n"
    "    print('DNS', e)\n"
    "except OSError as e:\n"
    "    print('DENIED', errno.errorcode.get(e.errno, e.errno) if e.errno else type(e).__name__)\n"
)


def host_address() -> str:
    """This host's non-loopback address (the one its default route uses); no packet is sent."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))
        address = str(s.getsockname()[0])
    if address.startswith("127."):
        pytest.skip("this host has no non-loopback IPv4 address")
    return address


async def _serve(host: str, tag: str) -> asyncio.Server:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(f"{tag}\n".encode())
        await writer.drain()
        writer.close()

    return await asyncio.start_server(answer, host, 0)


@pytest.fixture
async def servers() -> AsyncIterator[dict[str, int]]:
    """An "adapter" on 127.0.0.1 and an "other" service on every host address (loopback included)."""
    adapter = await _serve("127.0.0.1", "adapter")
    other = await _serve("0.0.0.0", "other")
    yield {"adapter": adapter.sockets[0].getsockname()[1], "other": other.sockets[0].getsockname()[1]}
    for server in (adapter, other):
        server.close()
        await server.wait_closed()


async def probe(sb: object, host: str, port: int) -> str:
    res = await sb.exec(["python3", "-c", _PROBE, host, str(port)], user="agent", timeout=60)  # type: ignore[attr-defined]
    assert res.exit_code == 0, res.stderr
    return str(res.stdout.strip())


def _skip_e2b(provider_name: str) -> None:
    if provider_name == "e2b":
        pytest.skip("an e2b sandbox is remote: it has no route to this host's addresses")


async def test_agent_reaches_the_adapter_and_nothing_else(
    make_sandbox: MakeSandbox, provider_name: str, servers: dict[str, int]
) -> None:
    _skip_e2b(provider_name)
    adapter, other, here = servers["adapter"], servers["other"], host_address()
    pypi = socket.getaddrinfo("pypi.org", 443, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]

    # Control: on the host network every one of these is reachable, so the denials below mean something.
    shared = await make_sandbox(network="host")
    assert await probe(shared, "127.0.0.1", other) == "ANSWER other"
    assert await probe(shared, here, other) == "ANSWER other"

    caged = await make_sandbox(network="allowlist", allow=[f"127.0.0.1:{adapter}"])
    assert await probe(caged, "127.0.0.1", adapter) == "ANSWER adapter"
    assert await probe(caged, "127.0.0.1", other) == "DENIED ECONNREFUSED"  # another loopback port
    assert await probe(caged, here, other) == "DENIED ENETUNREACH"  # another local address
    assert await probe(caged, pypi, 443) == "DENIED ENETUNREACH"  # a package index, by address
    assert (await probe(caged, "pypi.org", 443)).startswith("DNS")  # and by name: no resolver inside
    res = await caged.exec(
        ["python3", "-c", "import urllib.request as u; u.urlopen('https://pypi.org/simple/pip/', timeout=10)"],
        user="agent", timeout=60)
    assert res.exit_code != 0 and "URLError" in res.stderr
    # root inside is no better off: it has no interface but lo to route through.
    res = await caged.exec(["python3", "-c", _PROBE, here, str(other)], user="root", timeout=60)
    assert res.stdout.strip() == "DENIED ENETUNREACH"


async def test_operator_allowlist_reaches_a_non_loopback_address(
    make_sandbox: MakeSandbox, provider_name: str, servers: dict[str, int]
) -> None:
    """An allowed endpoint on the host's own address (a remote adapter's case) answers at that address;
    the same address's other ports do not."""
    _skip_e2b(provider_name)
    here = host_address()
    decoy = await _serve("0.0.0.0", "decoy")
    try:
        sb = await make_sandbox(network="allowlist", allow=[f"{here}:{servers['other']}"])
        assert await probe(sb, here, servers["other"]) == "ANSWER other"
        assert await probe(sb, here, decoy.sockets[0].getsockname()[1]) == "DENIED ECONNREFUSED"
        assert await probe(sb, "127.0.0.1", servers["adapter"]) == "DENIED ECONNREFUSED"
    finally:
        decoy.close()
        await decoy.wait_closed()


async def test_relay_survives_concurrent_requests_and_goes_with_the_sandbox(
    make_sandbox: MakeSandbox, provider_name: str, servers: dict[str, int]
) -> None:
    _skip_e2b(provider_name)
    sb = await make_sandbox(network="allowlist", allow=[f"127.0.0.1:{servers['adapter']}"])
    answers = await asyncio.gather(*(probe(sb, "127.0.0.1", servers["adapter"]) for _ in range(6)))
    assert answers == ["ANSWER adapter"] * 6
    relay = sb.relay  # type: ignore[attr-defined]
    assert relay.connections >= 6
    netns = os.readlink(f"/proc/self/fd/{relay.netns_fd}")  # net:[inode]

    def held() -> list[str]:
        found = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                found += [fd] if os.readlink(f"/proc/self/fd/{fd}") == netns else []
            except OSError:
                pass
        return found

    assert held()
    await sb.close()
    assert held() == []  # the namespace is no longer held by this process
    assert not relay._servers


async def test_allow_needs_allowlist_mode_and_literal_addresses(make_sandbox: MakeSandbox, provider_name: str) -> None:
    _skip_e2b(provider_name)
    with pytest.raises(SandboxError, match="needs network='allowlist'"):
        await make_sandbox(network="host", allow=["127.0.0.1:8000"])
    with pytest.raises(SandboxError, match="'pypi.org' is not an IP address"):
        await make_sandbox(network="allowlist", allow=["pypi.org:443"])


@pytest.mark.parametrize(("text", "message"), [
    ("127.0.0.1", "expected ADDRESS:PORT"),
    ("127.0.0.1:0", "is not a TCP port"),
    ("127.0.0.1:http", "is not a TCP port"),
    ("files.pythonhosted.org:443", "not an IP address"),
    ("0.0.0.0:80", "cannot be connected to"),
])
def test_bad_allowlist_entries_are_named(text: str, message: str) -> None:
    with pytest.raises(SandboxError, match=message) as info:
        parse_endpoint(text)
    assert repr(text) in str(info.value)


def test_endpoints_from_urls() -> None:
    assert str(url_endpoint("http://127.0.0.1:8123/v1")) == "127.0.0.1:8123"
    assert str(url_endpoint("http://localhost:80")) == "127.0.0.1:80"
    assert str(parse_endpoint("[::1]:9000")) == "[::1]:9000"
    with pytest.raises(SandboxError, match="not an IP address"):
        url_endpoint("http://adapter.internal:8000")


async def test_sunabako_cluster_refuses_allowlist(tmp_path: Path) -> None:
    """A cluster node's namespaces cannot be entered from here: refused up front, naming the way out."""
    pytest.importorskip("sunabako")
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"nodes": [{"name": "n0", "host": "node0.invalid", "state_dir": "/x"}]}))
    provider = get_provider("sunabako", cluster=str(cluster), allow_test_memory=True)
    from sandbox_helpers import image_for

    with pytest.raises(SandboxError, match="needs the local node.*'host'"):
        await provider.create(image_for("sunabako"), network="allowlist", allow=["127.0.0.1:8000"])
