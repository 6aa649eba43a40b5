"""``lego images``: import each task's image as a rootfs bundle and write ``images.json``.

One bundle per image under ``root``: ``<root>/<name>/rootfs`` plus ``.lego-image.json`` (what was
imported, from which image id, with which options). Guarantees:

* never half-imported: an image is unpacked into ``<root>/.tmp-*`` and renamed into place only when
  complete; leftovers of an interrupted run are removed on the next one;
* resumable and cheap to rerun: a bundle whose marker matches the source's image id and the options
  is reused without unpacking; ``images.json`` is rewritten atomically after every image;
* a broken image is reported (``ImageOutcome.error``) and skipped; the others still import;
* the image's environment is kept, the dataset's working directory is used (not the image's).

The mapping has the reference shape ``{image: {"rootfs", "workdir", "env"}}``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from lego_rl.errors import TaskDataError
from lego_rl.images.pathfix import fix_root_toolchain_path
from lego_rl.images.sources import ImportFailure, find_source, image_config, split_ref, unpack
from lego_rl.runstore.publish import publish_dir, staging
from lego_rl.sandbox.base import ImageSpec
from lego_rl.tasks.rows import atomic_write_text

MARKER = ".lego-image.json"
Status = Literal["imported", "reused", "failed"]


@dataclass
class ImageOutcome:
    image: str
    status: Status
    rootfs: str | None = None
    error: str | None = None
    tasks: int = 0


@dataclass
class ImportReport:
    outcomes: list[ImageOutcome] = field(default_factory=list)
    mapping: dict[str, dict] = field(default_factory=dict)

    def count(self, status: Status) -> int:
        return sum(1 for o in self.outcomes if o.status == status)


def bundle_name(image: str, taken: Mapping[str, str]) -> str:
    """The reference's ``<root>/<tag>``; the full safe name where a tag is missing, generic or taken."""
    _, tag = split_ref(image)
    name = tag if tag and tag != "latest" else "".join(c if c.isalnum() or c in "-._" else "_" for c in image)
    if taken.get(name, image) != image:
        name = "".join(c if c.isalnum() or c in "-._" else "_" for c in image)
    return name


