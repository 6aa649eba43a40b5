"""A sandbox wrapper that keeps a record of every command, saved with the rollout's artifacts.

Operators debugging a rollout want to see what ran in the sandbox, as whom, for how long and with what
result, in order. Wrapping the provider's sandbox keeps that out of every provider.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from lego_rl.sandbox.base import ExecResult, ImageSpec, Sandbox

_KEEP = 4000


def _tail(text: str) -> str:
    return text if len(text) <= _KEEP else f"[... {len(text) - _KEEP} chars cut ...]" + text[-_KEEP:]


class RecordingSandbox(Sandbox):
    """Delegates to ``inner`` and appends one entry per call to ``self.log``."""

    def __init__(self, inner: Sandbox, label: str) -> None:
        self.inner = inner
        self.label = label
        self.log: list[dict[str, Any]] = []

    @property
    def id(self) -> str:  # type: ignore[override]
        return self.inner.id

    @property
    def image(self) -> ImageSpec:  # type: ignore[override]
        return self.inner.image

    def _entry(self, op: str, start: float, **fields: Any) -> None:
        self.log.append({"sandbox": self.label, "op": op, "t": round(start, 3),
                         "duration_s": round(time.time() - start, 3), **fields})

    async def exec(self, cmd: str | list[str], *, user: str | None = None, check: bool = False,
                   timeout: float | None = None, env: dict[str, str] | None = None,
                   cwd: str | None = None) -> ExecResult:
        start = time.time()
        try:
            res = await self.inner.exec(cmd, user=user, check=check, timeout=timeout, env=env, cwd=cwd)
        except Exception as exc:
            self._entry("exec", start, cmd=cmd, user=user, cwd=cwd, error=f"{type(exc).__name__}: {exc}")
            raise
        self._entry("exec", start, cmd=cmd, user=user, cwd=cwd, exit_code=res.exit_code,
                    timed_out=res.timed_out, stdout=_tail(res.stdout), stderr=_tail(res.stderr))
        return res

    async def write_file(self, path: str, content: str | bytes | Path, *, user: str | None = None) -> None:
        start = time.time()
        size = len(content) if isinstance(content, str | bytes) else f"host:{content}"
        await self.inner.write_file(path, content, user=user)
        self._entry("write_file", start, path=path, user=user, size=size)

    async def read_file(self, path: str, *, user: str | None = None) -> bytes:
        start = time.time()
        data = await self.inner.read_file(path, user=user)
        self._entry("read_file", start, path=path, user=user, size=len(data))
        return data

    @property
    def readonly_mounts(self) -> bool:  # type: ignore[override]
        return self.inner.readonly_mounts

    async def mount_readonly(self, source: Path, target: str) -> None:
        start = time.time()
        await self.inner.mount_readonly(source, target)
        self._entry("mount_readonly", start, source=str(source), target=target)

    def mounts(self) -> dict[str, str]:
        return self.inner.mounts()

    async def close(self) -> None:
        await self.inner.close()

    def jsonl(self) -> str:
        return "".join(json.dumps(e, default=str) + "\n" for e in self.log)
