"""The ``bwrap`` provider: single-machine sandboxes on bubblewrap, no daemon.

A sandbox is a state dir holding an overlay (image rootfs, or the host's ``/``, read-only below; a
per-sandbox writable layer above; see ``bwrap_state``). Each ``exec`` is one bwrap process that binds
the merged tree as ``/`` in fresh PID/IPC/UTS namespaces. Network: ``none`` = a fresh loopback-only
namespace per exec; ``host`` = the host's; ``allowlist`` = one namespace per sandbox, created at create
and joined by every exec (``nsenter``), whose only way out is a relay to the ``allow``ed endpoints
(the config's ``sandbox.network = "adapter"``: the adapter plus ``sandbox.network_allow``). Nothing outlives an exec: when its command exits, bwrap's PID 1 goes and the
kernel kills the rest of the namespace. Background daemons therefore do not persist between execs
(unlike sunabako); files do.

Users: ``root`` runs as real root with a Docker-like capability set and read-only ``/proc/sys``;
any other user (``agent`` is created at create time when the image lacks it) runs as its real uid,
dropped on the host by ``setpriv`` before an unprivileged bwrap starts, so files it writes carry
that uid for the grader and the patch capture. ``setpriv --pdeathsig KILL`` ties every exec to the
Python process: if it dies, its sandboxes' processes die too and ``lego sandbox gc`` sweeps the state.

Memory: ``memory_mb`` becomes an RLIMIT_DATA (``prlimit``) on every process, which counts heap and
anonymous mmaps but not the large PROT_NONE reservations of V8/Bun, so Node CLIs still start.
It is a per-process limit, not an aggregate one.

Disk: ``disk_mb`` puts the writable layer on a loop-mounted ext4 filesystem of that size
(``bwrap_state.mount_capped_layer``): a policy that fills its disk fills its own filesystem, not the host's.
Without it every write lands on the state dir's disk, uncapped.
"""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from pathlib import Path
from collections.abc import Sequence
from typing import IO, Any, ClassVar

from lego_rl.errors import SandboxError, SandboxLost, SandboxTimeout
from lego_rl.sandbox.base import ExecResult, ImageSpec, Sandbox, SandboxProvider, check_mount_target
from lego_rl.sandbox.base import cut_message as cut
from lego_rl.sandbox.bwrap_state import (
    DEFAULT_STATE_ROOT,
    GuestUser,
    SandboxMeta,
    _inside,
    destroy_state,
    mount_capped_layer,
    mount_overlay,
    prepare_upper,
    write_meta,
)
from lego_rl.sandbox.egress import EgressRelay, Endpoint, new_netns, parse_allow, start_relay
from lego_rl.sandbox.process import ProcessGroup, ProcessResult

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ROOT_CAPS = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID", "CAP_SETUID",
    "CAP_SETPCAP", "CAP_SETFCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_AUDIT_WRITE",
)
_USER_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
NETWORKS = ("none", "host", "allowlist")
MAX_EXEC_OUTPUT = 64 << 20  # bytes kept per stream of one exec; read_file is not capped


