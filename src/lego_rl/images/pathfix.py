"""Let a non-root agent run toolchains that an image installed under ``/root`` (pyenv and alike).

Many task images put Python under ``/root/.pyenv`` and reach it through ``PATH``. The coding CLI runs
as the ``agent`` user, who cannot traverse ``/root`` (mode 0700), and pyenv's shims resolve versions
through ``$PYENV_ROOT`` (default ``~/.pyenv``, i.e. the agent's home). The fix, applied to a freshly
unpacked rootfs and its environment only (never to the official tests):

* every directory from ``/`` down to each ``/root/...`` PATH entry gets ``o+x`` (traverse, not list),
  and the entry itself ``o+rx``;
* pyenv: ``PYENV_ROOT`` is set, and the global version's ``bin`` is put before the shims, so
  ``python`` resolves without running pyenv's shell machinery as another user;
* ``/etc/profile.d/lego-image-path.sh`` exports the same PATH again: login shells (``sh -lc``, which
  providers use for string commands) reset PATH in ``/etc/profile`` for non-root users and would
  otherwise drop the image's toolchain before the agent ever sees it.
"""

from __future__ import annotations

import os
import shlex
import stat
from pathlib import Path

PROFILE_NAME = "lego-image-path.sh"


def _grant(path: Path, bits: int) -> None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        path.chmod(stat.S_IMODE(st.st_mode) | bits)


def _make_reachable(rootfs: Path, entry: str) -> None:
    parts = Path(entry.lstrip("/")).parts
    for i in range(1, len(parts)):
        _grant(rootfs.joinpath(*parts[:i]), stat.S_IXOTH)
    _grant(rootfs.joinpath(*parts), stat.S_IXOTH | stat.S_IROTH)


def _pyenv_bins(rootfs: Path, pyenv_root: str) -> list[str]:
    """``<pyenv_root>/versions/<v>/bin`` for the versions named in pyenv's global version file."""
    version_file = rootfs / pyenv_root.lstrip("/") / "version"
    try:
        versions = [v.strip() for v in version_file.read_text().split() if v.strip() and v.strip() != "system"]
    except OSError:
        versions = sorted(p.name for p in (rootfs / pyenv_root.lstrip("/") / "versions").glob("*") if p.is_dir())[-1:]
    return [f"{pyenv_root}/versions/{v}/bin" for v in versions]


def fix_root_toolchain_path(rootfs: Path, env: dict[str, str]) -> dict[str, str]:
    """Return the adjusted environment; changes permissions in ``rootfs`` as described above."""
    path = env.get("PATH", "")
    entries = [e for e in path.split(os.pathsep) if e]
    under_root = [e for e in entries if e == "/root" or e.startswith("/root/")]
    if not under_root:
        return dict(env)
    new_env = dict(env)
    pyenv_root = env.get("PYENV_ROOT")
    if pyenv_root is None and any(e.startswith("/root/.pyenv/") for e in under_root):
        pyenv_root = "/root/.pyenv"
    if pyenv_root:
        new_env["PYENV_ROOT"] = pyenv_root
        shims = f"{pyenv_root}/shims"
        extra = [b for b in _pyenv_bins(rootfs, pyenv_root) if b not in entries]
        at = entries.index(shims) if shims in entries else 0
        entries[at:at] = extra
        under_root += extra
        _make_reachable(rootfs, pyenv_root)
    for e in under_root:
        _make_reachable(rootfs, e)
    new_env["PATH"] = os.pathsep.join(entries)
    _write_profile(rootfs, new_env)
    return new_env


def _write_profile(rootfs: Path, env: dict[str, str]) -> None:
    profile_d = rootfs / "etc" / "profile.d"
    if profile_d.is_symlink() or not (rootfs / "etc").is_dir():
        return  # never follow an image's symlink out of the rootfs
    profile_d.mkdir(mode=0o755, exist_ok=True)
    target = profile_d / PROFILE_NAME
    target.unlink(missing_ok=True)  # a fresh inode: never edit an image file in place
    lines = ["# written by `lego images --fix-root-path`: keep the image's toolchain PATH in login shells"]
    lines += [f"export {k}={shlex.quote(env[k])}" for k in ("PATH", "PYENV_ROOT") if k in env]
    target.write_text("\n".join(lines) + "\n")
    target.chmod(0o644)
