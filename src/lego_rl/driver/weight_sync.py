"""Weight sync: after an optimizer step, the serving engines sample from the trainer's new weights.

A ``WeightSync`` takes what it needs of a trainer backend (``WeightSource``: ``weight_version`` and
``export_weights()``, full tensors by Hugging Face name) and pushes it to the engines without restarting them:

* ``EmbeddedWeightSync``: the in-process embedded engine. The exported tensors are copied into the engine's
  parameters in place, one at a time, in the engine's worker thread (no checkpoint is written).
* ``RouteWeightSync``: engines behind vLLM's HTTP routes (real vLLM, or the embedded engine's server). The
  tensors are written once as a safetensors checkpoint to a staging directory every replica can read
  (``/dev/shm`` is a good one on one host), then each replica is paused, told to ``reload_weights`` from it
  through ``/collective_rpc`` (vLLM needs ``VLLM_SERVER_DEV_MODE=1``: ``serving.vllm_launch``), labelled with
  the new version and resumed. vLLM's NCCL/IPC transfer engines need GPUs; this path works everywhere.

Versions: the engine is labelled with ``backend.weight_version`` (0 = the loaded checkpoint, +1 per optimizer
step) and every sampled token carries the label of the weights that produced it, end to end
(``GenerateResult.weight_versions`` -> ``TurnRecord.weight_versions`` -> ``Sample.weight_versions``).

A sync while generation is in flight: by default (``in_flight = "wait"``) **requests in flight finish on the
old weights**. The sync pauses the engines in ``wait`` mode: nothing new is admitted, running requests decode to their end (stop or
length) under the old weights and every one of their tokens is tagged with the old version; then the weights
are swapped, the prefix caches emptied, and the engines resumed. Requests that arrived meanwhile wait in the
queue and run entirely on the new version. So a turn is never split across versions, no rollout is aborted
(none is labelled ``weight_sync_interrupted`` by a sync) and no KV computed by old weights is reused; the
cost is that a sync waits for the longest generation in flight (bounded by ``max_tokens``). A rollout's later
turns may run on a newer version than its earlier ones; the per-token versions say so and admission
(``rollout.max_staleness``, ``rollout.partial_rollouts``) decides what that rollout is worth.

``in_flight = "keep"`` (``rollout.sync_in_flight``) does not wait: requests in flight are frozen, the weights
swapped, and they continue on the new weights with their KV recomputed first, so a turn may be split across two
versions (every token still tagged with the one that sampled it, its logprob that version's). The sync then
costs the load only, not the longest generation in flight; a turn's tokens are trained each with its own
version (the rollout's per-token logprobs are the behaviour policy of TIS/MIS). Aborting in-flight requests is
not offered: the adapter does not resubmit an aborted turn, so the CLI would see a failed request.

Every replica behind the client is synced (each is paused, loaded, labelled and resumed); the client's sticky
routing of sessions to replicas is untouched, so a rollout's later turns go where its prefix cache was.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Literal, Protocol

import torch
from pydantic import BaseModel

from lego_rl.runstore.publish import publish_dir, staging
from lego_rl.serving.client import ServingClient
from lego_rl.serving.engine import EmbeddedEngine

InFlight = Literal["wait", "keep"]
"""What a sync does to requests in flight (module docstring): finish them on the old weights, or freeze them and
continue them on the new ones."""


class WeightSource(Protocol):
    """What a sync needs of a trainer backend (the ``TrainerBackend`` contract of ``train`` satisfies it)."""

    @property
    def weight_version(self) -> int: ...

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]: ...


class SyncReport(BaseModel):
    """One completed sync."""

    version: int
    """The version the engines now serve."""
    seconds: float
    """Wall time from the start of the pause to the resume (engines sampled nothing new meanwhile)."""
    drain_seconds: float
    """Of which waiting for requests in flight to finish on the old weights (0 where the routes do not say)."""
    stage_seconds: float
    """Writing the staging checkpoint, before the pause (0 for the in-place copy)."""
    bytes: int
    """Bytes of weights moved (copied in place, or written to the staging checkpoint)."""


class WeightSync(ABC):
    """Pushes a trainer's weights to the serving engines (see module docstring)."""

    last: SyncReport | None = None
    """The report of the latest sync made through ``__call__`` (the loop's hook returns nothing)."""

    @abstractmethod
    async def push(self, source: WeightSource) -> SyncReport:
        """Make the engines serve ``source``'s current weights, labelled ``source.weight_version``."""

    async def __call__(self, source: WeightSource, version: int) -> None:
        """The training loop's sync hook shape, ``sync(backend, version)``; ``version`` must be the backend's."""
        if version != source.weight_version:
            raise ValueError(f"asked to sync version {version} but the trainer's weights are version "
                             f"{source.weight_version}: the engines would be labelled with the wrong version")
        self.last = await self.push(source)


