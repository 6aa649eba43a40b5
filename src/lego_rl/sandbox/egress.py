"""Agent egress: a sandbox network namespace whose only way out is a relay to chosen ``ADDRESS:PORT``s.

``network="allowlist"`` (the config's ``sandbox.network = "adapter"``) gives a sandbox a network
namespace with nothing in it but ``lo``: no route, no DNS, no other interface. For each allowed
endpoint (the adapter, plus the operator's explicit ``sandbox.network_allow``) a listening socket is
created *inside* that namespace, on the endpoint's own address and port, and every connection to it is
relayed from this process to the same endpoint in the host's namespace. The CLI keeps the adapter URL it
was given (``http://127.0.0.1:PORT`` or ``http://10.0.0.5:PORT``); every other address, including
other ports of the host's loopback and the host's other addresses, is unreachable.

How the sockets get there: a socket belongs to the network namespace its creating thread was in, so
a short-lived thread of this process enters the sandbox's namespace (``setns``), creates and binds the
listening sockets and leaves; the event loop then serves them while its own connections upstream go
out from the host's namespace. No process runs inside the sandbox for this, and nothing is left behind
when this process dies: the namespace lives as long as the sandbox holds it (bwrap: an fd of this
process; sunabako: the sandbox's init).

Addresses outside 127.0.0.0/8 are added to the namespace's ``lo`` (``ip addr add A/32 dev lo``) so a
listener can bind them. Endpoints are IP literals: there is no DNS inside, and a name resolved here
would not resolve for the CLI.

Needs root (``setns``/``unshare`` of a network namespace), ``nsenter`` (util-linux) and ``ip`` (iproute2).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ipaddress
import os
import shutil
import socket
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

from lego_rl.errors import SandboxError

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
_CHUNK = 1 << 16
UPSTREAM_CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Endpoint:
    """One ``ADDRESS:PORT`` the sandbox may connect to (an IPv4/IPv6 literal and a TCP port)."""

    address: str
    port: int

    def __str__(self) -> str:
        return f"[{self.address}]:{self.port}" if ":" in self.address else f"{self.address}:{self.port}"

    @property
    def family(self) -> socket.AddressFamily:
        return socket.AF_INET6 if ":" in self.address else socket.AF_INET


def parse_endpoint(text: str, *, what: str = "allowlist entry") -> Endpoint:
    """``"10.0.0.5:8000"``, ``"[::1]:8000"`` or ``"localhost:8000"`` -> Endpoint; a precise error otherwise."""
    raw = text.strip()
    host, sep, port_text = raw.rpartition(":")
    if not sep or not host:
        raise SandboxError(f"{what} {text!r}: expected ADDRESS:PORT (e.g. 127.0.0.1:8000)")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if host == "localhost":
        host = "127.0.0.1"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise SandboxError(f"{what} {text!r}: {host!r} is not an IP address; the sandbox has no DNS, so "
                           "name the address itself") from None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise SandboxError(f"{what} {text!r}: port {port_text!r} is not a TCP port (1-65535)")
    if address.is_unspecified or address.is_multicast:
        raise SandboxError(f"{what} {text!r}: {address} cannot be connected to")
    return Endpoint(str(address), int(port_text))


def url_endpoint(url: str) -> Endpoint:
    """The endpoint an ``http(s)://ADDRESS:PORT/...`` URL connects to (the adapter's)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SandboxError(f"adapter URL {url!r}: expected http://ADDRESS:PORT")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return parse_endpoint(f"{host}:{port}", what=f"adapter URL {url!r}:")


