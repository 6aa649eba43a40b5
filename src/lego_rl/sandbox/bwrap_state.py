"""On-disk state of bwrap sandboxes: the per-sandbox overlay, the guest user, listing and gc.

Each sandbox owns ``<state_root>/<id>/``::

    meta.json   who owns it (host pid), which image, the agent uid: lets `lego sandbox gc` find leaks
    upper/      the overlay's writable layer: every write of the sandbox's life lands here
    work/       overlayfs scratch
    root/       the merged view (image rootfs below, upper/ on top), mounted once at create

With a disk cap (``disk_mb``) ``upper/`` and ``work/`` live in ``layer/``, a loop-mounted ext4 filesystem of
that size in the sparse file ``layer.img``: a sandbox that fills its disk gets ENOSPC inside its own
filesystem (its own outcome), and the host's disk, shared by every other sandbox, run log and checkpoint,
loses at most ``disk_mb``. Costs ~15-30 ms at create (mkfs, mount) and ~5 ms at destroy.

Why one host-side overlay rather than copying the workdir: it costs one mount(2) whatever the image
size, the whole tree stays writable (a CLI may install under /usr/local), the image itself is never
modified, and every exec (a new bwrap process) binds the same merged tree, so writes persist for the
sandbox's life and concurrent execs see one filesystem. It needs root (CAP_SYS_ADMIN).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from lego_rl.errors import SandboxError
from lego_rl.sandbox.process import ProcessGroup

DEFAULT_STATE_ROOT = "/var/lib/lego-rl/bwrap"
MNT_DETACH = 2
AGENT_USER = "agent"
_LIBC = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class GuestUser:
    name: str
    uid: int
    gid: int
    home: str


@dataclass(frozen=True)
class SandboxMeta:
    """What ``meta.json`` records about one sandbox."""

    id: str
    image: str
    lower: str
    workdir: str
    owner_pid: int
    created: float
    agent: GuestUser

    @staticmethod
    def load(path: Path) -> SandboxMeta:
        raw = json.loads(path.read_text())
        raw["agent"] = GuestUser(**raw["agent"])
        return SandboxMeta(**raw)


def mount_overlay(lower: str, upper: Path, work: Path, target: Path) -> None:
    for p in (lower, str(upper), str(work)):
        if "," in p or ":" in p:
            raise SandboxError(f"overlay path {p!r} contains ',' or ':', which mount options cannot carry")
    # volatile: no sync of the upper fs on unmount; a throw-away layer needs no durability, and a
    # syncfs of the shared disk made destroy cost 50+ ms under load.
    opts = f"lowerdir={lower},upperdir={upper},workdir={work},volatile".encode()
    if _LIBC.mount(b"overlay", str(target).encode(), b"overlay", 0, opts) != 0:
        errno = ctypes.get_errno()
        raise SandboxError(
            f"mounting the sandbox overlay (lower {lower}) failed: {os.strerror(errno)}; "
            "the bwrap provider needs root (CAP_SYS_ADMIN) and overlayfs"
        )


_LAYER_TOOL_S = 60.0
"""mkfs.ext4 and mount take ~10 ms each; a minute means a stuck loop device, not a slow one."""


async def mount_capped_layer(directory: Path, disk_mb: int) -> Path:
    """Create ``directory/layer.img`` (sparse, ``disk_mb`` MiB), make it ext4 and mount it on
    ``directory/layer``; returns the mount point. No reserved blocks (the agent is not root), one inode per 8 KiB
    (CLI installs are many small files), no journal (a throw-away layer needs no crash recovery)."""
    image, mountpoint = directory / "layer.img", directory / "layer"
    with open(image, "wb") as fh:
        fh.truncate(disk_mb << 20)
    mountpoint.mkdir(mode=0o755)
    for argv in (["mkfs.ext4", "-q", "-F", "-m", "0", "-i", "8192", "-O", "^has_journal",
                  "-E", "lazy_itable_init=1,root_owner=0:0", str(image)],
                 ["mount", "-o", "loop,nodev,nosuid", str(image), str(mountpoint)]):
        try:
            # ProcessGroup: a rollout cancelled mid-create must not hang on, or leave behind, the spawn.
            res = await ProcessGroup().run(argv, timeout=_LAYER_TOOL_S, max_output=1 << 16)
        except FileNotFoundError:
            raise SandboxError(f"sandbox.disk_mb needs {argv[0]} (e2fsprogs / util-linux), which is not installed; "
                               "install it or unset sandbox.disk_mb") from None
        if res.returncode != 0:
            why = "timed out" if res.timed_out else f"exit {res.returncode}"
            raise SandboxError(f"sandbox disk cap ({disk_mb} MiB): {argv[0]} failed ({why}): "
                               f"{res.stderr.decode(errors='replace').strip()[-500:]}; the bwrap provider needs root "
                               "and loop devices for sandbox.disk_mb")
    os.chmod(mountpoint, 0o755)
    shutil.rmtree(mountpoint / "lost+found", ignore_errors=True)
    return mountpoint


def unmount(target: Path) -> None:
    """Lazily detach ``target``; not mounted is fine (idempotent cleanup)."""
    if _LIBC.umount2(str(target).encode(), MNT_DETACH) != 0:
        errno = ctypes.get_errno()
        if errno not in (22, 2):  # EINVAL: not a mount point; ENOENT: already gone
            raise SandboxError(f"unmounting {target} failed: {os.strerror(errno)}")


def _inside(root: str, rel: str) -> Path | None:
    """``root/rel`` if it resolves inside ``root`` (an image's symlink must not point at the host)."""
    path = Path(root, rel.lstrip("/"))
    real = os.path.realpath(path)
    base = os.path.realpath(root)
    if real != base and not real.startswith(base.rstrip("/") + "/"):
        return None
    return Path(real)


def _read_table(lower: str, rel: str) -> list[list[str]]:
    path = _inside(lower, rel)
    if path is None or not path.is_file():
        return []
    return [line.split(":") for line in path.read_text(errors="replace").splitlines() if line.count(":") >= 2]


def _free_id(taken: set[int]) -> int:
    candidate = 1000
    while candidate in taken:
        candidate += 1
    return candidate


def _mkdir_like(lower: str, upper: Path, rel: str, default_mode: int = 0o755) -> Path:
    """Create ``upper/rel`` with the lower directory's owner and mode, so the merge is invisible."""
    dest = upper / rel.strip("/")
    if dest.exists():
        return dest
    dest.mkdir(parents=True)
    src = _inside(lower, rel)
    if src is not None and src.is_dir():
        st = src.stat()
        os.chown(dest, st.st_uid, st.st_gid)
        os.chmod(dest, st.st_mode & 0o7777)
    else:
        os.chmod(dest, default_mode)
    return dest


def prepare_upper(lower: str, upper: Path, workdir: str) -> GuestUser:
    """Seed the writable layer before mounting: the guest user, its home, and the workdir.

    Writing ``upper/`` is safe only while the overlay is not mounted; this runs before the mount.
    """
    passwd = _read_table(lower, "etc/passwd")
    group = _read_table(lower, "etc/group")
    for row in passwd:
        if row[0] == AGENT_USER and len(row) >= 6 and row[2].isdigit() and row[3].isdigit():
            user = GuestUser(AGENT_USER, int(row[2]), int(row[3]), row[5] or "/home/agent")
            break
    else:
        uid = _free_id({int(r[2]) for r in passwd if r[2].isdigit()})
        gids = {int(r[2]) for r in group if r[2].isdigit()}
        gid = uid if uid not in gids else _free_id(gids)
        user = GuestUser(AGENT_USER, uid, gid, "/home/agent")
        shell = "/bin/bash" if _inside(lower, "bin/bash") and Path(lower, "bin/bash").exists() else "/bin/sh"
        etc = _mkdir_like(lower, upper, "etc")
        lines = [":".join(r) for r in passwd] + [f"agent:x:{uid}:{gid}::/home/agent:{shell}"]
        _write(etc / "passwd", "\n".join(lines) + "\n", 0o644)
        glines = [":".join(r) for r in group] + [f"agent:x:{gid}:"]
        _write(etc / "group", "\n".join(glines) + "\n", 0o644)
    home = upper / user.home.strip("/")
    if not (_inside(lower, user.home) or Path("/nonexistent")).is_dir():
        _mkdir_like(lower, upper, str(Path(user.home).parent))
        home.mkdir(exist_ok=True)
        os.chown(home, user.uid, user.gid)
        os.chmod(home, 0o755)
    if not (_inside(lower, "tmp") or Path("/nonexistent")).is_dir():
        _mkdir_like(lower, upper, "tmp", 0o1777)
    if workdir.strip("/"):
        src = _inside(lower, workdir)
        if src is None or not src.is_dir():
            _mkdir_like(lower, upper, workdir)
    return user


def _write(path: Path, text: str, mode: int) -> None:
    tmp = path.with_name(path.name + ".lego-tmp")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def write_meta(directory: Path, meta: SandboxMeta) -> None:
    _write(directory / "meta.json", json.dumps(asdict(meta), indent=1), 0o644)


def destroy_state(directory: Path, *, defer: bool = False) -> None:
    """Unmount and delete one sandbox's state dir (its processes must already be dead).

    With ``defer`` the dir is renamed to a hidden ``.trash-<id>`` (atomic: the sandbox is gone from
    listings at once) and deleted by a background thread: unlinking even a few files cost 10-30 ms
    on this shared disk, on the critical path of every rollout. ``gc_state`` sweeps trash a dying
    process left behind.
    """
    unmount(directory / "root")
    # After the overlay above it: a lazily detached loop mount frees its loop device once the last user is gone
    # (mount -o loop sets autoclear).
    unmount(directory / "layer")
    if defer and directory.exists():
        trash = directory.with_name(f".trash-{directory.name}")
        os.replace(directory, trash)
        # Not a daemon: interpreter exit waits for it, so a normal exit leaves no trash.
        threading.Thread(target=shutil.rmtree, args=(trash, True), daemon=False).start()
        return
    shutil.rmtree(directory, ignore_errors=True)
    if directory.exists():
        raise SandboxError(f"could not remove sandbox state {directory}")


@dataclass(frozen=True)
class StateEntry:
    """One state dir as ``lego sandbox ls`` shows it."""

    id: str
    path: Path
    owner_pid: int | None
    alive: bool
    age_s: float
    image: str


def list_state(state_root: str | os.PathLike[str] = DEFAULT_STATE_ROOT) -> list[StateEntry]:
    root = Path(state_root)
    if not root.is_dir():
        return []
    entries = []
    for d in sorted(root.iterdir()):
        if not d.is_dir() or d.name.startswith("."):
            continue
        try:
            meta: SandboxMeta | None = SandboxMeta.load(d / "meta.json")
        except (OSError, ValueError, TypeError, KeyError):
            meta = None  # a create that died before writing meta.json: a leak too
        pid = meta.owner_pid if meta else None
        alive = pid is not None and Path(f"/proc/{pid}").exists()
        created = meta.created if meta else d.stat().st_mtime
        entries.append(StateEntry(d.name, d, pid, alive, time.time() - created, meta.image if meta else "?"))
    return entries


def gc_state(state_root: str | os.PathLike[str] = DEFAULT_STATE_ROOT, *, include_alive: bool = False) -> list[str]:
    """Remove sandboxes whose owning process is gone (or all, with ``include_alive``); returns ids."""
    removed = []
    root = Path(state_root)
    for trash in root.glob(".trash-*") if root.is_dir() else []:
        shutil.rmtree(trash, ignore_errors=True)
    for entry in list_state(state_root):
        if entry.alive and not include_alive:
            continue
        destroy_state(entry.path)
        removed.append(entry.id)
    return removed
