"""Driving a multi-rank trainer backend from one process: rank 0 runs the loop, the other ranks follow.

Under ``torchrun --nproc-per-node N lego train ...`` every rank builds the same backend: the torch backend shards
the model over the process group (FSDP2, ``TorchBackend._shard``); the Megatron backend splits it over its tensor-
and data-parallel groups. Only rank 0 runs the training loop (engine, rollouts, run directory). Each backend call
is a collective, so the other ranks must make the same calls in the same order:

* rank 0 wraps its backend in ``RankZeroBackend``; every method first broadcasts ``(method, args, kwargs)``
  (the packed micro-batches and the loss function travel pickled, CPU tensors) and then runs it locally;
* ranks 1..N-1 run ``follow_rank_zero(backend)``: receive a call, run it, discard the result (rank 0 holds the
  full results: logprobs are all-gathered, metrics are reduced), until rank 0 sends ``stop``.

``export_weights`` is a generator: the wrapper announces it, and the followers walk the same parameters (each
all-gather is a collective) while rank 0's consumer does. A consumer that stops early would leave the followers
waiting, so the wrapper always drains the generator.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from lego_rl.errors import ConfigError
from lego_rl.train.backend import LossFn, StepResult, TrainerBackend
from lego_rl.train.batching import MicroBatch, OptimizerStep

_STOP = "stop"


def check_rendezvous(env: Mapping[str, str] = os.environ) -> None:
    """Refuse a launcher environment whose ranks can never meet, before joining the process group.

    ``torchrun --master-port 0`` lets the launcher's store bind any free port, but hands every rank
    ``MASTER_PORT=0``: each then waits for a store on port 0 that no one can listen on, with no error, until
    the rendezvous timeout. A port each rank could pick for itself would differ between ranks, so the only fix
    is the operator's: name a free port."""
    port = env.get("MASTER_PORT")
    if port is None:
        return
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"MASTER_PORT={port!r} (torchrun --master-port): the ranks meet on that port, which must be "
                          "a free TCP port 1-65535, e.g. torchrun --master-port 29500; port 0 never works (every rank "
                          "is told 0 while the launcher listens elsewhere, and the rendezvous hangs)",
                          parameter="MASTER_PORT", value=port)


class RankedBackend(TrainerBackend, Protocol):
    """A backend that knows its place in the process group (the torch and the Megatron backends)."""

    @property
    def rank(self) -> int:
        """This process's rank in the default process group."""
        ...


_CALLS = {"compute_logprobs", "train_step", "export_weights", "save_checkpoint", "load_checkpoint"}


def _broadcast(call: tuple[str, tuple[Any, ...], dict[str, Any]] | None) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    box: list[Any] = [call]
    dist.broadcast_object_list(box, src=0)
    out: tuple[str, tuple[Any, ...], dict[str, Any]] = box[0]
    return out


class RankZeroBackend:
    """Rank 0's ``TrainerBackend``: announces each call to the other ranks, then makes it."""

    def __init__(self, inner: RankedBackend) -> None:
        if inner.rank != 0:
            raise ValueError(f"RankZeroBackend belongs on rank 0, this is rank {inner.rank}")
        self.inner = inner
        self._stopped = False

    @property
    def weight_version(self) -> int:
        return self.inner.weight_version

    def _announce(self, name: str, *args: Any, **kwargs: Any) -> None:
        if self._stopped:
            raise RuntimeError(f"{name} after stop(): the other ranks have left")
        _broadcast((name, args, kwargs))

    def compute_logprobs(self, micro_batches: Sequence[MicroBatch], *, temperature: float, top_p: float = 1.0,
                         top_k: int = -1) -> list[torch.Tensor]:
        kw: dict[str, Any] = {"temperature": temperature, "top_p": top_p, "top_k": top_k}
        self._announce("compute_logprobs", list(micro_batches), **kw)
        return self.inner.compute_logprobs(micro_batches, **kw)

    def train_step(self, step: OptimizerStep, loss_fn: LossFn, *, old_logprobs: Sequence[torch.Tensor],
                   temperature: float, top_p: float = 1.0, top_k: int = -1) -> StepResult:
        kw: dict[str, Any] = {"old_logprobs": list(old_logprobs), "temperature": temperature, "top_p": top_p,
                              "top_k": top_k}
        self._announce("train_step", step, loss_fn, **kw)
        return self.inner.train_step(step, loss_fn, **kw)

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        self._announce("export_weights")
        gen = self.inner.export_weights()
        try:
            yield from gen
        finally:
            for _ in gen:  # the followers gather every parameter: so must rank 0, even if its consumer stopped
                pass

    def save_checkpoint(self, path: Path, *, extra_state: dict[str, Any]) -> None:
        self._announce("save_checkpoint", path, extra_state=extra_state)
        self.inner.save_checkpoint(path, extra_state=extra_state)

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        self._announce("load_checkpoint", path)
        return self.inner.load_checkpoint(path)

    def stop(self) -> None:
        """Release the other ranks (they return from ``follow_rank_zero``). Idempotent."""
        if not self._stopped:
            _broadcast((_STOP, (), {}))
            self._stopped = True


def follow_rank_zero(backend: RankedBackend) -> int:
    """Ranks 1..N-1: make every call rank 0 announces until it says stop. Returns how many calls were made."""
    if backend.rank == 0:
        raise ValueError("follow_rank_zero runs on ranks other than 0")
    calls = 0
    while True:
        name, args, kwargs = _broadcast(None)
        if name == _STOP:
            return calls
        if name not in _CALLS:
            raise RuntimeError(f"rank 0 announced an unknown call {name!r}")
        if name == "export_weights":
            for _ in backend.export_weights():
                pass
        else:
            getattr(backend, name)(*args, **kwargs)
        calls += 1