def load_images_json(path: str | Path) -> dict[str, ImageSpec]:
    """Read an ``images.json`` into ImageSpecs for ``create_sandbox(images=...)``."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TaskDataError(f"cannot read images mapping: {exc}", source=str(p)) from None
    if not isinstance(data, dict):
        raise TaskDataError("images mapping must be a JSON object {image: {rootfs, workdir, env}}", source=str(p))
    out: dict[str, ImageSpec] = {}
    for name, entry in data.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("rootfs"), str):
            raise TaskDataError(f"entry {name!r} lacks a string 'rootfs'", source=str(p))
        env = entry.get("env") or {}
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise TaskDataError(f"entry {name!r}: 'env' must map names to strings", source=str(p))
        out[name] = ImageSpec(name=name, rootfs=entry["rootfs"], workdir=entry.get("workdir") or "/", env=env)
    return out


def _env_dict(config: dict) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in (config.get("config") or {}).get("Env") or []:
        key, sep, value = item.partition("=")
        if sep:
            env[key] = value
    return env


def _read_marker(bundle: Path) -> dict | None:
    try:
        return json.loads((bundle / MARKER).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _clean_leftovers(root: Path) -> None:
    """Remove what an interrupted import left: unpack folders, and old bundles set aside by a replace
    (``runstore.publish``: ``.<name>.old-*``; ``.old-*`` from earlier versions)."""
    for pattern in (".tmp-*", ".*.old-*", ".old-*"):
        for p in root.glob(pattern):
            shutil.rmtree(p, ignore_errors=True)


async def import_one(
    image: str,
    workdir: str,
    *,
    root: Path,
    name: str,
    search_dirs: Sequence[Path],
    explicit: Mapping[str, Path] | None = None,
    fix_path: bool = False,
) -> tuple[Status, dict]:
    """Import (or reuse) one image; returns its status and ``images.json`` entry.

    Raises ``ImportFailure`` with the failing step; nothing is left under ``root`` in that case.
    """
    src = find_source(image, list(search_dirs), dict(explicit or {}))
    image_id, config = await image_config(src)
    final = root / name
    options = {"fix_path": fix_path}
    marker = _read_marker(final)
    if marker and marker.get("image_id") == image_id and marker.get("options") == options:
        entry = {"rootfs": str(final / "rootfs"), "workdir": workdir, "env": marker["env"]}
        return "reused", entry
    with staging(final, prefix=f".tmp-{name}-") as work:
        bundle = await unpack(src, work)
        env = _env_dict(config)
        if fix_path:
            env = fix_root_toolchain_path(bundle / "rootfs", env)
        if not (bundle / "rootfs" / workdir.lstrip("/")).is_dir():
            raise ImportFailure(f"the dataset's workdir {workdir} does not exist in the image")
        record = {"image": image, "image_id": image_id, "source": src.transport, "options": options, "env": env}
        (bundle / MARKER).write_text(json.dumps(record, indent=2))
        # A stale bundle of another image id is replaced: moved aside, the new one renamed in, then deleted.
        publish_dir(bundle, final, existing="replace", what="image bundle")
    return "imported", {"rootfs": str(final / "rootfs"), "workdir": workdir, "env": env}


async def import_images(
    images: Mapping[str, str],
    *,
    root: str | Path,
    output: str | Path,
    search_dirs: Sequence[str | Path],
    explicit: Mapping[str, str | Path] | None = None,
    fix_path: bool = False,
    on_progress: Callable[[ImageOutcome], None] | None = None,
) -> ImportReport:
    """Import every image of ``images`` (image -> dataset workdir) and write ``output`` (images.json).

    Entries already in ``output`` for other images are kept, so several datasets can share a mapping.
    """
    root_p, out_p = Path(root).resolve(), Path(output)
    root_p.mkdir(parents=True, exist_ok=True)
    root_p.chmod(0o755)  # sandbox runtimes chroot below it as non-root: it must be traversable
    _clean_leftovers(root_p)
    report = ImportReport()
    if out_p.exists():
        report.mapping = {
            k: {"rootfs": v.rootfs, "workdir": v.workdir, "env": v.env} for k, v in load_images_json(out_p).items()
        }
    taken: dict[str, str] = {}
    for image, workdir in images.items():
        name = bundle_name(image, taken)
        taken[name] = image
        try:
            status, entry = await import_one(
                image, workdir, root=root_p, name=name, search_dirs=[Path(d) for d in search_dirs],
                explicit={k: Path(v) for k, v in (explicit or {}).items()}, fix_path=fix_path,
            )
            outcome = ImageOutcome(image, status, rootfs=entry["rootfs"])
            report.mapping[image] = entry
            atomic_write_text(out_p, json.dumps(report.mapping, indent=2, sort_keys=True) + "\n")
        except ImportFailure as exc:
            outcome = ImageOutcome(image, "failed", error=str(exc))
        except OSError as exc:  # disk full, permissions: this image fails, the next may still fit
            outcome = ImageOutcome(image, "failed", error=f"{type(exc).__name__}: {exc}")
        report.outcomes.append(outcome)
        if on_progress is not None:
            on_progress(outcome)
    if not out_p.exists():
        atomic_write_text(out_p, json.dumps(report.mapping, indent=2, sort_keys=True) + "\n")
    return report


def images_of_tasks(rows: Sequence) -> dict[str, str]:
    """image -> workdir over task rows; one image with two workdirs is a ``TaskDataError``."""
    out: dict[str, str] = {}
    for r in rows:
        m = r.metadata
        if out.setdefault(m.image, m.workdir) != m.workdir:
            raise TaskDataError(f"image {m.image} is used with two workdirs: {out[m.image]} and {m.workdir} ({m.instance_id})")
    return out
