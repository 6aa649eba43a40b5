"""Atomic file writes: the one helper every writer of run artifacts, samples and datasets goes through.

A reader must never see a half-written file, and an artifact, once written, must never be replaced by a
second writer (logs are evidence). Both follow from one recipe: write a temp file in the target's own
folder (same file system), ``fsync`` it, then publish it under its name in one step:

* ``write_new`` publishes with ``link(2)``, which fails when the name exists, instead of ``rename(2)``,
  which would silently replace it;
* ``replace_file`` publishes with ``rename(2)`` for the few files meant to be rewritten whole (a converted
  dataset, an ``images.json`` mapping updated after every imported image);
* ``write_next_free`` picks ``name``, ``name.1``, ``name.2`` ... for a writer that may run twice into
  one folder (a harness retried in the same rollout folder).

Whatever fails, the temp file is removed: a failed write leaves the folder as it found it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

Content = bytes | str | Callable[[BinaryIO], None]
"""What to write: bytes, text (UTF-8), or a function that writes into the open binary file."""


def _write_temp(folder: Path, name: str, data: Content) -> str:
    """A fsynced temp file holding ``data`` in ``folder``; the caller publishes or removes it."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            if callable(data):
                data(fh)
            else:
                fh.write(data.encode() if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def write_new(path: str | Path, data: Content, *, what: str = "file") -> Path:
    """Write ``path`` atomically, only if nothing exists there yet.

    :param what: how the error names the file ("saved samples", "turn records"...).
    :raises FileExistsError: naming ``path`` when it exists (checked before writing, and again atomically
        when publishing, so a concurrent writer cannot be overwritten either).
    """
    path = Path(path)
    if path.exists():
        raise _exists(path, what)
    tmp = _write_temp(path.parent, path.name, data)
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise _exists(path, what) from None
    finally:
        os.unlink(tmp)
    return path


def replace_file(path: str | Path, data: Content) -> Path:
    """Write ``path`` atomically, replacing what was there (readers see the old or the new file, whole)."""
    path = Path(path)
    tmp = _write_temp(path.parent, path.name, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def write_next_free(folder: str | Path, name: str, data: Content, *, limit: int = 1000) -> Path:
    """Write ``folder/name`` atomically, or ``stem.1.ext``, ``stem.2.ext`` ... when taken; never replaces.

    :raises FileExistsError: when all ``limit`` names are taken.
    """
    folder = Path(folder)
    stem, dot, ext = name.partition(".")
    tmp = _write_temp(folder, name, data)
    try:
        for n in range(limit):
            candidate = folder / (name if n == 0 else f"{stem}.{n}{dot}{ext}")
            try:
                os.link(tmp, candidate)
            except FileExistsError:
                continue
            return candidate
    finally:
        os.unlink(tmp)
    raise FileExistsError(f"{folder}: all {limit} names like {name} are taken; move old files away")


def _exists(path: Path, what: str) -> FileExistsError:
    return FileExistsError(
        f"{what} {path} already exists; it is never overwritten (write elsewhere or move it away)"
    )
