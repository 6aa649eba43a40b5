"""Build a relocatable Python runtime tree from the interpreter that runs this file.

Run by the *target* interpreter (``lego toolchain fetch`` does it with ``--python``, e.g. the trixie
rootfs's python3.13 through scripts/trixie_python.sh), so it uses the standard library only and
never imports lego_rl::

    python3.13 pyruntime_build.py OUT_DIR

The tree carries its own dynamic loader and C libraries, so it runs on an image with an older glibc
(Debian bookworm's 2.36 under trixie's 3.13, which needs 2.38+)::

    bin/python3.13            sh launcher: <root>/libexec/ld.so --library-path <root>/libexec/lib
                              --argv0 "$0" <root>/libexec/python3.13 "$@"
    bin/python3               -> python3.13
    libexec/python3.13        the interpreter ELF, byte for byte
    libexec/ld-linux-x86-64.so.2, libexec/lib/*.so*   the loader and every library the interpreter,
                              its extension modules, libstdc++ and libgcc_s load (read from
                              /proc/self/maps after importing each module of lib-dynload)
    lib/python3.13/           the standard library with its bytecode, without dist-/site-packages

Why a launcher rather than a patched ELF: the loader is named by absolute path in PT_INTERP, and the
tree is mounted at a path only known at install time; ``--argv0 "$0"`` makes ``sys.executable`` the
launcher, so a child started with ``sys.executable`` gets the same loader. Python finds its prefix
from the launcher's folder (``lib/python3.13/os.py`` one level up), so the image's own Python and
packages are never on ``sys.path``. Children that are image programs (bash, git) use the image's
loader as usual: nothing is set in the environment.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import shutil
import sys
import sysconfig

LAUNCHER = """#!/bin/sh
# lego-rl Python runtime launcher: this tree's loader and libraries, whatever the image's glibc.
root=$(cd "$(dirname "$0")/.." && pwd -P) || exit 127
exec "$root/libexec/{loader}" --library-path "$root/libexec/lib" --argv0 "$0" "$root/libexec/{exe}" "$@"
"""
EXTRA_LIBRARIES = ("libstdc++.so.6", "libgcc_s.so.1")
"""Loaded too: binary wheels (manylinux) may link them without bundling them."""
SKIP_STDLIB = {"site-packages", "dist-packages", "test", "idlelib", "turtledemo", "tkinter", "ensurepip"}


def loaded_libraries() -> list[str]:
    """Absolute paths of the shared objects mapped into this process."""
    found = set()
    with open("/proc/self/maps") as fh:
        for line in fh:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith("/") and ".so" in os.path.basename(parts[5]):
                found.add(parts[5].strip())
    return sorted(found)


def load_everything(dynload: str) -> list[str]:
    """Import each extension module of lib-dynload (and the extra libraries); return what failed."""
    failed = []
    for name in sorted(os.listdir(dynload)):
        module = name.split(".")[0]
        if not name.endswith(".so") or module.startswith("_test") or module in ("_tkinter", "xxlimited"):
            continue
        try:
            importlib.import_module(module)
        except Exception as exc:  # a module whose library the rootfs lacks is left out, and reported
            failed.append(f"{module}: {exc}")
    for lib in EXTRA_LIBRARIES:
        try:
            ctypes.CDLL(lib)
        except OSError as exc:
            failed.append(f"{lib}: {exc}")
    return failed


def copy_library(path: str, dest_dir: str) -> str:
    """Copy ``path`` into ``dest_dir`` under its own name plus every link name pointing at it (the
    SONAME the loader looks for, e.g. ``libffi.so.8`` for the mapped ``libffi.so.8.1.4``)."""
    real = os.path.realpath(path)
    name = os.path.basename(real)
    shutil.copy2(real, os.path.join(dest_dir, name))
    folder = os.path.dirname(real)
    for other in os.listdir(folder):
        full = os.path.join(folder, other)
        if other != name and os.path.islink(full) and os.path.realpath(full) == real:
            link = os.path.join(dest_dir, other)
            if not os.path.lexists(link):
                os.symlink(name, link)
    return name


def build(out: str) -> list[str]:
    """Write the tree into ``out`` (must not exist); return the modules left out, with reasons."""
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    stdlib = sysconfig.get_path("stdlib")
    dynload = os.path.join(stdlib, "lib-dynload")
    failed = load_everything(dynload) if os.path.isdir(dynload) else []
    libs = [p for p in loaded_libraries() if not p.startswith(stdlib + "/")]
    loaders = [p for p in libs if os.path.basename(p).startswith("ld-linux")]
    if len(loaders) != 1:
        raise SystemExit(f"expected one dynamic loader in this process, found {loaders}")
    os.makedirs(os.path.join(out, "libexec", "lib"))
    os.makedirs(os.path.join(out, "bin"))
    exe = os.path.realpath(sys.executable)
    shutil.copy2(exe, os.path.join(out, "libexec", version))
    for lib in libs:
        copy_library(lib, os.path.join(out, "libexec", "lib"))
    loader = os.path.basename(loaders[0])
    shutil.copy2(os.path.realpath(loaders[0]), os.path.join(out, "libexec", loader))
    shutil.copytree(
        stdlib, os.path.join(out, "lib", version), symlinks=True,
        ignore=lambda d, names: [n for n in names if d == stdlib and n in SKIP_STDLIB],
    )  # fmt: skip
    launcher = os.path.join(out, "bin", version)
    with open(launcher, "w") as fh:
        fh.write(LAUNCHER.format(loader=loader, exe=version))
    os.chmod(launcher, 0o755)
    os.symlink(version, os.path.join(out, "bin", "python3"))
    with open(os.path.join(out, "RUNTIME"), "w") as fh:
        left_out = "; ".join(failed) or "nothing"
        fh.write(f"{version} {sys.version.split()[0]} from {exe}\nleft out: {left_out}\n")
    return failed


if __name__ == "__main__":
    if len(sys.argv) != 2 or os.path.exists(sys.argv[1]):
        raise SystemExit("usage: python3.X pyruntime_build.py OUT_DIR   (OUT_DIR must not exist yet)")
    for line in build(sys.argv[1]):
        print(f"left out: {line}", file=sys.stderr)
