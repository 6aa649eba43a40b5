"""`lego toolchain fetch`: download pinned artifacts into the toolchain folder, verified.

* A plain npm pin: read the registry's version document, download ``dist.tarball``, check it
  against the registry's ``dist.integrity`` (sha512) *and* the plugin's pin when it ships one.
* An npm pin ``with_dependencies``: ``npm install --ignore-scripts`` into a scratch folder (npm checks
  every tarball against its registry integrity) and pack the resulting ``node_modules`` tree.
* A PyPI pin ``with_dependencies``: ``pip install --target`` with the sandbox's Python version
  (pip checks each download against the index's sha256) and pack the site-packages tree.
* A runtime pin (``python``): the interpreter named by ``--python`` runs ``pyruntime_build.py``, which
  copies itself, its standard library, its loader and C libraries into a tree that is packed.

Files are written to a temporary name and renamed into place, and the lockfile is updated after
each artifact, so an interrupted fetch never leaves a file that looks complete. An artifact already
present with its recorded hash is skipped (idempotent).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote

import aiohttp

from lego_rl.errors import ConfigError, HarnessError
from lego_rl.harness.models import ToolchainPin
from lego_rl.harness.toolchain import (
    LockEntry,
    Lockfile,
    cached_integrity,
    now_iso,
    npm_file_name,
    sha512_integrity,
)

DEFAULT_REGISTRY = "https://registry.npmjs.org"


def npm_registry() -> str:
    return os.environ.get("npm_config_registry", DEFAULT_REGISTRY).rstrip("/")


async def _npm_version_doc(session: aiohttp.ClientSession, registry: str, name: str, version: str) -> dict:
    # Scoped names keep '@' but escape '/' (the registry's own convention).
    url = f"{registry}/{quote(name, safe='@')}/{quote(version, safe='')}"
    async with session.get(url) as resp:
        if resp.status == 404:
            raise ConfigError(f"npm registry has no {name}@{version}", where=url)
        if resp.status != 200:
            raise HarnessError(f"npm registry answered {resp.status} for {url}")
        return await resp.json(content_type=None)


async def _download(session: aiohttp.ClientSession, url: str, dest: Path) -> str:
    """Stream ``url`` to ``dest`` atomically; return the sha512 integrity of what was written."""
    digest = hashlib.sha512()
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as fh:
            async with session.get(url) as resp:
                if resp.status != 200:
                    raise HarnessError(f"download of {url} failed with HTTP {resp.status}")
                async for chunk in resp.content.iter_chunked(1 << 20):
                    digest.update(chunk)
                    fh.write(chunk)
        integrity = "sha512-" + base64.b64encode(digest.digest()).decode()
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; installs may run as another user
        os.replace(tmp, dest)
        return integrity
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _up_to_date(folder: Path, lock: Lockfile, pin: ToolchainPin) -> bool:
    entry = lock.entries.get(pin.key)
    if entry is None or not (folder / entry.file).is_file():
        return False
    if pin.integrity and entry.registry_integrity not in (None, pin.integrity):
        return False
    return cached_integrity(folder / entry.file) == entry.integrity


async def _fetch_npm(session: aiohttp.ClientSession, folder: Path, pin: ToolchainPin) -> LockEntry:
    registry = npm_registry()
    doc = await _npm_version_doc(session, registry, pin.name, pin.version)
    dist = doc.get("dist") or {}
    published = dist.get("integrity")
    if not published or not str(published).startswith("sha512-"):
        raise HarnessError(f"npm registry publishes no sha512 integrity for {pin.name}@{pin.version}")
    if pin.integrity and pin.integrity != published:
        raise HarnessError(
            f"{pin.name}@{pin.version}: registry integrity {published[:24]}... differs from the plugin's pin "
            f"{pin.integrity[:24]}...; refusing it"
        )
    (folder / "npm").mkdir(parents=True, exist_ok=True)
    rel = f"npm/{npm_file_name(pin.name, pin.version)}"
    got = await _download(session, dist["tarball"], folder / rel)
    if got != published:
        (folder / rel).unlink(missing_ok=True)
        raise HarnessError(
            f"{dist['tarball']}: downloaded sha512 does not match the registry's dist.integrity"
        )
    return LockEntry(
        kind="npm", name=pin.name, version=pin.version, file=rel, integrity=got,
        size=(folder / rel).stat().st_size, source=dist["tarball"], registry_integrity=published,
        fetched_at=now_iso(),
    )  # fmt: skip


async def _run(argv: list[str], cwd: Path, what: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        tail = out.decode(errors="replace")[-1500:]
        raise HarnessError(f"{what} failed (exit {proc.returncode}): {' '.join(argv[:4])} ...\n{tail}")


def _pack_tree(src: Path, dest: Path, arcname: str) -> None:
    """Pack ``src`` as ``arcname/`` into a gzip tarball, atomically, with stable owner and order."""

    def norm(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    os.close(fd)
    try:
        with tarfile.open(tmp, "w:gz", compresslevel=6) as tar:
            tar.add(src, arcname=arcname, filter=norm)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


async def _fetch_npm_tree(session: aiohttp.ClientSession, folder: Path, pin: ToolchainPin) -> LockEntry:
    npm = shutil.which("npm")
    if npm is None:
        raise HarnessError(
            f"{pin.key} needs its dependency tree, which takes `npm` on the host; none on PATH"
        )
    doc = await _npm_version_doc(session, npm_registry(), pin.name, pin.version)
    published = (doc.get("dist") or {}).get("integrity")
    if pin.integrity and pin.integrity != published:
        raise HarnessError(f"{pin.name}@{pin.version}: registry integrity differs from the plugin's pin")
    (folder / "npm").mkdir(parents=True, exist_ok=True)
    rel = f"npm/{npm_file_name(pin.name, pin.version, '-tree')}"
    with tempfile.TemporaryDirectory(dir=folder, prefix=".tree-") as scratch:
        work = Path(scratch)
        (work / "package.json").write_text('{"name":"lego-toolchain-tree","private":true}\n')
        await _run(
            [npm, "install", "--ignore-scripts", "--no-audit", "--no-fund", "--save-exact",
             "--registry", npm_registry(), f"{pin.name}@{pin.version}"],
            work, f"npm install {pin.name}@{pin.version}",
        )  # fmt: skip
        _pack_tree(work, folder / rel, "package")
    return LockEntry(
        kind="npm", name=pin.name, version=pin.version, file=rel, integrity=sha512_integrity(folder / rel),
        size=(folder / rel).stat().st_size, registry_integrity=published, fetched_at=now_iso(),
        source=f"npm install {pin.name}@{pin.version} (package.json, package-lock.json, node_modules)",
    )  # fmt: skip


def _find_python(version: str) -> str | None:
    """A host interpreter of exactly ``version`` that runs: PATH first, then pyenv's versions folder
    (a pyenv shim on PATH may exist but refuse to run a version that is not selected)."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates = [
        shutil.which(f"python{version}"),
        *sorted(map(str, root.glob(f"versions/{version}.*/bin/python{version}"))),
    ]
    probe = f"import sys; assert '%d.%d' % sys.version_info[:2] == {version!r}"
    for cand in filter(None, candidates):
        try:
            if subprocess.run([cand, "-c", probe], capture_output=True, timeout=30).returncode == 0:
                return cand
        except (OSError, subprocess.TimeoutExpired):
            continue
    return None


