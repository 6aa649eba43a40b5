"""A second host for the tests: an sshd in its own network namespace, reached over a veth pair.

    with ssh_node(tmp_path) as node:
        node.cluster_json      # a cluster.json naming this node (sunabako state dir under tmp_path)
        node.ssh_config        # the SSH client config that reaches it (throw-away key, pinned host key)
        node.kill_sshd(); node.start_sshd()   # the node goes away and comes back

Layout: two fresh network namespaces joined by a veth pair with private addresses that exist only
inside them (``10.251.X.1`` client side, ``10.251.X.2`` node side, a /30; no route anywhere else, so
nothing can reach outside and the host's own namespace is never touched). The node namespace runs
``sshd`` with a throw-away host key and an ``authorized_keys`` holding a throw-away client key. The
client side is a namespace too: the SSH client (OpenSSH for the sunabako SDK, paramiko for fabric)
gets there through a ``ProxyCommand`` that is this file run as a script under ``ip netns exec``,
relaying stdin/stdout to the node's port. The filesystem is shared (only the network is separate):
the node runs the same sunabako binary and rootfs paths as this host, with its own state dir.

Teardown leaves nothing: it destroys the node's sandboxes (through its state dir, from this host),
kills every process in both namespaces and deletes them (the veth pair goes with them).

Needs root, ``ip`` (iproute2) and ``sshd`` (openssh-server, in ``make system-deps``).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def missing_requirements() -> str | None:
    """Why a node cannot be made here, or None."""
    if os.geteuid() != 0:
        return "an SSH test node needs root (network namespaces)"
    for tool in ("ip", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not Path(SSHD).is_file():
        return "sshd is not installed (apt-get install openssh-server; make system-deps)"
    return None


def _run(*argv: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")


def netns_pids(ns: str) -> list[int]:
    """Pids of the processes in network namespace ``ns`` (``ip netns pids``)."""
    proc = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30)
    return [int(p) for p in proc.stdout.split()] if proc.returncode == 0 else []


@dataclass
class SshNode:
    """One test node: its namespaces, sshd and the client-side files that reach it."""

    root: Path
    tag: str
    client_ns: str
    node_ns: str
    address: str
    alias: str
    key: Path
    ssh_config: Path
    state_dir: Path
    cluster_json: Path
    port: int = 22
    sshd: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start_sshd(self) -> None:
        """Start (or restart) the node's sshd and wait until it accepts connections."""
        if self.sshd is not None and self.sshd.poll() is None:
            return
        log = (self.root / "sshd.log").open("ab")
        # The node's own mount namespace too, with root's ~/.bashrc masked: bash run by sshd sources it, and
        # this host's (pyenv init: a rehash under a shared lock) made sessions hang for minutes when
        # other jobs held the lock. A real node's login files are its operator's; these are the test's.
        rc = Path(pwd.getpwuid(0).pw_dir, ".bashrc")
        start = f'mount --bind "$1" {shlex.quote(str(rc))} && exec "$2" -D -e -f "$3"' if rc.exists() else \
            'exec "$2" -D -e -f "$3"'
        self.sshd = subprocess.Popen(
            ["ip", "netns", "exec", self.node_ns, "unshare", "--mount", "--propagation", "private", "sh", "-c", start,
             "sh", str(self.root / "node_bashrc"), SSHD, str(self.root / "sshd_config")],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.sshd.poll() is not None:
                raise RuntimeError(f"sshd exited {self.sshd.returncode}: {(self.root / 'sshd.log').read_text()[-2000:]}")
            probe = subprocess.run(["ssh", "-F", str(self.ssh_config), self.alias, "true"],
                                   capture_output=True, timeout=30)
            if probe.returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"sshd on {self.alias} did not answer within 20 s: {(self.root / 'sshd.log').read_text()[-2000:]}")

    def kill_sshd(self) -> None:
        """The node stops answering: its sshd dies (what runs there already keeps running)."""
        if self.sshd is not None and self.sshd.poll() is None:
            self.sshd.kill()
            self.sshd.wait(timeout=10)
        # Session children of sshd (an RPC in flight) die with the link, as on a real host going away.
        for pid in netns_pids(self.node_ns):
            with contextlib.suppress(ProcessLookupError):
                if "sshd" in Path(f"/proc/{pid}/comm").read_text():
                    os.kill(pid, signal.SIGKILL)

    def kill_node(self) -> None:
        """The node dies as a host does (crash, power cut): sshd and every process of its sandboxes are
        killed; its sunabako state dir stays as it was on disk, still saying ``running``."""
        self.kill_sshd()
        for rec in _records(self):
            status = rec.get("status") or {}
            for key in ("supervisor_pid", "init_pid"):  # a sandbox's init takes its PID namespace with it
                if isinstance(status.get(key), int):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(status[key], signal.SIGKILL)
        _kill_all(self.node_ns)

    def ssh(self, command: str, *, input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run ``command`` on the node over SSH (as the operator would)."""
        return subprocess.run(["ssh", "-F", str(self.ssh_config), self.alias, command], input=input,
                              capture_output=True, text=True, timeout=timeout)

    @property
    def binary(self) -> str:
        return str(json.loads(self.cluster_json.read_text())["nodes"][0]["binary"])

    def init_sunabako(self, **config: object) -> None:
        """Provision the node's sunabako state over SSH (``init-node``), as an operator does for a cluster."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        res = self.ssh(f"{self.binary} --state {self.state_dir} init-node -", input=json.dumps(config))
        if res.returncode != 0:
            raise RuntimeError(f"init-node on {self.alias} exited {res.returncode}: {res.stderr.strip()}")

    def node_processes(self) -> list[int]:
        return netns_pids(self.node_ns)


def _write_configs(root: Path, alias: str, address: str, client_ns: str) -> tuple[Path, Path]:
    key = root / "client_key"
    host_key = root / "host_key"
    for path in (key, host_key):
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"lego-test-{alias}", "-f", str(path))
    (root / "node_bashrc").write_text("# the test node's root ~/.bashrc: nothing to run\n")
    (root / "authorized_keys").write_text(Path(f"{key}.pub").read_text())
    (root / "sshd_config").write_text("\n".join([
        f"ListenAddress {address}",
        "Port 22",
        f"HostKey {host_key}",
        f"AuthorizedKeysFile {root / 'authorized_keys'}",
        f"PidFile {root / 'sshd.pid'}",
        "PermitRootLogin prohibit-password",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",  # the key files live in a pytest tmp dir, not a 0700 home
        "MaxSessions 100",
        "MaxStartups 100:30:200",  # a burst of SDK RPCs each opens its own connection
        "LogLevel ERROR",
        "",
    ]))
    known = root / "known_hosts"
    key_type, key_b64 = Path(f"{host_key}.pub").read_text().split()[:2]
    known.write_text(f"{alias} {key_type} {key_b64}\n")  # pinned: StrictHostKeyChecking yes below
    relay = f"ip netns exec {client_ns} {sys.executable} {Path(__file__).resolve()} relay %h %p"
    config = root / "ssh_config"
    config.write_text("\n".join([
        f"Host {alias}",
        f"    HostName {address}",
        "    Port 22",
        "    User root",
        f"    IdentityFile {key}",
        "    IdentitiesOnly yes",
        f"    HostKeyAlias {alias}",
        f"    UserKnownHostsFile {known}",
        "    StrictHostKeyChecking yes",
        "    BatchMode yes",
        f"    ProxyCommand {relay}",
        "",
    ]))
    return key, config


