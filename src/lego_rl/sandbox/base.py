"""The sandbox contract every provider implements.

A sandbox is a fresh, isolated copy of a task image. Everything is async::

    async with create_sandbox(image, provider="bwrap") as sb:
        res = await sb.exec("git status", user="agent", timeout=30)
        await sb.write_file("/testbed/PROBLEM.md", "...", user="agent")
        data = await sb.read_file("/testbed/setup.py")

Providers register by name through the entry point group ``lego_rl.sandbox_providers`` so a third
party can add one with ``pip install``.
"""

from __future__ import annotations

import abc
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from lego_rl.errors import SandboxError


@dataclass(frozen=True)
class ExecResult:
    """Outcome of one command inside a sandbox."""

    exit_code: int
    stdout: str
    stderr: str
    duration_s: float = 0.0
    timed_out: bool = False
    truncated: bool = False
    """The provider cut the captured output (sunabako caps what one exec returns)."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True)
class ImageSpec:
    """What a provider needs to boot a task image: a root filesystem, working dir and environment."""

    name: str
    rootfs: str | None = None
    workdir: str = "/"
    env: dict[str, str] = field(default_factory=dict)


MAX_ERROR_CHARS = 2000


def check_mount_target(target: str, sandbox_id: str) -> str:
    """``target`` normalised; ``SandboxError`` unless it is an absolute path below ``/`` without ``..``."""
    if not posixpath.isabs(target) or ".." in target.split("/") or posixpath.normpath(target) == "/":
        raise SandboxError(f"mount target {target!r} in sandbox {sandbox_id} must be an absolute path "
                           "below / without '..'")
    return posixpath.normpath(target)


def cut_message(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """Keep an error message readable: the head and tail of an oversized text, the middle elided."""
    text = text.strip()
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]} ...[{len(text) - limit} chars cut]... {text[-half:]}"


class Sandbox(abc.ABC):
    """One running sandbox. Use through ``create_sandbox``; ``close()`` must leave nothing running."""

    id: str
    image: ImageSpec
    readonly_mounts: ClassVar[bool] = False
    """Whether ``mount_readonly`` works here. Without it, a caller that wants a host folder inside the
    sandbox copies it in (``harness.install`` does: the documented fallback for sunabako 0.1.2, whose
    mounts are fixed at create, and e2b, whose sandboxes run on another machine)."""

    @abc.abstractmethod
    async def exec(
        self,
        cmd: str | list[str],
        *,
        user: str | None = None,
        check: bool = False,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        """Run ``cmd`` (a shell string, or an argv list) and wait for it.

        ``check=True`` raises ``SandboxError`` on a non-zero exit; a timeout returns
        ``timed_out=True`` (or raises ``SandboxTimeout`` when ``check``).
        """

    @abc.abstractmethod
    async def write_file(self, path: str, content: str | bytes | Path, *, user: str | None = None) -> None:
        """Write ``content`` (text, bytes, or a host ``Path`` to copy) to ``path`` inside the sandbox."""

    @abc.abstractmethod
    async def read_file(self, path: str, *, user: str | None = None) -> bytes:
        """Read ``path`` inside the sandbox."""

    async def mount_readonly(self, source: Path, target: str) -> None:
        """Show the host folder ``source`` at ``target`` for every later exec, read-only for every user
        (root included), replacing an earlier mount at ``target``. Providers that cannot set
        ``readonly_mounts = False`` and keep this refusal."""
        raise SandboxError(f"{type(self).__name__} {self.id} cannot mount host folders (readonly_mounts is "
                           "False): copy the files in with write_file instead")

    def mounts(self) -> dict[str, str]:
        """The read-only mounts made by ``mount_readonly``, guest path -> host folder."""
        return {}

    @abc.abstractmethod
    async def close(self) -> None:
        """Destroy the sandbox. Idempotent; never leaks a process, also after a timeout or OOM."""

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class SandboxProvider(abc.ABC):
    """Creates sandboxes of one kind. Instantiated once per process from the resolved config."""

    name: str

    @abc.abstractmethod
    async def create(self, image: ImageSpec, **options: Any) -> Sandbox:
        """Boot a fresh sandbox of ``image``."""

    async def aclose(self) -> None:
        """Release provider-wide resources."""