async def _fetch_pypi_tree(folder: Path, pin: ToolchainPin, python: str | None) -> LockEntry:
    target = pin.python_version or "3.12"
    interp = python or _find_python(target)
    if interp is None:
        raise HarnessError(
            f"{pin.key} is installed for Python {target}; building its site tree needs python{target} on the "
            "host, or --python naming one (in a lego-rl checkout, scripts/trixie_python.sh runs the trixie "
            "rootfs's python3.13)"
        )
    (folder / "pypi").mkdir(parents=True, exist_ok=True)
    rel = f"pypi/{pin.name}-{pin.version}-py{target}-site.tgz"
    with tempfile.TemporaryDirectory(dir=folder, prefix=".site-") as scratch:
        site = Path(scratch) / "site"
        await _run(
            [interp, "-m", "pip", "install", "--quiet", "--no-compile", "--disable-pip-version-check",
             "--target", str(site), f"{pin.name}=={pin.version}", *pin.companions],
            Path(scratch), f"pip install {pin.name}=={pin.version}",
        )  # fmt: skip
        _pack_tree(site, folder / rel, "site")
    return LockEntry(
        kind="pypi", name=pin.name, version=pin.version, file=rel, integrity=sha512_integrity(folder / rel),
        size=(folder / rel).stat().st_size, fetched_at=now_iso(), python_version=pin.python_version,
        source=f"pip install --target with {interp} (each wheel checked against PyPI's sha256)",
    )  # fmt: skip