@contextlib.contextmanager
def ssh_node(root: Path, *, name: str = "sandbox-0", sunabako_binary: str | None = None) -> Iterator[SshNode]:
    """A running SSH node under ``root``; everything it made is gone when the block ends."""
    reason = missing_requirements()
    if reason is not None:
        raise RuntimeError(reason)
    root.mkdir(parents=True, exist_ok=True)
    tag = secrets.token_hex(3)
    client_ns, node_ns = f"lego-snc-{tag}", f"lego-snn-{tag}"
    subnet = 4 * secrets.randbelow(64)  # inside the namespaces only; random so parallel nodes differ
    net = f"10.251.{secrets.randbelow(256)}"
    client_addr, address = f"{net}.{subnet + 1}", f"{net}.{subnet + 2}"
    alias = f"lego-node-{tag}"
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    made: list[str] = []
    made_dirs: list[Path] = []
    node: SshNode | None = None
    try:
        for ns in (client_ns, node_ns):
            _run("ip", "netns", "add", ns)
            made.append(ns)
        veth_c, veth_n = f"lsn{tag}c", f"lsn{tag}n"
        _run("ip", "link", "add", veth_c, "netns", client_ns, "type", "veth", "peer", "name", veth_n, "netns", node_ns)
        for ns, dev, addr in ((client_ns, veth_c, client_addr), (node_ns, veth_n, address)):
            _run("ip", "-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
            _run("ip", "-n", ns, "link", "set", dev, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        key, config = _write_configs(root, alias, address, client_ns)
        # Not under ``root`` (pytest's tmp dirs are 0700): sandbox guests chroot as another uid and must
        # traverse every directory above their rootfs copy.
        state_dir = Path(tempfile.mkdtemp(prefix=f"lego-sshnode-{tag}-", dir="/var/tmp"))
        state_dir.chmod(0o755)
        made_dirs.append(state_dir)
        binary = sunabako_binary or shutil.which("sunabako") or str(Path(sys.executable).with_name("sunabako"))
        cluster_json = root / "cluster.json"
        cluster_json.write_text(json.dumps({"nodes": [{
            "name": name, "host": alias, "port": 22, "state_dir": str(state_dir), "binary": binary}]}, indent=2))
        node = SshNode(root, tag, client_ns, node_ns, address, alias, key, config, state_dir, cluster_json)
        node.start_sshd()
        yield node
    finally:
        if node is not None:
            _destroy_sandboxes(node)
        for ns in reversed(made):
            _kill_all(ns)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        if node is not None and node.sshd is not None:
            node.sshd.wait(timeout=30)  # reap it: our child, killed above with everything in its namespace
        for path in made_dirs:
            shutil.rmtree(path, ignore_errors=True)


def _records(node: SshNode) -> list[dict[str, object]]:
    """The node's sandbox records, read from this host (the filesystem is shared)."""
    if not (node.state_dir / "node.json").exists():
        return []
    listing = subprocess.run([node.binary, "--state", str(node.state_dir), "list"], capture_output=True,
                             text=True, timeout=60)
    try:
        records = json.loads(listing.stdout) if listing.returncode == 0 else []
    except ValueError:
        return []
    return [r for r in records if isinstance(r, dict)] if isinstance(records, list) else []


def _destroy_sandboxes(node: SshNode) -> None:
    """Stop and delete every sandbox of the node's state dir (from this host)."""
    for rec in _records(node):
        sid = (rec.get("spec") or {}).get("id")  # type: ignore[union-attr]
        if sid:
            for op in ("stop", "delete"):
                subprocess.run([node.binary, "--state", str(node.state_dir), op, str(sid)], capture_output=True,
                               timeout=120)


def _kill_all(ns: str) -> None:
    for _ in range(50):
        pids = netns_pids(ns)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    raise RuntimeError(f"processes {netns_pids(ns)} in network namespace {ns} survived SIGKILL")


# --------------------------------------------------------------------------------------------------
# ProxyCommand (this file run as a script in the client namespace): relay stdin/stdout to host:port.


def _relay(host: str, port: int) -> int:
    try:
        sock = socket.create_connection((host, port), timeout=10)
    except OSError as exc:  # one line, as OpenSSH's own "ssh: connect to host ...: Connection refused"
        print(f"ssh: connect to host {host} port {port}: {exc.strerror or exc}", file=sys.stderr)
        return 255
    sock.settimeout(None)

    def upstream() -> None:
        with contextlib.suppress(OSError):
            while data := os.read(0, 65536):
                sock.sendall(data)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)

    threading.Thread(target=upstream, daemon=True).start()
    with contextlib.suppress(OSError):
        while data := sock.recv(65536):
            os.write(1, data)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "relay":
        sys.exit(_relay(sys.argv[2], int(sys.argv[3])))
    print("usage: sshnode.py relay HOST PORT", file=sys.stderr)
    sys.exit(2)
