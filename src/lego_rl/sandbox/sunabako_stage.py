"""Reflink-ready copies of image root filesystems beside a local sunabako node's state.

A sunabako create copies the image rootfs into the node's state with ``cp -a --reflink=auto``, then
``chown -R``s the copy to the sandbox's uid range. On ext4 that copies every byte (212 MB for the test
image, seconds under load); on a filesystem with reflinks (XFS with ``reflink=1``, btrfs) the copy
shares extents and costs metadata only — but only when source and copy are on the *same*
filesystem, and task images usually live elsewhere (/var/cache/lego-rl).

So, when the node's state dir supports reflinks, each image is copied once per host to
``<state_dir>.images/<digest>-<name>`` (same filesystem, checked) and sunabako is given that copy. The
digest covers the image path and its stamp's (or root's) mtime, so a rebuilt image gets a new copy.
When the filesystem has no reflinks, nothing is staged and creates use the image as before.
docs/sandboxes.md shows how to put a node's state on an XFS loop filesystem.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import hashlib
import logging
import os
import subprocess
import tempfile
from pathlib import Path

from lego_rl.errors import SandboxError
from lego_rl.runstore.publish import publish_dir, staging

log = logging.getLogger(__name__)

FICLONE = 0x40049409  # ioctl(dest_fd, FICLONE, src_fd): share the source's extents (linux/fs.h)
STAMP = ".lego-rootfs-stamp"


def supports_reflink(folder: Path) -> bool:
    """Whether files in ``folder`` can be cloned (a real FICLONE on two scratch files)."""
    with tempfile.TemporaryDirectory(dir=folder, prefix=".reflink-probe-") as scratch:
        src, dst = Path(scratch, "a"), Path(scratch, "b")
        src.write_bytes(b"x" * 4096)
        with src.open("rb") as s, dst.open("wb") as d:
            try:
                fcntl.ioctl(d.fileno(), FICLONE, s.fileno())
            except OSError as exc:
                if exc.errno in (errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS):
                    return False
                raise
    return True


class RootfsStage:
    """Per-node staging folder; ``staged(rootfs)`` gives the path to hand to sunabako."""

    def __init__(self, state_dir: Path, *, required: bool) -> None:
        self.state_dir = state_dir
        self.folder = state_dir.with_name(state_dir.name + ".images")
        self.required = required
        self._usable: bool | None = None
        self._lock = asyncio.Lock()

    @classmethod
    def for_state_dir(cls, state_dir: str | os.PathLike[str], *, required: bool) -> RootfsStage:
        return cls(Path(state_dir).absolute(), required=required)

    def _check(self) -> bool:
        """Once: the state dir exists, supports reflinks, and the staging folder is on its filesystem."""
        if self._usable is None:
            reason = ""
            if not self.state_dir.is_dir():
                reason = f"state dir {self.state_dir} does not exist yet"
            elif not supports_reflink(self.state_dir):
                reason = f"the filesystem of {self.state_dir} has no reflinks (ext4?)"
            else:
                self.folder.mkdir(mode=0o755, exist_ok=True)
                if self.folder.stat().st_dev != self.state_dir.stat().st_dev:
                    reason = f"{self.folder} is not on the filesystem of {self.state_dir} (a mount point?)"
            if reason and self.required:
                raise SandboxError(f"sunabako stage_rootfs=true, but {reason}: put the node's state on XFS "
                                   "(reflink=1) or btrfs (docs/sandboxes.md), or leave stage_rootfs unset")
            if reason:
                log.info("sunabako: images are not staged for reflink clones: %s", reason)
            self._usable = not reason
        return self._usable

    def _target(self, rootfs: Path) -> Path:
        stamp = rootfs / STAMP
        mtime = (stamp if stamp.exists() else rootfs).stat().st_mtime_ns
        digest = hashlib.sha256(f"{rootfs}\0{mtime}".encode()).hexdigest()[:16]
        return self.folder / f"{digest}-{rootfs.name}"

    async def staged(self, rootfs: str) -> str:
        """``rootfs`` itself when staging is off; else its copy in the staging folder, made on first use."""
        if not await asyncio.to_thread(self._check):
            return rootfs
        source = Path(rootfs).resolve()
        if not source.is_dir():
            return rootfs  # nothing to stage: the create fails on it with the provider's own error, as unstaged
        target = self._target(source)
        if target.is_dir():
            return str(target)
        async with self._lock:  # one copy per image in this process; other processes race on the rename
            if not target.is_dir():
                await asyncio.to_thread(_copy_tree, source, target)
        return str(target)


def _copy_tree(source: Path, target: Path) -> None:
    with staging(target, prefix=f".{target.name}.") as tmp:
        res = subprocess.run(["cp", "-a", "--reflink=auto", "--", f"{source}/.", str(tmp)],
                             capture_output=True, text=True)  # fmt: skip
        if res.returncode != 0:
            raise SandboxError(f"staging image {source} into {target.parent} failed: {res.stderr.strip()[-400:]}")
        os.chmod(tmp, os.stat(source).st_mode & 0o7777)
        # Another process may have staged it first: its copy stands, this one is dropped.
        publish_dir(tmp, target, existing="keep", what="staged image")
