"""Pipeline-parallel schedules over ``torch.distributed`` point-to-point messages (gloo or NCCL).

Each pipeline stage holds a contiguous run of the model's layers; a micro-batch's activations travel forward
stage by stage and their gradients travel back. Two schedules:

* ``forward_only``: every micro-batch through every stage, in order (logprob recomputation).
* ``one_forward_one_backward`` (1F1B, PipeDream-flush): stage ``s`` of ``P`` first runs ``P - s - 1`` forwards,
  then alternates one forward with one backward, then drains the remaining backwards. At most ``P - s``
  micro-batches' activations are alive on a stage, against all of them for fill-then-drain (GPipe); the bubble
  is the same ``(P - 1) / (n + P - 1)``.

Why not megatron-core's ``get_forward_backward_func``: its schedules (0.16.1) allocate a token counter with
``torch.zeros([], dtype=torch.int, device="cuda")`` unconditionally, so on a CPU build they fail with
``AssertionError: Torch not compiled with CUDA enabled`` and could not be tested here; they also need either
one fixed sequence length or a shape handshake before every message (``variable_seq_lengths``), and they
divide every loss by the number of micro-batches. Here every rank holds every micro-batch (the backend is
SPMD), so both ends of a message know its shape without a handshake, and a loss is used as the caller made it
(its token weights already carry the per-rollout denominators).

Messages travel in one dtype (``wire_dtype``): the receiving side allocates its buffer before the sender's
tensor exists. Paired messages (send an activation, receive a gradient from the same neighbour) go in one
``batch_isend_irecv``, as megatron-core does, so two neighbours both sending first cannot deadlock.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
import torch.distributed as dist

StageForward = Callable[[int, torch.Tensor | None], torch.Tensor]
"""``(micro-batch number, input activation or None on the first stage) -> output``: the activation handed to
the next stage, or on the last stage whatever the caller computes there (a scalar loss when training)."""


@dataclass(frozen=True)
class Stage:
    """This process's place in its pipeline: stage ``rank`` of ``size``, and its neighbours' global ranks."""

    rank: int
    size: int
    prev: int | None
    """Global rank of the previous stage (None on the first)."""
    next: int | None
    """Global rank of the next stage (None on the last)."""
    group: dist.ProcessGroup | None = None
    """The pipeline's process group (None: the default group). With NCCL a group's first collective must
    involve all its ranks, and a batched send/receive between two neighbours does not: the caller makes some
    other collective on this group first."""

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"stage {self.rank} of a {self.size}-stage pipeline")
        if (self.prev is None) != self.first or (self.next is None) != self.last:
            raise ValueError(f"stage {self.rank} of {self.size} needs a previous stage exactly when it is not the "
                             f"first and a next one exactly when it is not the last (prev={self.prev}, "
                             f"next={self.next})")

    @property
    def first(self) -> bool:
        return self.rank == 0

    @property
    def last(self) -> bool:
        return self.rank == self.size - 1


def _exchange(sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]],
              group: dist.ProcessGroup | None) -> None:
    """Post every send and receive (peers by global rank) at once, then wait for all of them."""
    ops = [dist.P2POp(dist.isend, t, peer, group) for t, peer in sends]
    ops += [dist.P2POp(dist.irecv, t, peer, group) for t, peer in recvs]
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()


class _Wire:
    """The messages of one schedule run: activation shapes per micro-batch, one dtype, one device."""

    def __init__(self, stage: Stage, shape: Callable[[int], tuple[int, ...]], dtype: torch.dtype,
                 device: torch.device) -> None:
        self.stage, self.shape, self.dtype, self.device = stage, shape, dtype, device

    def buffer(self, i: int) -> torch.Tensor:
        return torch.empty(self.shape(i), dtype=self.dtype, device=self.device)

    def outgoing(self, i: int, y: torch.Tensor) -> torch.Tensor:
        want = self.shape(i)
        if tuple(y.shape) != want:
            raise RuntimeError(f"stage {self.stage.rank} produced an activation of shape {tuple(y.shape)} for "
                               f"micro-batch {i}; the next stage expects {want}")
        return y.detach().to(self.dtype).contiguous()

    def run(self, send_act: tuple[int, torch.Tensor] | None = None, recv_act: int | None = None,
            send_grad: torch.Tensor | None = None, recv_grad: int | None = None) -> tuple[torch.Tensor | None,
                                                                                     torch.Tensor | None]:
        """One exchange: send micro-batch ``send_act[0]``'s activation forward and/or a gradient back,
        receive micro-batch ``recv_act``'s activation and/or ``recv_grad``'s gradient. Returns (activation,
        gradient) received. Neighbours that do not exist are skipped."""
        st = self.stage
        sends: list[tuple[torch.Tensor, int]] = []
        recvs: list[tuple[torch.Tensor, int]] = []
        act = grad = None
        if send_act is not None and st.next is not None:
            sends.append((self.outgoing(*send_act), st.next))
        if send_grad is not None and st.prev is not None:
            sends.append((send_grad.to(self.dtype).contiguous(), st.prev))
        if recv_act is not None and st.prev is not None:
            act = self.buffer(recv_act)
            recvs.append((act, st.prev))
        if recv_grad is not None and st.next is not None:
            grad = self.buffer(recv_grad)
            recvs.append((grad, st.next))
        _exchange(sends, recvs, st.group)
        return act, grad


def forward_only(stage: Stage, n: int, forward: StageForward, *, shape: Callable[[int], tuple[int, ...]],
                 dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
    """Run micro-batches ``0..n-1`` through this stage in order; returns the last stage's outputs (empty
    elsewhere). Call under ``torch.no_grad``."""
    wire = _Wire(stage, shape, dtype, device)
    outputs: list[torch.Tensor] = []
    for i in range(n):
        x, _ = wire.run(recv_act=i)
        y = forward(i, x)
        if stage.last:
            outputs.append(y)
        else:
            wire.run(send_act=(i, y))
    return outputs


def one_forward_one_backward(stage: Stage, n: int, forward: StageForward, *,
                             shape: Callable[[int], tuple[int, ...]], dtype: torch.dtype, device: torch.device,
                             backward_context: Callable[[int], AbstractContextManager[None]] | None = None
                             ) -> list[torch.Tensor]:
    """Forward and backward of micro-batches ``0..n-1`` under the 1F1B schedule; gradients accumulate in
    the stage's parameters. On the last stage ``forward`` returns a scalar loss per micro-batch (returned,
    detached, in order); elsewhere the list is empty. Every stage must call it with the same ``n``.
    ``backward_context(i)`` is entered around micro-batch ``i``'s backward (recomputed layers re-run their
    forward there, and may need the micro-batch's state again: routing replay)."""
    wire = _Wire(stage, shape, dtype, device)
    inputs: dict[int, torch.Tensor | None] = {}
    outputs: dict[int, torch.Tensor] = {}
    losses: list[torch.Tensor] = []

    def fwd(i: int, x: torch.Tensor | None) -> torch.Tensor:
        if x is not None:
            x.requires_grad_(True)  # its gradient is what this stage sends back
        y = forward(i, x)
        if stage.last:
            if y.dim() != 0:
                raise RuntimeError(f"the last stage's forward must return a scalar loss; micro-batch {i} gave "
                                   f"shape {tuple(y.shape)}")
            losses.append(y.detach())
        inputs[i], outputs[i] = x, y
        return y

    def bwd(i: int, grad: torch.Tensor | None) -> torch.Tensor | None:
        x, y = inputs.pop(i), outputs.pop(i)
        with backward_context(i) if backward_context is not None else contextlib.nullcontext():
            if stage.last:
                y.backward()
            else:
                assert grad is not None
                torch.autograd.backward(y, grad_tensors=grad.to(y.dtype))
        return None if x is None else x.grad

    warmup = min(stage.size - stage.rank - 1, n)
    for i in range(warmup):
        x, _ = wire.run(recv_act=i)
        y = fwd(i, x)
        wire.run(send_act=(i, y))
    x = wire.run(recv_act=warmup)[0] if warmup < n else None
    for k in range(n - warmup):  # steady state: forward warmup + k, backward k
        i = warmup + k
        y = fwd(i, x)
        _, grad = wire.run(send_act=None if stage.last else (i, y), recv_grad=k)
        g_in = bwd(k, grad)
        if i + 1 < n:
            x, _ = wire.run(send_grad=g_in, recv_act=i + 1)
        else:
            wire.run(send_grad=g_in)
    for k in range(n - warmup, n):  # cool-down: the backwards still owed
        _, grad = wire.run(recv_grad=k)
        wire.run(send_grad=bwd(k, grad))
    return losses
