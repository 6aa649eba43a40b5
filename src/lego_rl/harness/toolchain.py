"""The host-side toolchain folder: pinned CLI artifacts, their lockfile, and integrity checks.

Harness installs are offline: every byte a sandbox installs comes from this folder (or a path an
operator names through ``LEGO_AGENT_*_TARBALL``), and is checked against a pinned hash first.

Layout of ``$LEGO_TOOLCHAIN_DIR`` (default ``./.lego/toolchain``)::

    toolchain.lock.json        one entry per pin: file, sha512 integrity, size, source URL
    npm/<name>-<version>.tgz   registry tarballs, byte for byte
    npm/<name>-<version>-tree.tgz   a package plus its dependency tree (``node_modules``)
    pypi/<name>-<version>-py<X.Y>-site.tgz   a site-packages tree for the sandbox's Python
    runtime/python-<X.Y>.tgz   a relocatable Python with its own loader and libraries (any image)

``lego toolchain fetch`` (``lego_rl.harness.fetch``) fills it; ``Toolchain.resolve`` reads it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lego_rl.errors import ConfigError, HarnessError
from lego_rl.harness.models import ToolchainPin, lock_key

LOCKFILE = "toolchain.lock.json"
_CHUNK = 1 << 20


def default_toolchain_dir() -> Path:
    """``$LEGO_TOOLCHAIN_DIR`` if set, else ``.lego/toolchain`` under the current directory."""
    env = os.environ.get("LEGO_TOOLCHAIN_DIR")
    return Path(env).expanduser() if env else Path.cwd() / ".lego" / "toolchain"


def sha512_integrity(path: Path) -> str:
    """Subresource-integrity string (``sha512-<base64>``), the form npm publishes as ``dist.integrity``."""
    digest = hashlib.sha512()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return "sha512-" + base64.b64encode(digest.digest()).decode()


# Hashing a 180 MB archive costs ~0.5 s; a rollout may resolve the same file hundreds of times.
_hash_cache: dict[tuple[str, int, int], str] = {}


def cached_integrity(path: Path) -> str:
    """``sha512_integrity`` memoised on (path, size, mtime), so a rewritten file is re-hashed."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _hash_cache:
        _hash_cache[key] = sha512_integrity(path)
    return _hash_cache[key]


class LockEntry(BaseModel):
    """One fetched artifact."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["npm", "pypi", "runtime"]
    name: str
    version: str
    file: str
    """Path relative to the toolchain folder."""
    integrity: str = Field(pattern=r"^sha512-[A-Za-z0-9+/=]+$")
    """Hash of ``file`` itself."""
    size: int = Field(ge=0)
    source: str
    """Where it came from (tarball URL, or how a tree was assembled)."""
    registry_integrity: str | None = None
    """The registry's published hash for the package tarball (for trees: of the top package)."""
    fetched_at: str
    python_version: str | None = None
    """pypi: the Python minor version the site tree was built for (part of the key)."""

    @property
    def key(self) -> str:
        return lock_key(self.kind, self.name, self.version, self.python_version)


class Lockfile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = 1
    entries: dict[str, LockEntry] = Field(default_factory=dict)

    @classmethod
    def load(cls, folder: Path) -> Lockfile:
        path = folder / LOCKFILE
        if not path.exists():
            return cls()
        try:
            return cls.model_validate_json(path.read_bytes())
        except ValidationError as exc:
            raise ConfigError(
                f"corrupt toolchain lockfile: {exc.errors()[0]['msg']}", where=str(path)
            ) from exc

    def save(self, folder: Path) -> None:
        """Atomic write: a crash never leaves a half-written lockfile."""
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".lock-", suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            fh.write(self.model_dump_json(indent=2) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, folder / LOCKFILE)


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def npm_file_name(name: str, version: str, suffix: str = "") -> str:
    """``@openai/codex`` 0.1 -> ``openai-codex-0.1.tgz`` (npm pack's own naming)."""
    return f"{name.lstrip('@').replace('/', '-')}-{version}{suffix}.tgz"


class Toolchain:
    """Resolves pins to verified host files. Passed to ``lego_harness_install``.

    Resolution order for a pin: an explicit override path (an operator's ``LEGO_AGENT_*_TARBALL``),
    then the lockfile entry. The expected hash is the pin's own ``integrity`` when the plugin ships
    one, else the lockfile's. A file whose hash differs is refused, never installed.
    """

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = (folder or default_toolchain_dir()).resolve()

    def lockfile(self) -> Lockfile:
        return Lockfile.load(self.folder)

    def resolve(self, pin: ToolchainPin, override: Path | None = None) -> Path:
        """Return the host file for ``pin`` after checking its hash; raise ``HarnessError`` otherwise."""
        entry = self.lockfile().entries.get(pin.key)
        if entry is not None and pin.integrity and entry.registry_integrity not in (None, pin.integrity):
            raise HarnessError(
                f"toolchain lockfile records {entry.registry_integrity[:24]}... for {pin.key}, "
                f"but the plugin pins {pin.integrity[:24]}...; re-run `lego toolchain fetch --force`"
            )
        if override is not None:
            path = Path(override).expanduser()
            if not path.is_file():
                raise HarnessError(f"{pin.role} tarball {path} (for {pin.key}) does not exist")
        elif entry is None:
            raise HarnessError(
                f"{pin.key} (role {pin.role}) is not in the toolchain at {self.folder}; "
                "run `lego toolchain fetch` (or set the matching LEGO_AGENT_*_TARBALL)"
            )
        else:
            path = self.folder / entry.file
            if not path.is_file():
                raise HarnessError(
                    f"toolchain lockfile names {path}, which is missing; re-run `lego toolchain fetch`"
                )
        # A dependency tree is assembled here, so its file hash can only come from the lockfile;
        # a plain registry tarball must match the plugin's pin when it ships one.
        if pin.with_dependencies or not pin.integrity:
            if entry is None:
                raise HarnessError(
                    f"no pinned hash for {pin.key} (role {pin.role}) in {self.folder / LOCKFILE}; "
                    "run `lego toolchain fetch` first"
                )
            expected = entry.integrity
        else:
            expected = pin.integrity
        actual = cached_integrity(path)
        if actual != expected:
            raise HarnessError(
                f"refusing {path}: its sha512 {actual[:24]}... does not match the pin {expected[:24]}... "
                f"for {pin.key} (role {pin.role})"
            )
        return path

    def describe(self) -> list[dict[str, object]]:
        """Lockfile entries as plain dicts, for ``lego toolchain list``-style output."""
        return [json.loads(e.model_dump_json()) for e in self.lockfile().entries.values()]
