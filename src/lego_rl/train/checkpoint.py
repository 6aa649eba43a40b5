"""Trainer checkpoints on disk: a directory published whole, never overwritten, plus the RNG state.

A checkpoint is a directory ``<name>/`` holding the model in Hugging Face format (so an engine can serve it
as is), the backend's ``trainer_state.pt`` (optimizer, scheduler, RNG, weight version), ``extra_state.json``
(the loop's data cursor and step) and, written last, ``lego_checkpoint.json``. Everything is written into
``.<name>.partial-XXXX/`` beside it, fsynced, then renamed into place in one step, so a crash leaves either
no ``<name>/`` or a complete one (a leftover ``.partial-`` folder is hidden and never loaded). The marker is
checked on load as well: a directory without it was not written here and is refused.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lego_rl.errors import ConfigError
from lego_rl.runstore.files import write_new

MARKER = "lego_checkpoint.json"
"""Written last into a checkpoint: its presence means the directory is complete."""
TRAINER_STATE = "trainer_state.pt"
EXTRA_STATE = "extra_state.json"
FORMAT_VERSION = 1


def rng_state() -> dict[str, Any]:
    """Python, numpy, torch (CPU) and every CUDA device's generator state, in plain containers (so
    ``torch.load(weights_only=True)`` reads them back)."""
    np_state = np.random.get_state(legacy=True)
    if not isinstance(
        np_state, tuple
    ):  # legacy=True gives the tuple form unless the bit generator is not MT19937
        raise TypeError(
            f"numpy's global generator is not MT19937 ({np_state.get('bit_generator')}); cannot save it"
        )
    name, keys, pos, has_gauss, gauss = np_state
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (name, keys.tolist(), pos, has_gauss, gauss),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` captured. CUDA states are restored only onto as many devices as exist."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"][: torch.cuda.device_count()])


def _fsync_tree(root: Path) -> None:
    """fsync every file and folder under ``root`` (save_pretrained does not): a rename is only as durable
    as the data it publishes."""
    for folder, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def publish_checkpoint(path: Path, fill: Callable[[Path], None], *, info: dict[str, Any]) -> Path:
    """Create the checkpoint ``path``: ``fill(tmp)`` writes its contents into a hidden temp folder, then the
    marker (``info`` plus the format version) is written and the folder renamed into place.

    :raises FileExistsError: naming ``path`` when it exists (a checkpoint is never overwritten).
    """
    path = Path(path)
    if path.exists():
        raise FileExistsError(
            f"checkpoint {path} already exists; it is never overwritten (save under a new "
            "name or move it away)"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.partial-", dir=path.parent))
    try:
        fill(tmp)
        write_new(
            tmp / MARKER,
            json.dumps({"format_version": FORMAT_VERSION, **info}, indent=2) + "\n",
            what="checkpoint marker",
        )
        _fsync_tree(tmp)
        if path.exists():  # someone else published meanwhile; rename(2) would replace an empty folder
            raise FileExistsError(f"checkpoint {path} appeared while saving; it is never overwritten")
        os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fd = os.open(path.parent, os.O_RDONLY)  # make the new entry in the parent folder durable too
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def read_marker(path: Path) -> dict[str, Any]:
    """The marker of a complete checkpoint.

    :raises ConfigError: when ``path`` is missing or has no marker (not a checkpoint, or an interrupted save).
    """
    path = Path(path)
    marker = path / MARKER
    if not path.is_dir():
        raise ConfigError(f"checkpoint {path} does not exist", parameter="checkpoint", value=str(path))
    if not marker.is_file():
        raise ConfigError(
            f"{path} is not a complete lego checkpoint (no {MARKER}); it was not written by "
            "save_checkpoint or its save was interrupted",
            parameter="checkpoint",
            value=str(path),
        )
    info: dict[str, Any] = json.loads(marker.read_text())
    if info.get("format_version") != FORMAT_VERSION:
        raise ConfigError(
            f"checkpoint {path} has format version {info.get('format_version')}, this lego reads "
            f"{FORMAT_VERSION}",
            parameter="checkpoint",
            value=str(path),
        )
    return info
