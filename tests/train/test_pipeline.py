"""The 1F1B and forward-only pipeline schedules (``lego_rl.train.pipeline``) over real gloo processes.

A stack of layers split over P stages must give the same last-stage outputs and the same parameter gradients
as the whole stack in one process, for micro-batches of different lengths, for more micro-batches than stages
(the steady 1F1B state, a middle stage) and for fewer (all warm-up and cool-down).
"""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lego_rl.train.pipeline import Stage, forward_only, one_forward_one_backward

WIDTH = 8
LAYERS = 6


def stack() -> list[torch.nn.Linear]:
    torch.manual_seed(0)
    return [torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)]


def micro_batches(n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(3 + 2 * i, WIDTH, generator=g) for i in range(n)]  # [T_i, W], lengths differ


def run_layers(layers: list[torch.nn.Linear], x: torch.Tensor) -> torch.Tensor:
    for layer in layers:
        x = torch.tanh(layer(x))  # [T, W]
    return x


def loss_of(y: torch.Tensor, i: int) -> torch.Tensor:
    return (y * (i + 1)).pow(2).mean()  # a different weight per micro-batch: order mistakes show


def reference(n: int) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """(losses, forward outputs, gradients of every parameter) of the whole stack in one process."""
    layers = stack()
    losses, outs = [], []
    for i, x in enumerate(micro_batches(n)):
        y = run_layers(layers, x)
        outs.append(y.detach())
        loss = loss_of(y, i)
        loss.backward()
        losses.append(loss.detach())
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for layer in layers for p in layer.parameters()]
    return losses, outs, grads


def _stage(rank: int, world: int, port: int, n: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    st = Stage(rank=rank, size=world, prev=rank - 1 if rank > 0 else None, next=rank + 1 if rank < world - 1 else None)
    per = LAYERS // world
    mine = stack()[rank * per:(rank + 1) * per]
    xs = micro_batches(n)
    wire = {"shape": lambda i: (xs[i].shape[0], WIDTH), "dtype": torch.float32, "device": torch.device("cpu")}

    def body(i: int, h: torch.Tensor | None) -> torch.Tensor:
        return run_layers(mine, xs[i] if h is None else h)

    with torch.no_grad():
        outs = forward_only(st, n, body, **wire)  # type: ignore[arg-type]
    entered: list[int] = []

    def train(i: int, h: torch.Tensor | None) -> torch.Tensor:
        y = body(i, h)
        return loss_of(y, i) if st.last else y

    def around(i: int) -> contextlib.AbstractContextManager[None]:
        entered.append(i)
        return contextlib.nullcontext()

    losses = one_forward_one_backward(st, n, train, backward_context=around, **wire)  # type: ignore[arg-type]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for layer in mine for p in layer.parameters()]
    torch.save({"outs": outs, "losses": losses, "grads": grads, "entered": entered}, Path(out) / f"{rank}.pt")
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(("stages", "n"), [(3, 5), (3, 1), (2, 2), (2, 0)],
                         ids=["steady-state", "fewer-than-stages", "two-two", "no-micro-batches"])
def test_stages_equal_the_whole_stack(tmp_path: Path, stages: int, n: int) -> None:
    mp.start_processes(_stage, args=(stages, _free_port(), n, str(tmp_path)), nprocs=stages, start_method="spawn")
    got = [torch.load(tmp_path / f"{r}.pt", weights_only=True) for r in range(stages)]
    losses, outs, grads = reference(n)
    last = got[-1]
    assert len(last["losses"]) == len(last["outs"]) == n
    assert all(not g["losses"] and not g["outs"] for g in got[:-1])  # only the last stage holds outputs
    # Like with like: each stage runs the reference's layers on the same shapes, so the numbers repeat (0 apart
    # on CPU); the margins (~8 fp32 ulps at the tanh outputs' scale of 1, relative for losses and gradients)
    # only absorb a kernel difference between processes, far below a wrong micro-batch order.
    for a, b in zip(last["outs"], outs, strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    for a, b in zip(last["losses"], losses, strict=True):
        assert torch.allclose(a, b, rtol=1e-6)
    mine = [g for r in got for g in r["grads"]]
    assert len(mine) == len(grads)
    for a, b in zip(mine, grads, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)
    assert all(sorted(r["entered"]) == list(range(n)) for r in got)  # each backward ran in its context once
    assert n == 0 or any(g.abs().sum() > 0 for g in mine)


def test_a_wrong_activation_shape_names_the_micro_batch() -> None:
    first = Stage(rank=0, size=2, prev=None, next=1)
    with pytest.raises(RuntimeError, match=r"activation of shape \(4, 8\) for micro-batch 0; the next stage "
                                           r"expects \(5, 8\)"):
        forward_only(first, 1, lambda i, h: torch.zeros(4, 8), shape=lambda i: (5, 8), dtype=torch.float32,
                     device=torch.device("cpu"))


def test_the_last_stage_must_return_a_scalar_loss() -> None:
    only = Stage(rank=0, size=1, prev=None, next=None)
    with pytest.raises(RuntimeError, match=r"must return a scalar loss; micro-batch 0 gave shape \(3,\)"):
        one_forward_one_backward(only, 1, lambda i, h: torch.ones(3, requires_grad=True), shape=lambda i: (3,),
                                 dtype=torch.float32, device=torch.device("cpu"))


def test_stage_neighbours_must_fit_its_place() -> None:
    with pytest.raises(ValueError, match="needs a previous stage exactly when it is not the first"):
        Stage(rank=1, size=2, prev=None, next=None)
    with pytest.raises(ValueError, match="stage 2 of a 2-stage pipeline"):
        Stage(rank=2, size=2, prev=1, next=None)
