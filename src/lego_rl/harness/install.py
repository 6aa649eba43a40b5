"""Offline install helpers shared by harness plugins: a pinned archive made available in a sandbox.

Two ways, one result (the archive's tree at ``dest``, world-readable, with a marker file holding the
archive's hash):

* **shared** (a sandbox with ``readonly_mounts``, i.e. bwrap): the archive is extracted once per host
  into ``$LEGO_TOOLCHAIN_TREES/<hash>-s<strip>/`` (default /var/cache/lego-rl/toolchain-trees) and
  mounted read-only at ``dest``. A rollout then pays one ``mkdir`` instead of uploading and untarring
  186 MB, and the agent (root included) cannot change the CLI it runs. Each tree records a digest of
  its files, checked once per process before first use, so a damaged or edited tree is refused.
* **copy** (every other provider: sunabako 0.1.2 takes mounts only at create, e2b runs elsewhere): the
  archive is uploaded, size-checked, extracted next to ``dest`` and moved into place, as root.

Installing the same archive twice (a reused snapshot) is a no-op; a different archive replaces the
old tree.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import lzma
import os
import posixpath
import secrets
import shlex
import shutil
import stat
import subprocess
import tempfile
import threading
from pathlib import Path

from lego_rl.errors import HarnessError
from lego_rl.harness.toolchain import cached_integrity
from lego_rl.runstore.publish import publish_dir, staging
from lego_rl.sandbox.base import ExecResult, Sandbox

INSTALL_ROOT = "/opt/lego"
MARKER = ".lego-installed"
TREE_DIGEST = ".lego-tree-sha256"
"""In a shared tree: the digest of every other entry (``tree_digest``), written when it was extracted."""
DEFAULT_TREES = "/var/cache/lego-rl/toolchain-trees"
_INSTALL_TIMEOUT_S = 600.0


def integrity_hex(integrity: str) -> str:
    """``sha512-<base64>`` -> lowercase hex, as ``sha512sum`` prints it."""
    algo, _, b64 = integrity.partition("-")
    if algo != "sha512" or not b64:
        raise HarnessError(f"unsupported integrity string {integrity[:30]!r}: expected sha512-<base64>")
    return base64.b64decode(b64).hex()


async def sh(
    sb: Sandbox, script: str, *, what: str, user: str | None = "root", timeout: float = 120.0
) -> ExecResult:
    """Run a shell script in the sandbox; raise ``HarnessError`` naming ``what`` on failure."""
    res = await sb.exec(["sh", "-c", script], user=user, timeout=timeout)
    if res.timed_out:
        raise HarnessError(f"{what}: timed out after {timeout:.0f} s inside sandbox {sb.id}")
    if res.exit_code != 0:
        detail = (res.stderr or res.stdout).strip()[-800:]
        raise HarnessError(f"{what}: exit {res.exit_code} inside sandbox {sb.id}: {detail}")
    return res


def _tar_flags(name: str) -> str:
    if name.endswith((".tgz", ".tar.gz")):
        return "-xzf"
    if name.endswith(".tar.xz"):
        return "-xJf"
    if name.endswith(".tar"):
        return "-xf"
    raise HarnessError(f"cannot install {name}: expected a .tgz, .tar.gz, .tar.xz or .tar archive")


def _plain_tar(archive: Path, integrity: str) -> Path:
    """A decompressed copy of ``archive`` in a host cache, made once (atomically) per archive hash.

    Decompressing a 186 MB archive costs seconds of CPU; doing it once on the host instead of in every
    sandbox makes an install an upload plus a plain ``tar -x``. Falls back to the archive itself when
    the cache folder is not writable. The cache is keyed by the archive's verified hash.
    """
    if archive.name.endswith(".tar"):
        return archive
    cache = Path(os.environ.get("LEGO_TOOLCHAIN_CACHE", archive.parent / ".tar-cache"))
    target = cache / f"{integrity_hex(integrity)[:40]}.tar"
    if target.is_file():
        return target
    try:
        cache.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache, prefix=f".{target.name}.", suffix=".part")
    except OSError:
        return archive
    opener = lzma.open if archive.name.endswith(".tar.xz") else gzip.open
    try:
        with os.fdopen(fd, "wb") as out, opener(archive, "rb") as src:
            shutil.copyfileobj(src, out, 1 << 20)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def trees_dir() -> Path:
    """``$LEGO_TOOLCHAIN_TREES`` or /var/cache/lego-rl/toolchain-trees: where shared trees are extracted."""
    return Path(os.environ.get("LEGO_TOOLCHAIN_TREES") or DEFAULT_TREES)


def tree_digest(root: Path) -> str:
    """sha256 over every entry below ``root`` (path, type, mode bits, content or link target), sorted.

    The digest file itself is left out. Owners are not hashed: extraction makes everything root's.
    """
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, root)
        for name in sorted(dirnames + filenames):
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if rel == TREE_DIGEST:
                continue
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            digest.update(f"{rel}\0{stat.S_IFMT(st.st_mode)}\0{stat.S_IMODE(st.st_mode):o}\0".encode())
            if stat.S_ISLNK(st.st_mode):
                digest.update(os.readlink(path).encode())
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as fh:
                    while chunk := fh.read(1 << 20):
                        digest.update(chunk)
            digest.update(b"\n")
    return digest.hexdigest()


# Trees whose digest this process has checked, keyed by path and the digest file's mtime.
_verified_trees: dict[tuple[str, int], bool] = {}
_tree_lock = threading.Lock()


def shared_tree(archive: Path, integrity: str, strip_components: int) -> Path:
    """The host tree of ``archive`` (already hash-checked), extracted once per host; checked once per process.

    Extraction goes to a hidden temporary folder and is renamed into place, so concurrent processes
    never see a half tree (the loser of a race drops its copy). Everything is root's, world-readable,
    and writable by nobody else.
    """
    root = trees_dir()
    tree = root / f"{integrity_hex(integrity)[:40]}-s{strip_components}"
    with _tree_lock:  # one extraction per process at a time; other processes are handled by the rename
        if not tree.is_dir():
            _extract_tree(archive, integrity, root, tree, strip_components)
        stamp = tree / TREE_DIGEST
        try:
            key = (str(tree), stamp.stat().st_mtime_ns)
            recorded = stamp.read_text().strip()
        except OSError:
            raise HarnessError(
                f"shared toolchain tree {tree} has no {TREE_DIGEST}: delete the folder to have it extracted again"
            ) from None
        if key not in _verified_trees:
            actual = tree_digest(tree)
            if actual != recorded:
                raise HarnessError(
                    f"shared toolchain tree {tree} was changed after extraction (digest {actual[:16]}..., "
                    f"recorded {recorded[:16]}...): delete it to extract again"
                )
            _verified_trees[key] = True
    return tree


def _extract_tree(archive: Path, integrity: str, root: Path, tree: Path, strip_components: int) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HarnessError(f"cannot create the shared toolchain folder {root} ({exc.strerror}); "
                           "set LEGO_TOOLCHAIN_TREES to a writable, world-traversable folder") from None
    os.chmod(root, 0o755)
    with staging(tree, prefix=f".{tree.name}.") as tmp:
        res = subprocess.run(
            ["tar", _tar_flags(archive.name), str(archive), "-C", str(tmp),
             f"--strip-components={strip_components}", "--no-same-owner", "--no-same-permissions"],
            capture_output=True, text=True, timeout=_INSTALL_TIMEOUT_S,
        )  # fmt: skip
        if res.returncode != 0:
            raise HarnessError(f"extracting {archive.name} into {root} failed: {res.stderr.strip()[-600:]}")
        # Readable and traversable by all, writable by root alone (tar kept the archive's x bits).
        subprocess.run(["chmod", "-R", "u+rwX,go+rX,go-w", str(tmp)], check=True, capture_output=True)
        (tmp / MARKER).write_text(integrity_hex(integrity) + "\n")
        (tmp / TREE_DIGEST).write_text(tree_digest(tmp) + "\n")
        os.chmod(tmp, 0o755)
        # Another process may have extracted it first: its tree stands, this copy is dropped.
        publish_dir(tmp, tree, existing="keep", what="toolchain tree")


async def install_archive(
    sb: Sandbox,
    archive: Path,
    dest: str,
    *,
    integrity: str,
    strip_components: int = 1,
    timeout: float = _INSTALL_TIMEOUT_S,
    share: bool = True,
) -> bool:
    """Make ``archive`` (a host file already checked by ``Toolchain.resolve``) available at ``dest``.

    The archive's sha512 must equal ``integrity`` (the pin) on the host. With ``share`` and a sandbox
    that has ``readonly_mounts``, the host tree (``shared_tree``) is mounted read-only at ``dest``;
    otherwise the archive is copied in (module docstring). Returns False when ``dest`` already holds
    this exact archive.
    """
    if not posixpath.isabs(dest) or ".." in dest.split("/"):
        raise HarnessError(f"install destination must be an absolute path without '..', got {dest!r}")
    _tar_flags(archive.name)  # refuse an unknown format before any work
    actual = await asyncio.to_thread(cached_integrity, archive)  # memoised: hashed once per file version
    if actual != integrity:
        raise HarnessError(
            f"refusing {archive}: its sha512 {actual[:24]}... does not match {integrity[:24]}..."
        )
    if share and sb.readonly_mounts:
        tree = await asyncio.to_thread(shared_tree, archive, integrity, strip_components)
        if sb.mounts().get(posixpath.normpath(dest)) == str(tree.resolve()):
            return False
        await sb.mount_readonly(tree, dest)
        return True
    return await _copy_archive(sb, archive, dest, integrity, strip_components, timeout)


async def _copy_archive(
    sb: Sandbox, archive: Path, dest: str, integrity: str, strip_components: int, timeout: float
) -> bool:
    """The copy path: upload, size check, extract next to ``dest``, move into place, mark."""
    want = integrity_hex(integrity)
    q = shlex.quote(dest)
    probe = await sb.exec(["sh", "-c", f"cat {q}/{MARKER} 2>/dev/null"], user="root", timeout=30)
    if probe.exit_code == 0 and probe.stdout.strip() == want:
        return False
    payload = await asyncio.to_thread(_plain_tar, archive, integrity)
    size = payload.stat().st_size
    upload = f"/tmp/lego-upload-{secrets.token_hex(6)}-{payload.name}"
    await sb.write_file(upload, payload, user="root")
    u = shlex.quote(upload)
    script = f"""