class EmbeddedWeightSync(WeightSync):
    """In-place copy into an in-process ``EmbeddedEngine``."""

    def __init__(self, engine: EmbeddedEngine, *, in_flight: InFlight = "wait") -> None:
        self.engine = engine
        self.in_flight = in_flight

    async def push(self, source: WeightSource) -> SyncReport:
        version = source.weight_version
        start = time.perf_counter()
        await self.engine.pause(self.in_flight)
        drained = time.perf_counter()
        try:
            moved = await self.engine.update_weights(source.export_weights(), version)
        except BaseException:
            # Refused before anything was copied: the old weights are whole, keep serving them. Refused half-way:
            # the engine stays paused (damaged) until a retried push completes; the trainer still holds the weights.
            if self.engine.weights_damaged is None:
                await self.engine.resume()
            raise
        await self.engine.resume()
        end = time.perf_counter()
        return SyncReport(version=version, seconds=end - start, drain_seconds=drained - start, stage_seconds=0.0,
                          bytes=moved)


class RouteWeightSync(WeightSync):
    """A staged safetensors checkpoint, loaded by every replica through vLLM's routes."""

    def __init__(self, client: ServingClient, staging_dir: str | Path, *, in_flight: InFlight = "wait") -> None:
        self.client = client
        self.staging_dir = Path(staging_dir)
        self.in_flight = in_flight

    async def push(self, source: WeightSource) -> SyncReport:
        version = source.weight_version
        target = self.staging_dir / f"v{version}"
        staged = time.perf_counter()
        # Staged before the pause: the engines keep sampling while the checkpoint is written.
        moved = await asyncio.to_thread(write_checkpoint, source, target)
        start = time.perf_counter()
        await self.client.update_weights(target, version, pause_mode=self.in_flight)
        end = time.perf_counter()
        # Older staged versions are no longer read by anyone (every replica now serves this one).
        for old in self.staging_dir.glob("v*"):
            if old != target and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
        return SyncReport(version=version, seconds=end - start, drain_seconds=0.0, stage_seconds=start - staged,
                          bytes=moved)


def write_checkpoint(source: WeightSource, target: Path) -> int:
    """Write ``source.export_weights()`` as ``target/model.safetensors`` (atomically: a temporary directory
    renamed into place, so a replica never reads a half-written file). Returns the bytes written."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, int]] = set()
    for name, tensor in source.export_weights():
        t = tensor.detach().to("cpu").contiguous()
        key = (t.untyped_storage().data_ptr(), int(t.storage_offset()))
        # safetensors refuses tensors sharing memory (tied embeddings exported under both names): copy one.
        tensors[name] = t.clone() if key in seen else t
        seen.add(key)
    if not tensors:
        raise ValueError(f"the trainer exported no weights for version {source.weight_version}")
    with staging(target) as tmp:  # hidden: the cleanup of old versions ("v*") never sees it
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        publish_dir(tmp, target, existing="replace", what="weight-sync folder")
    return sum(t.numel() * t.element_size() for t in tensors.values())