def parse_allow(entries: Iterable[str | Endpoint]) -> tuple[Endpoint, ...]:
    """Endpoints of an allowlist, deduplicated in order."""
    found: dict[Endpoint, None] = {}
    for entry in entries:
        found[entry if isinstance(entry, Endpoint) else parse_endpoint(entry)] = None
    return tuple(found)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _in_thread(fn: Callable[[], T]) -> T:
    """Run ``fn`` on a fresh thread that then exits: a namespace change is per thread, so it must never
    happen on a pooled thread (asyncio's executor would hand that thread, still inside the sandbox's
    namespace, to unrelated work)."""
    value: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            value.append(fn())
        except BaseException as exc:  # re-raised in the caller's thread
            error.append(exc)

    thread = threading.Thread(target=target, name="lego-netns", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return value[0]


def new_netns() -> int:
    """A fresh, empty network namespace, held by the returned fd (close it to let the namespace go)."""
    libc = _libc()

    def make() -> int:
        if libc.unshare(CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise SandboxError(f"cannot create a network namespace: {os.strerror(err)} (needs root)")
        # The thread is now in the new namespace; it exits right after, so it need not go back.
        return os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)

    return _in_thread(make)


def _bind_inside(netns_fd: int, endpoints: Sequence[Endpoint]) -> list[socket.socket]:
    """Listening sockets on ``endpoints``, created inside the namespace of ``netns_fd``."""
    libc = _libc()

    def make() -> list[socket.socket]:
        if libc.setns(netns_fd, CLONE_NEWNET) != 0:
            raise SandboxError(f"cannot enter the sandbox's network namespace: {os.strerror(ctypes.get_errno())}")
        made: list[socket.socket] = []
        try:
            for ep in endpoints:
                sock = socket.socket(ep.family, socket.SOCK_STREAM)
                made.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind((ep.address, ep.port))
                except OSError as exc:
                    raise SandboxError(f"relay for {ep} cannot listen inside the sandbox: {exc.strerror}") from None
                sock.listen(128)
                sock.setblocking(False)
        except BaseException:
            for sock in made:
                sock.close()
            raise
        return made

    return _in_thread(make)


async def _ip(netns_path: str, *args: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        "nsenter", f"--net={netns_path}", "--", "ip", *args,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise SandboxError(f"'ip {' '.join(args)}' in the sandbox's network namespace failed: "
                           f"{err.decode(errors='replace').strip()}")


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()  # half-close: an HTTP client may wait for the server's answer after its EOF
    except (ConnectionError, OSError):
        writer.close()


class EgressRelay:
    """Relays connections made inside a sandbox's network namespace to the same endpoints outside.

    ``netns_path`` names the namespace (``/proc/PID/ns/net``, or ``/proc/PID/fd/N`` of a held fd).
    """

    def __init__(self, netns_fd: int, netns_path: str, endpoints: Sequence[Endpoint]) -> None:
        self.netns_fd = netns_fd
        self.netns_path = netns_path
        self.endpoints = tuple(endpoints)
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.connections = 0
        """Connections relayed so far (for tests and the sandbox log)."""

    async def start(self) -> None:
        for tool in ("nsenter", "ip"):
            if shutil.which(tool) is None:
                raise SandboxError(f"network 'allowlist' needs {tool!r} on this host (util-linux, iproute2)")
        await _ip(self.netns_path, "link", "set", "lo", "up")
        for ep in self.endpoints:
            if not ipaddress.ip_address(ep.address).is_loopback:
                prefix = "128" if ep.family == socket.AF_INET6 else "32"
                await _ip(self.netns_path, "addr", "replace", f"{ep.address}/{prefix}", "dev", "lo")
        socks = await asyncio.to_thread(_bind_inside, self.netns_fd, self.endpoints)
        try:
            for sock, ep in zip(socks, self.endpoints, strict=True):
                self._servers.append(await asyncio.start_server(self._handler(ep), sock=sock))
        except BaseException:
            for sock in socks:
                sock.close()
            await self.aclose()
            raise

    def _handler(self, ep: Endpoint) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
        async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            if task is not None:
                self._tasks.add(task)  # type: ignore[arg-type]
            self.connections += 1
            try:
                try:
                    up_reader, up_writer = await asyncio.wait_for(
                        asyncio.open_connection(ep.address, ep.port), UPSTREAM_CONNECT_TIMEOUT_S)
                except (OSError, TimeoutError):
                    return  # the client sees a reset, as it would from the endpoint itself
                try:
                    await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
                finally:
                    up_writer.close()
            finally:
                writer.close()
                self._tasks.discard(task)  # type: ignore[arg-type]

        return on_client

    async def aclose(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 5)
        self._servers.clear()


async def start_relay(netns_fd: int, netns_path: str, allow: Sequence[Endpoint]) -> EgressRelay:
    relay = EgressRelay(netns_fd, netns_path, allow)
    await relay.start()
    return relay
