"""Weight sync through a checkpoint on disk: the route every engine already answers.

The trainer writes its weights as safetensors into one directory, then every replica is paused, told to
``reload_weights`` from it, labelled with the new version and resumed (``ServingClient.update_weights``:
in-flight requests are frozen, not aborted, so every token is produced by exactly one labelled version).
It works for the embedded engine and for vLLM on the same machine or a shared file system; the faster
in-place sync (``orchestrate.weight_sync``) replaces it where it applies, and this stays the baseline it
is measured against.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from lego_rl.orchestrate.loop import WeightSyncFn
from lego_rl.serving.client import ServingClient
from lego_rl.train.backend import TrainerBackend


def _write(backend: TrainerBackend, directory: Path) -> None:
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    # clone(): tied parameters share storage, which safetensors refuses; the engine re-ties on load.
    state = {name: t.detach().to("cpu").contiguous().clone() for name, t in backend.export_weights()}
    tmp = directory / "model.safetensors.tmp"
    save_file(state, str(tmp))
    tmp.replace(directory / "model.safetensors")  # a reload never reads a half-written file


def disk_weight_sync(client: ServingClient, directory: Path) -> WeightSyncFn:
    """A ``WeightSyncFn`` that reloads every replica of ``client`` from ``directory`` (overwritten each sync)."""

    async def sync(backend: TrainerBackend, version: int) -> None:
        await asyncio.to_thread(_write, backend, directory)
        await client.update_weights(directory, version)

    return sync