class BwrapSandbox(Sandbox):
    readonly_mounts: ClassVar[bool] = True

    def __init__(self, meta: SandboxMeta, directory: Path, *, network: str, memory_mb: int | None,
                 image: ImageSpec, bwrap: str, relay: EgressRelay | None = None) -> None:
        self.id = meta.id
        self.image = image
        self.meta = meta
        self.directory = directory
        self.network = network
        self.memory_mb = memory_mb
        self._root = directory / "root"
        self._bwrap = bwrap
        self._procs = ProcessGroup()
        self._closed = False
        self._mounts: dict[str, str] = {}
        """guest path -> host folder, bound read-only into every exec (``mount_readonly``)."""
        self.relay = relay
        """The egress relay of ``network="allowlist"`` (its namespace fd is held until close)."""

    # -- identity and argv -------------------------------------------------------------------
    def _user(self, name: str | None) -> GuestUser:
        name = name or "root"
        if name == "root":
            return GuestUser("root", 0, 0, "/root")
        if name == self.meta.agent.name:
            return self.meta.agent
        if not _USER_RE.fullmatch(name):
            raise SandboxError(f"invalid user name {name!r} for sandbox {self.id}")
        passwd = _inside(str(self._root), "etc/passwd")
        for line in (passwd.read_text(errors="replace").splitlines() if passwd and passwd.is_file() else []):
            row = line.split(":")
            if len(row) >= 6 and row[0] == name and row[2].isdigit() and row[3].isdigit():
                return GuestUser(name, int(row[2]), int(row[3]), row[5] or "/")
        raise SandboxError(f"user {name!r} does not exist in sandbox {self.id} (no /etc/passwd entry)")

    def _argv(self, cmd: list[str], user: GuestUser, env: dict[str, str], cwd: str) -> list[str]:
        argv = []
        if self.relay is not None:
            # nsenter execs setpriv in place (no fork for a network namespace), so pdeathsig still binds
            # the exec to this process.
            argv += ["nsenter", f"--net={self.relay.netns_path}", "--"]
        argv += ["setpriv", "--pdeathsig", "KILL"]
        if user.uid != 0:
            argv += [f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups"]
        argv.append("--")
        if self.memory_mb is not None:
            limit = self.memory_mb << 20
            argv += ["prlimit", f"--data={limit}:{limit}", "--"]
        argv += [self._bwrap, "--bind", str(self._root), "/", "--proc", "/proc", "--dev", "/dev"]
        # Sorted, so a mount nested in another one is bound after (on top of) its parent.
        for target in sorted(self._mounts):
            argv += ["--ro-bind", self._mounts[target], target]
        argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", self.id,
                 "--die-with-parent", "--new-session"]
        if self.network == "none":
            argv.append("--unshare-net")
        if user.uid == 0:
            argv += ["--ro-bind", "/proc/sys", "/proc/sys", "--cap-drop", "ALL"]
            for cap in ROOT_CAPS:
                argv += ["--cap-add", cap]
        argv.append("--clearenv")
        for key, value in env.items():
            argv += ["--setenv", key, value]
        return [*argv, "--chdir", cwd, "--", *cmd]

    def _env(self, user: GuestUser, extra: dict[str, str] | None) -> dict[str, str]:
        env = {"PATH": DEFAULT_PATH, **self.image.env}
        env.update(HOME=user.home, USER=user.name, LOGNAME=user.name)
        env.update(extra or {})
        return env

    async def _run(self, cmd: list[str], *, user: str | None, env: dict[str, str] | None, cwd: str | None,
                   timeout: float | None, stdin: bytes | IO[bytes] | None = None,
                   max_output: int | None = None) -> ProcessResult:
        if self._closed:
            raise SandboxError(f"sandbox {self.id} is closed")
        guest = self._user(user)
        cwd = cwd or self.image.workdir or "/"
        if not cwd.startswith("/"):
            cwd = os.path.join(self.image.workdir or "/", cwd)
        res = await self._procs.run(self._argv(cmd, guest, self._env(guest, env), cwd), stdin=stdin,
                                    timeout=timeout, env={"PATH": os.environ.get("PATH", DEFAULT_PATH)},
                                    max_output=max_output)
        if res.timed_out:
            return res
        if self._closed:
            raise SandboxError(f"sandbox {self.id} was closed while running {cut(str(cmd), 200)}")
        if res.returncode < 0:
            raise SandboxLost(f"sandbox {self.id} died: bwrap was killed by signal {-res.returncode}",
                              stdout=res.stdout.decode(errors="replace"),
                              stderr=res.stderr.decode(errors="replace"))
        if res.returncode == 1 and res.stderr.startswith(b"bwrap: "):
            raise SandboxError(f"bwrap could not start the command in {self.id}: {cut(res.stderr.decode())}")
        return res

    # -- contract ----------------------------------------------------------------------------
    async def exec(self, cmd: str | list[str], *, user: str | None = None, check: bool = False,
                   timeout: float | None = None, env: dict[str, str] | None = None,
                   cwd: str | None = None) -> ExecResult:
        argv = ["/bin/sh", "-lc", cmd] if isinstance(cmd, str) else list(cmd)
        res = await self._run(argv, user=user, env=env, cwd=cwd, timeout=timeout, max_output=MAX_EXEC_OUTPUT)
        result = ExecResult(
            exit_code=-9 if res.timed_out else res.returncode,
            stdout=res.stdout.decode(errors="replace"),
            stderr=res.stderr.decode(errors="replace"),
            duration_s=res.duration_s,
            timed_out=res.timed_out,
            truncated=res.truncated,
        )
        if check and result.timed_out:
            raise SandboxTimeout(f"{cut(str(cmd), 300)} timed out after {timeout} s in sandbox {self.id}")
        if check and result.exit_code != 0:
            raise SandboxError(
                f"{cut(str(cmd), 300)} exited {result.exit_code} in sandbox {self.id}: {cut(result.stderr)}"
            )
        return result

    async def write_file(self, path: str, content: str | bytes | Path, *, user: str | None = None) -> None:
        script = 'd=$(dirname -- "$1") && mkdir -p -- "$d" && cat > "$1"'
        argv = ["/bin/sh", "-c", script, "sh", path]
        if isinstance(content, Path):
            with content.open("rb") as fh:
                res = await self._run(argv, user=user, env=None, cwd="/", timeout=None, stdin=fh)
        else:
            data = content.encode() if isinstance(content, str) else bytes(content)
            res = await self._run(argv, user=user, env=None, cwd="/", timeout=None, stdin=data)
        if res.returncode != 0:
            raise SandboxError(f"writing {path} as {user or 'root'} in {self.id} failed: {cut(res.stderr.decode())}")

    async def read_file(self, path: str, *, user: str | None = None) -> bytes:
        res = await self._run(["cat", "--", path], user=user, env=None, cwd="/", timeout=None)
        if res.returncode != 0:
            raise SandboxError(f"reading {path} as {user or 'root'} in {self.id} failed: {cut(res.stderr.decode())}")
        return res.stdout

    async def mount_readonly(self, source: Path, target: str) -> None:
        """A ``--ro-bind`` in every later exec: one mount(2) per exec, nothing copied, and the kernel refuses
        writes to it from every user (root's capability set has no CAP_SYS_ADMIN to remount it)."""
        target = check_mount_target(target, self.id)
        src = Path(source).resolve()
        if not src.is_dir():
            raise SandboxError(f"mount source {source} for {target} in sandbox {self.id} is not a directory")
        for parent in (src, *src.parents):
            if not os.stat(parent).st_mode & 0o001:
                raise SandboxError(f"mount source {src} for {target} in sandbox {self.id} sits below {parent}, "
                                   "which the agent user cannot traverse (mode o-x)")
        # The mount point must exist: an unprivileged bwrap (the agent's) cannot create it under /opt.
        mkdir = await self._run(["mkdir", "-p", "--", target], user="root", env=None, cwd="/", timeout=60)
        if mkdir.returncode != 0:
            raise SandboxError(f"creating mount point {target} in sandbox {self.id} failed: "
                               f"{cut(mkdir.stderr.decode(errors='replace'))}")
        self._mounts[target] = str(src)

    def mounts(self) -> dict[str, str]:
        """The read-only mounts, guest path -> host folder."""
        return dict(self._mounts)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._procs.kill_all()
        try:
            await self._procs.wait_all()
        except TimeoutError:
            raise SandboxError(f"sandbox {self.id}: processes survived SIGKILL for 5 s (uninterruptible I/O?); "
                               "its state was still removed") from None
        finally:
            try:
                if self.relay is not None:
                    await self.relay.aclose()
                    os.close(self.relay.netns_fd)
            finally:
                destroy_state(self.directory, defer=True)


