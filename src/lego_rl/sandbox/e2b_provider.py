"""The ``e2b`` provider (optional extra ``lego-rl[e2b]``): the real ``e2b`` SDK behind our contract.

An ImageSpec's ``name`` is the E2B template (the reference maps task images to templates through an
image metadata key). E2B sandboxes are remote: ``network="host"`` cannot mean this host's loopback,
so it means "internet allowed" and the adapter must be reachable at a public URL; ``"none"`` turns
outbound access off. Memory is fixed by the template, so ``memory_mb`` is refused rather than
silently ignored. As with sunabako, the guest user ``agent`` is added at create when missing and a
command timeout runs under coreutils ``timeout`` so the whole command group is killed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from lego_rl.errors import SandboxError, SandboxTimeout
from lego_rl.sandbox.base import ExecResult, ImageSpec, Sandbox, SandboxProvider, cut_message

ENSURE_USER = 'id -u agent >/dev/null 2>&1 || useradd -m -U -s /bin/sh agent || exit 90; mkdir -p -- "$1"'
TIMEOUT_EXITS = (124, 137)
BACKSTOP_S = 15


def _sdk() -> Any:
    try:
        import e2b
    except ImportError as exc:
        raise SandboxError("the e2b provider needs the SDK: pip install 'lego-rl[e2b]'") from exc
    return e2b


class E2BSandbox(Sandbox):
    def __init__(self, inner: Any, image: ImageSpec, sdk: Any) -> None:
        self._inner = inner  # e2b.AsyncSandbox
        self._sdk = sdk
        self.id = inner.sandbox_id
        self.image = image
        self._closed = False

    def _abs(self, path: str) -> str:
        return path if path.startswith("/") else os.path.join(self.image.workdir or "/", path)

    def _live(self) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self.id} is closed")

    async def exec(self, cmd: str | list[str], *, user: str | None = None, check: bool = False,
                   timeout: float | None = None, env: dict[str, str] | None = None,
                   cwd: str | None = None) -> ExecResult:
        import shlex

        self._live()
        line = cmd if isinstance(cmd, str) else shlex.join(cmd)
        if timeout is not None:
            line = f"timeout -k 2 {timeout:g} /bin/sh -lc {shlex.quote(line)}"
        start = time.monotonic()
        try:
            raw = await self._inner.commands.run(
                line, envs=env or {}, user=user or "root", cwd=self._abs(cwd or self.image.workdir or "/"),
                timeout=0 if timeout is None else timeout + BACKSTOP_S,
            )
            code, out, err = raw.exit_code, raw.stdout, raw.stderr
        except self._sdk.CommandExitException as exc:
            code, out, err = exc.exit_code, exc.stdout or "", exc.stderr or ""
        except self._sdk.TimeoutException as exc:
            code, out, err = 124, "", str(exc)
        except self._sdk.SandboxException as exc:
            raise SandboxError(f"e2b exec of {cut_message(line, 200)} in {self.id}: {cut_message(str(exc))}") from exc
        elapsed = time.monotonic() - start
        timed_out = timeout is not None and code in TIMEOUT_EXITS and elapsed >= timeout
        result = ExecResult(code, out, err, elapsed, timed_out)
        if check and timed_out:
            raise SandboxTimeout(f"{cut_message(line, 300)} timed out after {timeout} s in sandbox {self.id}")
        if check and code != 0:
            raise SandboxError(f"{cut_message(line, 300)} exited {code} in sandbox {self.id}: {cut_message(err)}")
        return result

    async def write_file(self, path: str, content: str | bytes | Path, *, user: str | None = None) -> None:
        self._live()
        target = self._abs(path)
        try:
            if isinstance(content, Path):
                with content.open("rb") as fh:  # streamed in chunks by the SDK
                    await self._inner.files.write(target, fh, user=user or "root")
            else:
                await self._inner.files.write(target, content, user=user or "root")
        except self._sdk.SandboxException as exc:
            raise SandboxError(f"e2b write of {target} as {user or 'root'} in {self.id}: {cut_message(str(exc))}") from exc

    async def read_file(self, path: str, *, user: str | None = None) -> bytes:
        self._live()
        target = self._abs(path)
        try:
            return bytes(await self._inner.files.read(target, format="bytes", user=user or "root"))
        except self._sdk.SandboxException as exc:
            raise SandboxError(f"e2b read of {target} as {user or 'root'} in {self.id}: {cut_message(str(exc))}") from exc

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._inner.kill()
        except self._sdk.SandboxException as exc:
            raise SandboxError(f"e2b could not kill sandbox {self.id}: {cut_message(str(exc))}") from exc


class E2BProvider(SandboxProvider):
    """Remote sandboxes on E2B; ``api_key`` defaults to ``$E2B_API_KEY``."""

    name = "e2b"

    def __init__(self, *, api_key: str | None = None, lifetime_s: int = 3600) -> None:
        self._sdk = _sdk()
        self.api_key = api_key or os.environ.get("E2B_API_KEY")
        if not self.api_key:
            raise SandboxError("the e2b provider needs an API key: set E2B_API_KEY or pass api_key")
        self.lifetime_s = lifetime_s

    async def create(self, image: ImageSpec, *, network: str = "none", memory_mb: int | None = None,
                     **unknown: Any) -> E2BSandbox:
        if unknown:
            raise SandboxError(f"e2b provider: unknown option(s) {sorted(unknown)}; known: network")
        if memory_mb is not None:
            raise SandboxError("e2b provider: memory is fixed by the E2B template; do not pass memory_mb")
        if network not in ("none", "host"):
            raise SandboxError(f"e2b provider: network must be 'none' or 'host', got {network!r}")
        try:
            inner = await self._sdk.AsyncSandbox.create(
                template=image.name, timeout=self.lifetime_s, envs=dict(image.env),
                allow_internet_access=network == "host", api_key=self.api_key,
            )
        except (self._sdk.SandboxException, self._sdk.AuthenticationException) as exc:
            raise SandboxError(f"e2b could not create a sandbox of template {image.name!r}: "
                               f"{cut_message(str(exc))}") from exc
        sb = E2BSandbox(inner, image, self._sdk)
        try:
            await sb.exec(["/bin/sh", "-c", ENSURE_USER, "sh", image.workdir or "/"], cwd="/", check=True)
        except BaseException:
            await sb.close()
            raise
        return sb
