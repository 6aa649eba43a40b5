"""The ``sunabako`` provider: the real ``sunabako==0.1.2`` SDK behind our Sandbox contract.

Nodes: one local node (``state_dir`` + ``binary``), or the nodes of a ``cluster.json`` reached over
SSH (credentials from the existing SSH configuration, or from the client config file ``ssh_config``;
a node without ``port`` uses ``ssh_port``). A local node without ``node.json`` is initialised here;
cluster nodes are the operator's to provision, and are only checked. A node that stops answering
over SSH under a command (sshd gone, link down) raises ``SandboxLost`` naming the node: a rollout
records ``sandbox_lost``, and ``lego sandbox gc`` collects what it left there once it is back.

Memory: cgroup enforcement by default. ``test_memory=True`` is the explicit functional-test setting
for machines without a delegated cgroup v2 subtree: it needs the node's
``allow_unbounded_memory_for_tests`` and creates sandboxes with ``memory_mode="rss"`` (an RSS
supervisor kills a sandbox over its limit; no hard aggregate limit). It maps the reference's
``SUNABAKO_ALLOW_TEST_MEMORY``.

Known SDK/runtime behaviours handled here (see FIELD-NOTES): creates fail with "key must be a string"
(interleaved JSON during the guest-UID mapping handshake; the SDK has already cleaned up) and are
retried. Measured here: ~5% on an idle machine, ~60% at load 5 on 2 cores, never with
uid_range_size=1 (which rules out guest users);
``stop`` right after a timeout or an OOM kill can fail while the status lags, so stop is retried
before ``delete``; runtime errors can carry whole supervisor logs, so messages are cut.

Network: the runtime offers ``none`` (a private namespace, loopback only) and ``host``. ``allowlist``
is ours on top of ``none``, on a local node only: the sandbox's namespace (that of its init, whose pid
the node's ``inspect`` reports) is entered from this host to put the egress relay's listeners in it
(``egress``). A remote node (cluster.json over SSH) cannot be entered from here and sunabako 0.1.2 has
no per-address filter, so ``allowlist`` is refused there: choose ``host`` (unconfined) or ``none``.

Timeouts: when the runtime's own exec timeout fires, the sandbox's init exits and the whole sandbox
is lost (status "failed"). A rollout must still capture the patch after the agent's time budget, so a
command with a timeout runs under the image's coreutils ``timeout`` (TERM, then KILL 2 s later, to
the command's process group), and the runtime timeout is only a backstop a little later. A command
that outlives both kills its sandbox; later calls then raise SandboxError.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import os
import random
import re
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lego_rl.errors import SandboxError, SandboxLimitExceeded, SandboxLost, SandboxTimeout
from lego_rl.sandbox.base import ExecResult, ImageSpec, Sandbox, SandboxProvider, cut_message
from lego_rl.sandbox.egress import EgressRelay, Endpoint, parse_allow, start_relay
from lego_rl.sandbox.sunabako_stage import RootfsStage
from lego_rl.sandbox.warm_pool import WarmPool

log = logging.getLogger(__name__)

# The same handshake race shows up as different JSON parse errors, or as an empty setup reason.
TRANSIENT_CREATE_ERRORS = re.compile(
    r"key must be a string|expected `,` or `}`|EOF while parsing|at line \d+ column \d+|startup failed: ;"
)
MAX_EXEC_TIMEOUT_S = 86400  # the runtime accepts 1..86400 s
NETWORKS = ("none", "host", "allowlist")
ENSURE_USER = (
    'id -u agent >/dev/null 2>&1 || useradd -m -U -s /bin/sh agent || exit 90; mkdir -p -- "$1" || exit 91; '
    'command -v timeout >/dev/null && echo has-timeout'
)
# What OpenSSH (the SDK's transport to a cluster node) prints when the node, not the sandbox, failed:
# the SDK keeps only the message, so the node's loss is told from a command's failure by these.
SSH_TRANSPORT_ERRORS = re.compile(
    r"ssh: connect to host|Connection closed by|Connection reset by|kex_exchange_identification|"
    r"Connection refused|Connection timed out|Broken pipe|ssh_exchange_identification|"
    r"Could not resolve hostname|No route to host|Transport timed out|client_loop: send disconnect|"
    r"Network is unreachable|port \d+: Connection|Connection to \S+ closed by remote host"
)
# The status reasons of a sandbox its supervisor killed because its own processes went over a limit set
# at create ("sandbox closed the RPC (inspect status for OOM/timeout/exit)" is all the failing RPC says).
LIMIT_REASONS = {"memory_limit_exceeded": "memory", "process_limit_exceeded": "process"}
RPC_CLOSED = "sandbox closed the RPC"
STATUS_SETTLE_S = 5.0  # the RPC closes ~50 ms before the supervisor records why (measured on a local node)
BACKSTOP_S = 15  # runtime timeout beyond the in-sandbox one: only a command immune to SIGKILL reaches it
TIMEOUT_EXITS = (124, 137)  # coreutils timeout: TERM worked / KILL was needed


def _sdk() -> Any:
    try:
        import sunabako
    except ImportError as exc:
        raise SandboxError("the sunabako provider needs the SDK: pip install 'lego-rl[sunabako]'") from exc
    return sunabako


def _default_binary() -> str:
    return os.environ.get("SUNABAKO_BINARY") or shutil.which("sunabako") or str(
        Path(sys.executable).with_name("sunabako")
    )


def _env_flag(name: str) -> bool | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    if value not in ("0", "1"):
        raise SandboxError(f"${name} must be 0 or 1, got {value!r}")
    return value == "1"


_NODE_CLASSES: dict[int, type] = {}


def _node_class(sdk: Any) -> type:
    """The SDK's ``Node`` that also passes ``-F ssh_config`` to ssh (the SDK has no option for it).

    sunabako 0.1.2 builds ``["ssh", "-p", PORT, ..., host, command]`` in ``Node._command``; the file goes
    right after ``ssh``. A release that builds the command otherwise is refused, not silently ignored."""
    cls = _NODE_CLASSES.get(id(sdk))
    if cls is None:
        @dataclasses.dataclass(frozen=True)
        class SshConfigNode(sdk.Node):  # type: ignore[misc,name-defined]
            ssh_config: str = ""

            def _command(self, args: tuple[str, ...]) -> list[str]:
                argv: list[str] = super()._command(args)
                if not (self.host and self.ssh_config):
                    return argv
                if argv[:2] != ["ssh", "-p"]:
                    raise SandboxError(f"sunabako node {self.name}: this SDK's SSH command {argv[:3]} is not the "
                                       "one ssh_config was written for (sunabako 0.1.2)")
                return ["ssh", "-F", self.ssh_config, *argv[1:]]

        cls = _NODE_CLASSES[id(sdk)] = SshConfigNode
    return cls


NODE_KEYS = ("name", "host", "port", "state_dir", "binary", "rootfs")


def load_cluster_nodes(path: str | os.PathLike[str], *, ssh_config: str | None = None, ssh_port: int = 22,
                       sdk: Any = None) -> list[Any]:
    """The SDK nodes of a cluster.json; a bad file or node is named precisely (file, node index, key). A node
    without ``host`` is on this machine (its ``state_dir`` and ``binary`` used directly, no SSH)."""
    sdk = sdk or _sdk()
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise SandboxError(f"sunabako cluster file {path}: {exc}") from exc
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(nodes, list) or not nodes:
        raise SandboxError(f"sunabako cluster file {path}: needs a non-empty `nodes` list")
    cls = _node_class(sdk)
    out = []
    for i, raw in enumerate(nodes):
        where = f"sunabako cluster file {path}: node {i}"
        if not isinstance(raw, dict):
            raise SandboxError(f"{where} must be an object, got {type(raw).__name__}")
        unknown = sorted(set(raw) - set(NODE_KEYS))
        if unknown:
            raise SandboxError(f"{where} has unknown key(s) {unknown}; known: {', '.join(NODE_KEYS)}")
        if not raw.get("name"):
            raise SandboxError(f"{where} needs a `name` (and a `host` unless the node is this machine)")
        if "host" in raw and (not isinstance(raw["host"], str) or not raw["host"]):
            raise SandboxError(f"{where} ({raw['name']}): host must be a non-empty string, got {raw['host']!r}")
        port = raw.get("port", ssh_port)
        if not isinstance(port, int) or not 1 <= port <= 65535:
            raise SandboxError(f"{where} ({raw['name']}): port must be an integer 1..65535, got {port!r}")
        out.append(cls(**{**raw, "port": port}, ssh_config=str(ssh_config or "")))
    if len({n.name for n in out}) != len(out):
        raise SandboxError(f"sunabako cluster file {path}: node names must be distinct")
    return out


def ssh_argv(node: Any, command: str) -> list[str]:
    """OpenSSH argv running the shell ``command`` on a cluster node, with the options the SDK uses."""
    argv = ["ssh", "-p", str(node.port), "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", node.host, command]
    config = getattr(node, "ssh_config", "")
    return ["ssh", "-F", config, *argv[1:]] if config else argv


async def node_shell(node: Any, command: str, *, timeout: float = 60) -> str:
    """Stdout of the shell ``command`` run on a cluster node over SSH; ``SandboxError`` names the node."""
    proc = await asyncio.create_subprocess_exec(*ssh_argv(node, command), stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise SandboxError(f"sunabako node {node.name} ({node.host}): no answer over SSH within {timeout:g} s") from None
    if proc.returncode != 0:
        raise SandboxError(f"sunabako node {node.name} ({node.host}): `{cut_message(command, 200)}` exited "
                           f"{proc.returncode}: {cut_message(err.decode(errors='replace'), 500)}")
    return out.decode(errors="replace")


def transport_lost(exc: BaseException, node: Any) -> bool:
    """Whether an SDK error is the SSH link to a cluster node failing (not the command or the sandbox)."""
    return bool(getattr(node, "host", None)) and SSH_TRANSPORT_ERRORS.search(str(exc)) is not None


class SunabakoSandbox(Sandbox):
    def __init__(self, inner: Any, image: ImageSpec, sdk: Any) -> None:
        self._inner = inner  # sunabako.AsyncSandbox
        self._sdk = sdk
        self.id = inner.sandbox_id
        self.image = image
        self.node_name = inner.node.name
        self._closed = False
        self.has_timeout = False  # set at create: the image has coreutils `timeout`
        self.relay: EgressRelay | None = None
        """The egress relay of ``network="allowlist"`` (its namespace fd is held until close)."""

    def _fail(self, what: str, exc: BaseException) -> SandboxError:
        state = " (sandbox closed)" if self._closed else ""
        if transport_lost(exc, self._inner.node):
            return SandboxLost(f"sunabako node {self.node_name} ({self._inner.node.host}) stopped answering over SSH "
                               f"during {what} in {self.id}: {cut_message(str(exc), 500)}; its leftovers are "
                               "collected by `lego sandbox gc --provider sunabako` once it is back")
        return SandboxError(f"sunabako {what} in {self.id} on node {self.node_name}{state}: {cut_message(str(exc))}")

    async def _failure(self, what: str, exc: BaseException) -> SandboxError:
        """``_fail``, except that a sandbox killed for going over its own limits is told apart (the node is
        asked why): a policy can cause that (a memory hog), so it must not read as an outage."""
        error = self._fail(what, exc)
        if isinstance(error, SandboxLost):
            return error
        deadline = time.monotonic() + (STATUS_SETTLE_S if RPC_CLOSED in str(exc) else 0)
        try:
            while True:
                info = await self._inner.node.call_async("inspect", self.id, timeout=30)
                status, spec = info["status"], info["spec"]
                if status.get("state") != "running" or time.monotonic() >= deadline:
                    break
                await asyncio.sleep(0.05)
            reason = status.get("reason")
        except (self._sdk.SandboxError, KeyError, TypeError, AttributeError, ValueError):
            return error  # no better answer than the RPC's own
        if status.get("state") != "failed" or reason not in LIMIT_REASONS:
            return error
        peak, limit = status.get("memory_peak"), spec.get("memory_bytes")
        seen = (f"; memory peak {peak >> 20} MiB of {limit >> 20} MiB"
                if isinstance(peak, int) and isinstance(limit, int) else "")
        return SandboxLimitExceeded(
            f"sandbox {self.id} on node {self.node_name} was killed during {what}: its processes went over "
            f"its {LIMIT_REASONS[reason]} limit ({reason}{seen})", limit=reason)

    def _abs(self, path: str) -> str:
        return path if path.startswith("/") else os.path.join(self.image.workdir or "/", path)

    async def exec(self, cmd: str | list[str], *, user: str | None = None, check: bool = False,
                   timeout: float | None = None, env: dict[str, str] | None = None,
                   cwd: str | None = None) -> ExecResult:
        if self._closed:
            raise SandboxError(f"sandbox {self.id} is closed")
        argv = ["/bin/sh", "-lc", cmd] if isinstance(cmd, str) else list(cmd)
        limit = MAX_EXEC_TIMEOUT_S
        if timeout is not None:
            if timeout <= 0:
                raise SandboxError(f"timeout must be positive, got {timeout}")
            limit = min(MAX_EXEC_TIMEOUT_S, math.ceil(timeout) + (BACKSTOP_S if self.has_timeout else 0))
            if self.has_timeout:
                argv = ["timeout", "-k", "2", f"{timeout:g}", *argv]
        start = time.monotonic()
        try:
            raw = await self._inner.commands.run(
                argv, timeout=limit, envs=env or {}, cwd=self._abs(cwd or self.image.workdir or "/"),
                user=user or "root", check=False,
            )
        except (self._sdk.SandboxError, ValueError) as exc:
            raise await self._failure(f"exec of {cut_message(str(cmd), 200)}", exc) from exc
        elapsed = time.monotonic() - start
        timed_out = raw.timed_out or (
            timeout is not None and self.has_timeout and raw.exit_code in TIMEOUT_EXITS and elapsed >= timeout
        )
        result = ExecResult(raw.exit_code, raw.stdout, raw.stderr, elapsed, timed_out, raw.truncated)
        if check and result.timed_out:
            raise SandboxTimeout(f"{cut_message(str(cmd), 300)} timed out after {timeout} s in sandbox {self.id}")
        if check and result.exit_code != 0:
            raise SandboxError(f"{cut_message(str(cmd), 300)} exited {result.exit_code} in sandbox "
                               f"{self.id}: {cut_message(result.stderr)}")
        return result

    async def write_file(self, path: str, content: str | bytes | Path, *, user: str | None = None) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self.id} is closed")
        target = self._abs(path)
        parent = os.path.dirname(target)
        # The runtime's write op does not create parent directories; do it as the same user.
        mk = await self.exec(["mkdir", "-p", "--", parent], user=user, cwd="/")
        if not mk.ok:
            raise SandboxError(f"writing {target} as {user or 'root'} in {self.id} failed: {cut_message(mk.stderr)}")
        try:
            await self._inner.files.write(target, content, user=user or "root")
        except (self._sdk.SandboxError, ValueError, OSError) as exc:
            raise await self._failure(f"write of {target} as {user or 'root'}", exc) from exc

    async def read_file(self, path: str, *, user: str | None = None) -> bytes:
        if self._closed:
            raise SandboxError(f"sandbox {self.id} is closed")
        target = self._abs(path)
        try:
            return bytes(await self._inner.files.read(target, format="bytes", user=user or "root"))
        except (self._sdk.SandboxError, ValueError) as exc:
            raise await self._failure(f"read of {target} as {user or 'root'}", exc) from exc

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self.relay is not None:
                await self.relay.aclose()
                os.close(self.relay.netns_fd)
        finally:
            try:
                await destroy(self._inner.node, self.id, self._sdk)
            except SandboxLost as exc:
                # Nothing on this side can stop it while the node is unreachable; raising would only replace
                # the error that ended the rollout (sandbox_lost) with a close failure. It is the node's
                # leftover now: `lego sandbox gc` on the cluster destroys it when the node answers again.
                log.warning("%s", exc)


def _lost_node(node: Any, sandbox_id: str, op: str, exc: BaseException) -> SandboxLost:
    return SandboxLost(f"sunabako node {node.name} ({node.host}) is unreachable over SSH, so {op} of sandbox "
                       f"{sandbox_id} could not run: {cut_message(str(exc), 300)}; it is left on the node for "
                       "`lego sandbox gc --provider sunabako` (with the cluster) once the node is back")


async def destroy(node: Any, sandbox_id: str, sdk: Any, *, stop_window_s: float = 1.0) -> None:
    """Stop then delete; never give up silently. Stop is retried while the status lags an OOM/timeout.

    A cluster node unreachable over SSH raises ``SandboxLost`` at once (retries cannot reach it)."""
    deadline = time.monotonic() + stop_window_s
    while True:
        try:
            await node.call_async("stop", sandbox_id, timeout=60)
            break
        except sdk.SandboxError as exc:
            if transport_lost(exc, node):
                raise _lost_node(node, sandbox_id, "stop", exc) from exc
            text = str(exc)
            if "not found" in text or "no such" in text.lower():
                return  # already gone
            if time.monotonic() > deadline:
                log.warning("sunabako stop of %s kept failing (%s); deleting anyway", sandbox_id, cut_message(text, 300))
                break
            await asyncio.sleep(0.1)
    last: BaseException | None = None
    for _ in range(5):
        try:
            await node.call_async("delete", sandbox_id, timeout=120)
            return
        except sdk.SandboxError as exc:
            if transport_lost(exc, node):
                raise _lost_node(node, sandbox_id, "delete", exc) from exc
            last = exc
            # "No such file or directory": its state dir is already gone (a gc of the node got there first).
            if "not found" in str(exc) or "no such" in str(exc).lower():
                return
            await asyncio.sleep(0.2)
            try:
                await node.call_async("stop", sandbox_id, timeout=60)
            except sdk.SandboxError:
                pass
    raise SandboxError(f"sunabako could not delete sandbox {sandbox_id} on node {node.name}: "
                       f"{cut_message(str(last))}; run `lego sandbox gc --provider sunabako`")


class SunabakoProvider(SandboxProvider):
    """Sandboxes on one local sunabako node or on the nodes of a cluster.json."""

    name = "sunabako"

    def __init__(
        self,
        *,
        cluster: str | os.PathLike[str] | None = None,
        state_dir: str = "/var/lib/sunabako",
        binary: str | None = None,
        allow_test_memory: bool | None = None,
        test_memory: bool | None = None,
        memory_mb: int | None = None,
        create_retries: int = 12,
        create_timeout_s: float = 600,
        node_config: dict[str, Any] | None = None,
        warm_pool: int = 0,
        stage_rootfs: bool | None = None,
        ssh_config: str | os.PathLike[str] | None = None,
        ssh_port: int = 22,
    ) -> None:
        self._sdk = _sdk()
        cluster = cluster or os.environ.get("SUNABAKO_CLUSTER") or None
        # allow_test_memory is the config key (sandbox.allow_test_memory); test_memory is the name the
        # first callers used. Either may be given; $SUNABAKO_ALLOW_TEST_MEMORY applies when neither is.
        if allow_test_memory is not None and test_memory is not None and allow_test_memory != test_memory:
            raise SandboxError(f"sunabako provider: allow_test_memory={allow_test_memory} contradicts "
                               f"test_memory={test_memory}; pass one")
        explicit = allow_test_memory if allow_test_memory is not None else test_memory
        self.test_memory = bool(explicit if explicit is not None else _env_flag("SUNABAKO_ALLOW_TEST_MEMORY"))
        self.memory_mb = memory_mb or int(os.environ.get("SUNABAKO_MEMORY_MB", "2048"))
        self.create_retries = create_retries
        self.create_timeout_s = create_timeout_s
        self.node_config = dict(node_config or {})
        if not isinstance(warm_pool, int) or warm_pool < 0:
            raise SandboxError(f"sunabako provider: warm_pool must be an integer >= 0, got {warm_pool!r}")
        self.pool = WarmPool(self._create_now, warm_pool) if warm_pool else None
        """Sandboxes created ahead (``warm_pool`` of them at most); None when off."""
        if ssh_config is not None and not Path(ssh_config).is_file():
            raise SandboxError(f"sunabako provider: ssh_config {ssh_config} is not a file")
        if cluster:
            nodes = load_cluster_nodes(cluster, ssh_config=None if ssh_config is None else str(ssh_config),
                                       ssh_port=ssh_port, sdk=self._sdk)
            self.cluster: Any = self._sdk.Cluster(nodes)
            self.node: Any = None
        else:
            self.cluster = None
            self.node = self._sdk.Node(name="local", state_dir=state_dir, binary=binary or _default_binary())
        # A reflink copy of each image next to the node's state: the node's own `cp --reflink=auto` then
        # clones it in a fraction of a second instead of copying every byte (local node only).
        self.stage: RootfsStage | None = None
        if self.node is not None and stage_rootfs is not False:
            self.stage = RootfsStage.for_state_dir(state_dir, required=stage_rootfs is True)
        self._checked = False
        self._check_lock = asyncio.Lock()

    async def aclose(self) -> None:
        """Close the warm pool's sandboxes (and those still being made for it)."""
        if self.pool is not None:
            await self.pool.aclose()

    @property
    def nodes(self) -> list[Any]:
        return list(self.cluster.nodes) if self.cluster else [self.node]

    async def _check_nodes(self) -> None:
        """Once per provider: initialise a fresh local node, and verify every node's settings."""
        if self._checked:
            return
        async with self._check_lock:  # a run's rollouts share the provider: one init-node, not one each
            if not self._checked:
                await self._check_nodes_now()

    async def _check_nodes_now(self) -> None:
        if self.node is not None and not Path(self.node.state_dir, "node.json").exists():
            config = {"uid_range_size": 65536, **self.node_config}
            if self.test_memory:
                config["allow_unbounded_memory_for_tests"] = True
            Path(self.node.state_dir).mkdir(parents=True, exist_ok=True)
            try:
                await self.node.call_async("init-node", "-", data=config, timeout=60)
            except self._sdk.SandboxError as exc:
                hint = "" if self.test_memory else (
                    " (without delegated cgroups only the test memory mode works: test_memory=True / "
                    "SUNABAKO_ALLOW_TEST_MEMORY=1)")
                raise SandboxError(f"sunabako could not initialise node {self.node.state_dir}: "
                                   f"{cut_message(str(exc), 400)}{hint}") from exc
        for node in self.nodes:
            try:
                cap = await node.call_async("capacity", timeout=20)
            except self._sdk.SandboxError as exc:
                raise SandboxError(f"sunabako node {node.name} is not usable: {cut_message(str(exc))}") from exc
            cfg = cap.get("config", {})
            if self.test_memory and not cfg.get("allow_unbounded_memory_for_tests"):
                raise SandboxError(f"sunabako node {node.name}: test memory mode asked for, but the node lacks "
                                   "allow_unbounded_memory_for_tests: re-run init-node with it set")
            if int(cfg.get("uid_range_size", 1)) <= 1:
                raise SandboxError(f"sunabako node {node.name}: uid_range_size must be > 1 (use 65536) for the "
                                   "non-root guest user 'agent'")
        self._checked = True

    async def create(self, image: ImageSpec, *, memory_mb: int | None = None, network: str = "none",
                     sandbox_id: str | None = None, pids_max: int = 256, allow: Sequence[str | Endpoint] = (),
                     **unknown: Any) -> SunabakoSandbox:
        options = {"memory_mb": memory_mb, "network": network, "pids_max": pids_max, "allow": tuple(allow)}
        if self.pool is None or sandbox_id is not None:
            return await self._create_now(image, dict(options, sandbox_id=sandbox_id, **unknown))
        self._check_options(image, network, parse_allow(allow), unknown)  # refuse bad input before the pool
        sb = await self.pool.take(image, options)
        assert isinstance(sb, SunabakoSandbox)
        return sb

    def _check_options(self, image: ImageSpec, network: str, endpoints: Sequence[Endpoint],
                       unknown: dict[str, Any]) -> None:
        if unknown:
            raise SandboxError(f"sunabako provider: unknown option(s) {sorted(unknown)}; "
                               "known: memory_mb, network, allow, sandbox_id, pids_max")
        if network not in NETWORKS:
            raise SandboxError(f"sunabako provider: network must be one of {NETWORKS}, got {network!r}")
        if endpoints and network != "allowlist":
            raise SandboxError(f"sunabako provider: allow={[str(e) for e in endpoints]} needs network='allowlist' "
                               f"(network={network!r} would ignore it)")
        if network == "allowlist" and (self.cluster is not None or self.node.host):
            raise SandboxError("sunabako provider: network='allowlist' needs the local node (its sandboxes' network "
                               "namespaces are entered from this host); sunabako has no per-address filter for "
                               "cluster nodes: set sandbox.network to 'host' (unconfined) or 'none'")
        if not image.rootfs:
            raise SandboxError(f"image {image.name!r} has no rootfs: sunabako boots an imported rootfs "
                               "(lego images), not the host's /")

    async def _create_now(self, image: ImageSpec, options: dict[str, Any]) -> SunabakoSandbox:
        """One create, now (the pool's ``make``): the SDK create with retries, relay, guest user."""
        options = dict(options)
        memory_mb, network = options.pop("memory_mb", None), options.pop("network", "none")
        sandbox_id, pids_max = options.pop("sandbox_id", None), options.pop("pids_max", 256)
        endpoints = parse_allow(options.pop("allow", ()))
        self._check_options(image, network, endpoints, options)
        await self._check_nodes()
        runtime_network = "none" if network == "allowlist" else network
        rootfs = image.rootfs or ""
        if self.stage is not None:
            rootfs = await self.stage.staged(rootfs)
        inner = await self._create_with_retries(image, rootfs, memory_mb or self.memory_mb, runtime_network,
                                                sandbox_id, pids_max)
        sb = SunabakoSandbox(inner, image, self._sdk)
        try:
            if network == "allowlist":
                sb.relay = await self._relay_into(sb, endpoints)
            # Imported images rarely have the guest user the CLI runs as; add it, and the workdir.
            res = await sb.exec(["/bin/sh", "-c", ENSURE_USER, "sh", image.workdir or "/"], cwd="/", timeout=60)
            if not res.ok:
                raise SandboxError(f"preparing sandbox {sb.id} (user agent, workdir {image.workdir}) failed "
                                   f"with exit {res.exit_code}: {cut_message(res.stderr)}")
            sb.has_timeout = "has-timeout" in res.stdout
            if not sb.has_timeout:
                log.warning("image %s has no coreutils `timeout`: a command timeout will kill sandbox %s",
                            image.name, sb.id)
        except BaseException:
            await sb.close()
            raise
        return sb

    async def _create_with_retries(self, image: ImageSpec, rootfs: str, memory_mb: int, network: str,
                                   sandbox_id: str | None, pids_max: int) -> Any:
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._sdk.AsyncSandbox.create(
                    rootfs, node=self.node, cluster=self.cluster, memory_mb=memory_mb,
                    memory_mode="rss" if self.test_memory else "cgroup", runtime="native",
                    network=network, envs=dict(image.env), pids_max=pids_max, sandbox_id=sandbox_id,
                    create_timeout=self.create_timeout_s,
                )
            except (self._sdk.SandboxError, ValueError) as exc:
                text = str(exc)
                transient = TRANSIENT_CREATE_ERRORS.search(text) is not None
                if transient and attempt <= self.create_retries:
                    log.warning("sunabako create failed transiently (attempt %d): %s", attempt, cut_message(text, 200))
                    await asyncio.sleep(random.uniform(0.05, 0.25))  # de-synchronise concurrent creators
                    continue
                raise SandboxError(f"sunabako could not create a sandbox of {image.name!r} "
                                   f"(attempt {attempt}): {cut_message(text)}") from exc

    async def _relay_into(self, sb: SunabakoSandbox, endpoints: Sequence[Endpoint]) -> EgressRelay:
        """Hold the sandbox's network namespace (its init's) and start the egress relay in it."""
        try:
            info = await self.node.call_async("inspect", sb.id, timeout=30)
            init_pid = int(info["status"]["init_pid"])
        except (self._sdk.SandboxError, KeyError, TypeError, ValueError) as exc:
            raise SandboxError(f"sunabako sandbox {sb.id}: no init pid to reach its network namespace: "
                               f"{cut_message(str(exc), 300)}") from exc
        try:
            fd = os.open(f"/proc/{init_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise SandboxError(f"sunabako sandbox {sb.id}: cannot open the network namespace of its init "
                               f"(pid {init_pid}): {exc.strerror}") from None
        try:
            # Commands must run in that namespace, else the relay confines nothing: check, do not assume.
            ours = os.readlink(f"/proc/self/fd/{fd}")
            res = await sb.exec(["readlink", "/proc/self/ns/net"], cwd="/", timeout=30)
            if res.stdout.strip() != ours:
                raise SandboxError(f"sunabako sandbox {sb.id}: commands run in network namespace "
                                   f"{res.stdout.strip() or res.stderr.strip()!r}, not its init's {ours!r}; "
                                   "network='allowlist' cannot confine them")
            return await start_relay(fd, f"/proc/{os.getpid()}/fd/{fd}", endpoints)
        except BaseException:
            os.close(fd)
            raise
