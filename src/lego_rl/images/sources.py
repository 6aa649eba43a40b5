"""Finding an image on disk and turning it into a rootfs bundle with skopeo and umoci.

No registry is reachable from sandbox nodes, so every image comes from a file: an OCI image layout
directory, an ``oci-archive`` tar, or a ``docker save`` tar (docker-archive). ``find_source`` looks
in the given directories for a name derived from the image reference (see ``candidate_names``);
an explicit ``{image: path}`` map wins over the search.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

SourceKind = Literal["oci", "oci-archive", "docker-archive"]
_TAR_SUFFIXES = (".tar", ".oci.tar", ".docker.tar")


class ImportFailure(Exception):
    """One image could not be imported; the message says which step failed and why."""


@dataclass(frozen=True)
class ImageSource:
    kind: SourceKind
    path: Path
    ref: str | None = None
    """Reference inside a multi-image layout or archive; None when it holds exactly one image."""

    @property
    def transport(self) -> str:
        """skopeo's name for this source (``oci:/dir:ref``, ``docker-archive:/x.tar``...)."""
        base = f"{self.kind}:{self.path}"
        return f"{base}:{self.ref}" if self.ref else base


def split_ref(image: str) -> tuple[str, str | None]:
    """``registry/repo:tag`` -> (``registry/repo``, ``tag``); digests (``@sha256:..``) count as no tag."""
    repo, _, digest = image.partition("@")
    if digest:
        return repo, None
    head, sep, tag = repo.rpartition(":")
    if sep and "/" not in tag:
        return head, tag
    return repo, None


def safe_name(image: str) -> str:
    """A file-name-safe form of a full reference: ``docker.io/a/b:t`` -> ``docker.io_a_b_t``."""
    return "".join(c if c.isalnum() or c in "-._" else "_" for c in image)


def candidate_names(image: str) -> list[str]:
    """Names looked up in source dirs, most specific first: full safe name, ``repo-basename_tag``, tag."""
    repo, tag = split_ref(image)
    names = [safe_name(image)]
    base = repo.rsplit("/", 1)[-1]
    if tag:
        names += [f"{base}_{tag}", tag]
    else:
        names.append(base)
    return list(dict.fromkeys(names))


def _tar_kind(path: Path) -> SourceKind:
    try:
        with tarfile.open(path) as tf:
            names = {m.name.lstrip("./") for m in tf}
    except (OSError, tarfile.TarError) as exc:
        raise ImportFailure(f"{path} is not a readable tar archive: {exc}") from None
    if "oci-layout" in names:
        return "oci-archive"
    if "manifest.json" in names:
        return "docker-archive"
    raise ImportFailure(f"{path} is neither an OCI archive (no oci-layout) nor a docker-archive (no manifest.json)")


def _layout_ref(layout: Path, image: str) -> str | None:
    """Pick the manifest of ``image`` in a layout's index.json by its ref.name annotation."""
    try:
        index = json.loads((layout / "index.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ImportFailure(f"{layout}/index.json is unreadable: {exc}") from None
    refs = [m.get("annotations", {}).get("org.opencontainers.image.ref.name") for m in index.get("manifests", [])]
    _, tag = split_ref(image)
    for want in (image, tag):
        if want and want in refs:
            return want
    if len(refs) == 1:
        return refs[0]  # the single image, whatever it is called (None = unnamed)
    raise ImportFailure(f"{layout} holds {len(refs)} images and none is named {image!r} or {tag!r}")


def source_at(path: Path, image: str) -> ImageSource:
    """Classify an explicit path (layout dir or tar)."""
    if path.is_dir():
        if not (path / "oci-layout").is_file():
            raise ImportFailure(f"{path} is a directory but not an OCI image layout (no oci-layout file)")
        return ImageSource("oci", path.resolve(), _layout_ref(path, image))
    if path.is_file():
        return ImageSource(_tar_kind(path), path.resolve())
    raise ImportFailure(f"image source {path} does not exist")


def find_source(image: str, search_dirs: list[Path], explicit: dict[str, Path] | None = None) -> ImageSource:
    """Locate ``image`` on disk; ``ImportFailure`` lists every place that was tried."""
    if explicit and image in explicit:
        return source_at(explicit[image], image)
    tried: list[str] = []
    for d in search_dirs:
        for name in candidate_names(image):
            for cand in [d / name, *(d / f"{name}{s}" for s in _TAR_SUFFIXES)]:
                tried.append(str(cand))
                if cand.exists():
                    return source_at(cand, image)
    where = ", ".join(tried[:6]) + (f" (+{len(tried) - 6} more)" if len(tried) > 6 else "")
    raise ImportFailure(f"no OCI layout or archive found for {image}; tried {where}")


async def run_tool(*argv: str, timeout: float = 3600) -> bytes:
    """Run skopeo/umoci; a non-zero exit becomes ``ImportFailure`` with the tool's stderr tail."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
    except FileNotFoundError:
        raise ImportFailure(f"{argv[0]} is not installed (apt-get install skopeo umoci)") from None
    try:
        out, errb = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise ImportFailure(f"{argv[0]} {argv[1]} timed out after {timeout:.0f} s") from None
    if proc.returncode != 0:
        tail = errb.decode(errors="replace").strip()[-600:]
        raise ImportFailure(f"{argv[0]} {argv[1]} failed (exit {proc.returncode}): {tail}")
    return out


async def image_config(src: ImageSource) -> tuple[str, dict]:
    """(image id = sha256 of the config blob, parsed config) of ``src``, read without copying layers."""
    raw = await run_tool("skopeo", "inspect", "--config", "--raw", src.transport)
    try:
        return "sha256:" + hashlib.sha256(raw).hexdigest(), json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ImportFailure(f"image config of {src.transport} is not JSON: {exc}") from None


async def unpack(src: ImageSource, work: Path) -> Path:
    """Copy ``src`` into an OCI layout under ``work`` and unpack it; returns the bundle directory."""
    layout, bundle = work / "layout", work / "bundle"
    await run_tool("skopeo", "copy", "--quiet", src.transport, f"oci:{layout}:lego")
    await run_tool("umoci", "unpack", "--image", f"{layout}:lego", str(bundle))
    return bundle
