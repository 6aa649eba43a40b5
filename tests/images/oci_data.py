"""Build small OCI images here, from a directory tree, with umoci (no registry, no daemon)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def build_oci(layout: Path, tag: str, files: dict[str, str | bytes], *, env: list[str], workingdir: str = "/",
              modes: dict[str, int] | None = None) -> Path:
    """An OCI image layout at ``layout`` (created if missing) holding ``tag`` with ``files`` as its one layer."""
    if not (layout / "oci-layout").exists():
        _run("umoci", "init", "--layout", str(layout))
    _run("umoci", "new", "--image", f"{layout}:{tag}")
    bundle = layout.parent / f".bundle-{tag}"
    _run("umoci", "unpack", "--image", f"{layout}:{tag}", str(bundle))
    rootfs = bundle / "rootfs"
    for rel, content in files.items():
        p = rootfs / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)
    for rel, mode in (modes or {}).items():
        (rootfs / rel).chmod(mode)
    _run("umoci", "repack", "--image", f"{layout}:{tag}", str(bundle))
    shutil.rmtree(bundle)
    argv = ["umoci", "config", "--image", f"{layout}:{tag}", "--config.workingdir", workingdir]
    for e in env:
        argv += ["--config.env", e]
    _run(*argv)
    return layout


def to_docker_archive(layout: Path, tag: str, tar: Path, ref: str) -> Path:
    _run("skopeo", "copy", "--quiet", f"oci:{layout}:{tag}", f"docker-archive:{tar}:{ref}")
    return tar
