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
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lego_rl.errors import ConfigError
from lego_rl.runstore.files import write_new
from lego_rl.runstore.publish import already_exists, publish_dir, staging

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


def publish_checkpoint(path: Path, fill: Callable[[Path], None], *, info: dict[str, Any]) -> Path:
    """Create the checkpoint ``path``: ``fill(tmp)`` writes its contents into a hidden temp folder, then the
    marker (``info`` plus the format version) is written and the folder renamed into place.

    :raises FileExistsError: naming ``path`` when it exists (a checkpoint is never overwritten).
    """
    path = Path(path)
    if path.exists():  # before any work: a checkpoint is never overwritten
        raise already_exists(path, "checkpoint")
    with staging(path, prefix=f".{path.name}.partial-") as tmp:
        fill(tmp)
        write_new(
            tmp / MARKER,
            json.dumps({"format_version": FORMAT_VERSION, **info}, indent=2) + "\n",
            what="checkpoint marker",
        )
        publish_dir(tmp, path, existing="refuse", fsync=True, what="checkpoint")
    return path


def extra_state_json(extra_state: dict[str, Any]) -> str:
    """The loop's ``extra_state`` as the checkpoint's JSON text, checked before any file is written.

    :raises ValueError: when it is not JSON-serialisable.
    """
    try:
        return json.dumps(extra_state, indent=2, sort_keys=True) + "\n"
    except TypeError as exc:
        raise ValueError(f"extra_state must be JSON-serialisable (the loop's cursor and step): {exc}") from exc


def trainer_state(optimizer_state: dict[str, Any], scheduler: Any, weight_version: int) -> dict[str, Any]:
    """What a backend's trainer-state file holds: optimizer, scheduler, weight version and the RNG state."""
    return {"optimizer": optimizer_state, "scheduler": scheduler.state_dict(), "weight_version": weight_version,
            "rng": rng_state()}


def restore_trainer_state(path: Path, state: dict[str, Any], scheduler: Any) -> tuple[int, dict[str, Any]]:
    """Restore the scheduler and RNG from ``state`` (a trainer-state file of checkpoint ``path``, the optimizer
    already loaded by the backend); the weight version and the loop's extra state."""
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    extra: dict[str, Any] = json.loads((Path(path) / EXTRA_STATE).read_text())
    return int(state["weight_version"]), extra


def copy_side_files(model_dir: Path, into: Path, names: tuple[str, ...]) -> None:
    """Copy the model directory's side files (tokenizer, chat template...) that exist into a checkpoint being
    written, so the checkpoint is a servable model; a file the weights' writer already made is kept."""
    for name in names:
        if (model_dir / name).is_file() and not (into / name).exists():
            shutil.copy2(model_dir / name, into / name)


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