class BwrapProvider(SandboxProvider):
    """Creates ``BwrapSandbox``es under ``state_dir`` (default /var/lib/lego-rl/bwrap)."""

    name = "bwrap"

    def __init__(self, *, state_dir: str | os.PathLike[str] | None = None, bwrap: str = "bwrap") -> None:
        self.state_root = Path(state_dir or DEFAULT_STATE_ROOT)
        found = shutil.which(bwrap)
        if found is None:
            raise SandboxError(f"bubblewrap binary {bwrap!r} not found on PATH (apt-get install bubblewrap)")
        self.bwrap = found

    def _prepare_state_root(self) -> None:
        self.state_root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.state_root, 0o755)
        # The agent's bwrap runs unprivileged and must traverse every directory above the overlay.
        for parent in self.state_root.resolve().parents:
            if not os.stat(parent).st_mode & 0o001:
                raise SandboxError(f"bwrap state dir {self.state_root} sits below {parent}, which other users "
                                   "cannot traverse (mode o-x): pick a state_dir under a world-traversable path")

    async def create(self, image: ImageSpec, *, network: str = "none", memory_mb: int | None = None,
                     sandbox_id: str | None = None, allow: Sequence[str | Endpoint] = (),
                     disk_mb: int | None = None, **unknown: Any) -> BwrapSandbox:
        if unknown:
            raise SandboxError(f"bwrap provider: unknown option(s) {sorted(unknown)}; "
                               "known: network, allow, memory_mb, disk_mb, sandbox_id")
        if disk_mb is not None and (not isinstance(disk_mb, int) or isinstance(disk_mb, bool) or disk_mb < 64):
            raise SandboxError(f"bwrap provider: disk_mb must be an integer >= 64, got {disk_mb!r}")
        if network not in NETWORKS:
            raise SandboxError(f"bwrap provider: network must be one of {NETWORKS}, got {network!r}")
        endpoints = parse_allow(allow)
        if endpoints and network != "allowlist":
            raise SandboxError(f"bwrap provider: allow={[str(e) for e in endpoints]} needs network='allowlist' "
                               f"(network={network!r} would ignore it)")
        if memory_mb is not None and (not isinstance(memory_mb, int) or memory_mb < 16):
            raise SandboxError(f"bwrap provider: memory_mb must be an integer >= 16, got {memory_mb!r}")
        if os.geteuid() != 0:
            raise SandboxError(f"bwrap provider needs root to mount its overlay (running as uid {os.geteuid()})")
        lower = os.path.realpath(image.rootfs or "/")
        if not os.path.isdir(lower):
            raise SandboxError(f"image {image.name!r}: rootfs {image.rootfs!r} is not a directory")
        if not image.workdir.startswith("/"):
            raise SandboxError(f"image {image.name!r}: workdir {image.workdir!r} must be absolute")
        sid = sandbox_id or f"bw-{uuid.uuid4().hex[:12]}"
        self._prepare_state_root()
        directory = self.state_root / sid
        try:
            directory.mkdir(mode=0o755)
        except FileExistsError:
            raise SandboxError(f"sandbox id {sid!r} is already in use under {self.state_root}") from None
        try:
            os.chmod(directory, 0o755)
            layer = await mount_capped_layer(directory, disk_mb) if disk_mb is not None else directory
            for name, mode in (("upper", 0o755), ("work", 0o700)):
                (layer / name).mkdir()
                os.chmod(layer / name, mode)
            (directory / "root").mkdir()
            os.chmod(directory / "root", 0o755)
            agent = prepare_upper(lower, layer / "upper", image.workdir)
            meta = SandboxMeta(sid, image.name, lower, image.workdir, os.getpid(), time.time(), agent)
            write_meta(directory, meta)
            mount_overlay(lower, layer / "upper", layer / "work", directory / "root")
        except BaseException:
            destroy_state(directory)
            raise
        relay = None
        if network == "allowlist":
            fd = new_netns()
            try:
                relay = await start_relay(fd, f"/proc/{os.getpid()}/fd/{fd}", endpoints)
            except BaseException:
                os.close(fd)
                destroy_state(directory)
                raise
        return BwrapSandbox(meta, directory, network=network, memory_mb=memory_mb, image=image, bwrap=self.bwrap,
                            relay=relay)