async def _fetch_runtime(folder: Path, pin: ToolchainPin, python: str | None) -> LockEntry:
    if pin.name != "python":
        raise HarnessError(f"{pin.key}: the only runtime lego builds is 'python'")
    interp = python or _find_python(pin.version)
    if interp is None:
        raise HarnessError(
            f"{pin.key} is built by a Python {pin.version} interpreter: none on the host; pass --python "
            "(in a lego-rl checkout, scripts/trixie_python.sh runs the trixie rootfs's python3.13)"
        )
    (folder / "runtime").mkdir(parents=True, exist_ok=True)
    if os.sep in interp:
        interp = os.path.abspath(interp)  # the builder runs in a scratch folder
    rel = f"runtime/python-{pin.version}.tgz"
    builder = Path(__file__).with_name("pyruntime_build.py")
    with tempfile.TemporaryDirectory(dir=folder, prefix=".runtime-") as scratch:
        out = Path(scratch) / "python"
        await _run([interp, str(builder), str(out)], Path(scratch), f"building {pin.key}")
        made = (Path(scratch) / "python" / "RUNTIME").read_text().split()
        if made[0] != f"python{pin.version}":
            raise HarnessError(f"{pin.key}: --python {interp} is {made[0]}, not python{pin.version}")
        _pack_tree(Path(scratch) / "python", folder / rel, "python")
    return LockEntry(
        kind="runtime", name=pin.name, version=pin.version, file=rel,
        integrity=sha512_integrity(folder / rel), size=(folder / rel).stat().st_size, fetched_at=now_iso(),
        source=f"pyruntime_build.py run by {interp} (Python {made[1]}, {made[3]})",
    )  # fmt: skip


async def _fetch_one(
    session: aiohttp.ClientSession, folder: Path, pin: ToolchainPin, python: str | None
) -> LockEntry:
    if pin.kind == "npm":
        return await (_fetch_npm_tree if pin.with_dependencies else _fetch_npm)(session, folder, pin)
    if pin.kind == "runtime":
        return await _fetch_runtime(folder, pin, python)
    if pin.with_dependencies:
        return await _fetch_pypi_tree(folder, pin, python)
    raise HarnessError(f"{pin.key}: a PyPI pin must set with_dependencies (a site tree is installed)")


async def fetch_toolchain(
    pins: Iterable[ToolchainPin],
    folder: Path,
    *,
    force: bool = False,
    python: str | None = None,
    failures: list[tuple[ToolchainPin, Exception]] | None = None,
) -> list[tuple[LockEntry, bool]]:
    """Fetch every pin into ``folder``; return (entry, downloaded) pairs.

    Raises on the first failure, unless a ``failures`` list is given: then a failed pin is appended
    there and the others are still fetched (the CLI reports them all at the end).
    """
    # Absolute: helper processes (pip for site trees) run in scratch directories of their own.
    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    results: list[tuple[LockEntry, bool]] = []
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for pin in dict.fromkeys(pins):  # the same pin from two harnesses is fetched once
            lock = Lockfile.load(folder)
            if not force and _up_to_date(folder, lock, pin):
                results.append((lock.entries[pin.key], False))
                continue
            try:
                entry = await _fetch_one(session, folder, pin, python)
            except (HarnessError, ConfigError, aiohttp.ClientError, OSError) as exc:
                if failures is None:
                    raise
                failures.append((pin, exc))
                continue
            lock = Lockfile.load(folder)
            lock.entries[entry.key] = entry
            lock.save(folder)
            results.append((entry, True))
    return results
