"""Atomic directories: the one way lego publishes a directory that readers must see whole or not at all.

A checkpoint, a converted model, an imported image bundle, an extracted toolchain tree, a staged root file
system and a weight-sync folder are all made the same way: filled in a hidden temporary folder *beside* the
target (same file system, so the publish is a ``rename(2)``), then renamed into place in one step. A crash leaves
either no target or a complete one, plus a hidden leftover a reader never opens. What differs between writers is
only what happens when the target already exists, so that is the one choice (``Existing``):

* ``"refuse"``: the target is never overwritten (a checkpoint): ``FileExistsError`` naming it, checked before the
  rename and again by it, so a concurrent writer is not overwritten either;
* ``"replace"``: the new directory replaces the old (a rebuilt model, a re-imported image): the old one is moved
  aside first, the new one renamed in, then the old one removed; readers see the old or the new directory;
* ``"keep"``: the first writer wins (a content-addressed cache several processes may fill at once): when the
  target appeared meanwhile, the copy just made is dropped and the existing one kept.

``fsync`` makes the publish durable: every file and folder of the new directory, then the parent's new entry.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

Existing = Literal["refuse", "replace", "keep"]
"""What publishing does when the target exists (see the module docstring)."""


@contextmanager
def staging(target: Path, *, prefix: str | None = None) -> Iterator[Path]:
    """A new hidden folder beside ``target`` (its parent is created) for a writer to fill; removed on leaving
    the block whatever happened (after ``publish_dir`` moved it, or a part of it, into place, the rest).

    :param prefix: the temp folder's name prefix (default ``.<name>.partial-``); a writer whose leftovers are
        swept by name passes its own.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix or f".{target.name}.partial-", dir=target.parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def publish_dir(staged: Path, target: Path, *, existing: Existing, fsync: bool = False, what: str = "directory",
                keep_if: Callable[[Path], bool] = Path.is_dir) -> Path:
    """Move the filled folder ``staged`` (beside ``target``, on its file system) to ``target`` in one step.

    :param existing: what to do when ``target`` exists (module docstring).
    :param fsync: flush ``staged``'s files and folders before the rename and the parent's entry after it.
    :param what: how an error names the target ("checkpoint", "toolchain tree"...).
    :param keep_if: with ``"keep"``, whether an existing ``target`` is complete enough to keep (else the failed
        rename's error is raised).
    :returns: ``target``.
    :raises FileExistsError: with ``"refuse"``, when ``target`` exists.
    """
    staged, target = Path(staged), Path(target)
    if existing == "refuse" and target.exists():
        raise already_exists(target, what)
    if fsync:
        fsync_tree(staged)
    try:
        if existing == "replace" and target.exists():
            _swap(staged, target)
        elif existing == "refuse":
            _rename_new(staged, target, what)
        else:
            os.rename(staged, target)
    except OSError:
        if existing == "refuse" and target.exists():
            raise already_exists(target, what) from None
        if existing != "keep" or not keep_if(target):
            raise
        shutil.rmtree(staged, ignore_errors=True)  # another writer published it first: theirs stands
        return target
    if fsync:
        fsync_path(target.parent)  # make the new entry in the parent folder durable too
    return target


def already_exists(target: Path, what: str = "directory") -> FileExistsError:
    """The error for a target that is never overwritten."""
    return FileExistsError(f"{what} {target} already exists; it is never overwritten (save under a new name or "
                           "move it away)")


def _rename_new(staged: Path, target: Path, what: str) -> None:
    """``rename(2)`` that never replaces an existing target: rename would silently replace an *empty* folder,
    so an existing one is refused first (the rename still fails for a non-empty one that appears meanwhile)."""
    if target.exists():
        raise already_exists(target, what)
    os.rename(staged, target)


def _swap(staged: Path, target: Path) -> None:
    """Replace ``target`` with ``staged``: the old one goes aside (hidden, beside it), the new one in, then the old
    one is removed; if the new one cannot go in, the old one is put back."""
    aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    old = aside / "old"
    os.rename(target, old)
    try:
        os.rename(staged, target)
    except OSError:
        if not target.exists():
            os.rename(old, target)
        raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def fsync_tree(root: Path) -> None:
    """fsync every file and folder under ``root`` (writers such as ``save_pretrained`` do not): a rename is only
    as durable as the data it publishes."""
    for folder, _, files in os.walk(root):
        for name in files:
            fsync_path(Path(folder) / name)
        fsync_path(Path(folder))


def fsync_path(path: Path) -> None:
    """fsync one file or folder (a folder: its entries, e.g. a name just created in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