set -e
got=$(stat -c %s {u})
if [ "$got" != "{size}" ]; then echo "upload of {archive.name} is $got bytes, expected {size}" >&2; rm -f {u}; exit 3; fi
rm -rf {q}.new && mkdir -p {q}.new
tar {_tar_flags(payload.name)} {u} -C {q}.new --strip-components={strip_components} --no-same-owner
rm -f {u}
chmod -R a+rX {q}.new
rm -rf {q} && mv {q}.new {q}
echo {want} > {q}/{MARKER}
"""
    await sh(sb, script, what=f"installing {archive.name} at {dest}", timeout=timeout)
    return True


async def link_executable(sb: Sandbox, target: str, link: str) -> None:
    """Make ``link`` (e.g. ``/usr/local/bin/claude``) point to ``target`` after checking it is executable."""
    t, lk = shlex.quote(target), shlex.quote(link)
    await sh(
        sb,
        f"test -x {t} || {{ echo 'not an executable file: {target}' >&2; exit 3; }}; "
        f"mkdir -p $(dirname {lk}) && ln -sfn {t} {lk}",
        what=f"linking {link}",
    )


async def version_of(
    sb: Sandbox, argv: list[str], *, user: str, expect: str, env: dict[str, str] | None = None
) -> str:
    """Run ``argv`` (a ``--version`` call) as ``user``; return its first line, which must contain ``expect``."""
    res = await sb.exec(
        ["sh", "-c", 'exec "$@" </dev/null', "sh", *argv], user=user, timeout=120, env=env or {}, cwd="/tmp"
    )
    text = (res.stdout or res.stderr).strip()
    if res.timed_out or res.exit_code != 0:
        detail = (res.stderr or res.stdout).strip()[-600:]
        raise HarnessError(
            f"`{' '.join(argv)}` as {user} failed (exit {res.exit_code}) in sandbox {sb.id}: {detail}"
        )
    line = text.splitlines()[0] if text else ""
    if expect not in text:
        raise HarnessError(f"`{' '.join(argv)}` reported {line!r}, expected version {expect}")
    return line


async def python_version(sb: Sandbox, python: str) -> tuple[int, int]:
    """The (major, minor) version of ``python`` inside the sandbox; ``HarnessError`` if absent."""
    # Through sh, so a missing interpreter is exit 127 on every provider rather than a provider error.
    code = "import sys; print('%d.%d' % sys.version_info[:2])"
    res = await sb.exec(["sh", "-c", 'exec "$0" -c "$1"', python, code], user="root", timeout=60)
    if res.exit_code != 0:
        raise HarnessError(
            f"no usable {python!r} in sandbox {sb.id} (exit {res.exit_code}): {res.stderr.strip()[-300:]}"
        )
    major, minor = res.stdout.strip().split(".")
    return int(major), int(minor)
