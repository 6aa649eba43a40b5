"""Offline install helpers shared by harness plugins: upload an archive, check, extract, verify.

Everything goes through the ``Sandbox`` contract (``exec`` / ``write_file``), so it works the same on
bwrap, sunabako and e2b. Installs run as root into ``/opt/lego/...`` and are made world-readable so
the agent user can run them. A marker file records the installed archive's hash: installing the same
archive twice (a reused snapshot) is a no-op, and a different archive replaces the old tree.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import lzma
import os
import posixpath
import secrets
import shlex
import shutil
import tempfile
from pathlib import Path

from lego_rl.errors import HarnessError
from lego_rl.harness.toolchain import cached_integrity
from lego_rl.sandbox.base import ExecResult, Sandbox

INSTALL_ROOT = "/opt/lego"
MARKER = ".lego-installed"
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


async def install_archive(
    sb: Sandbox,
    archive: Path,
    dest: str,
    *,
    integrity: str,
    strip_components: int = 1,
    timeout: float = _INSTALL_TIMEOUT_S,
) -> bool:
    """Install ``archive`` (a host file already checked by ``Toolchain.resolve``) at ``dest``.

    The archive's sha512 must equal ``integrity`` (the pin) on the host; inside the sandbox the upload's size is
    checked (a truncated copy is caught before extraction), the tree is extracted next to ``dest`` and
    moved into place, made world-readable, and marked with the archive's hash. Returns False when
    ``dest`` already holds this exact archive.
    """
    if not posixpath.isabs(dest) or ".." in dest.split("/"):
        raise HarnessError(f"install destination must be an absolute path without '..', got {dest!r}")
    _tar_flags(archive.name)  # refuse an unknown format before any work
    want = integrity_hex(integrity)
    actual = await asyncio.to_thread(cached_integrity, archive)  # memoised: hashed once per file version
    if actual != integrity:
        raise HarnessError(
            f"refusing {archive}: its sha512 {actual[:24]}... does not match {integrity[:24]}..."
        )
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
