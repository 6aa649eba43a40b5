"""Per-rank audit records of the trainer: what each optimizer step saw and what it did (``train.audit``).

Every trainer rank wraps its backend in ``AuditedBackend`` (rank 0 inside ``RankZeroBackend``, so the other ranks
record the same calls). Each ``train_step`` appends one JSON line to the rank's file (``audit/rank-<r>.jsonl`` of
the run directory):

* ``weight_version`` before the step, the optimizer's own step count before and after (AdamW's per-parameter
  ``step``, the counter the update itself advances: a scheduler could tick without the optimizer running);
* a fingerprint of this rank's parameter shards before and after: per tensor, the float64 sum and sum of squares.
  An fp32 update moves an element by at least one ulp, which changes these sums far above float64 rounding, so
  "changed" is exact in practice, and taking them costs two reductions per tensor instead of a copy of the model;
* whether any advantage in the step's tensors is non-zero (every rank receives the whole step);
* on rank 0 only, the trained tokens as the loss reads them: per rollout, each run of positions whose loss mask is
  set, with its token ids and rollout logprobs, and the rollout's distinct advantage values.

``compose.sessions.audit`` checks these records against the engine's served-token log and the run's events. The file is
opened on the first step, not before: rank 0 creates the run directory, and a follower must not create it first.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

import torch

from lego_rl.train.backend import LossFn, StepResult
from lego_rl.train.batching import MicroBatch, OptimizerStep
from lego_rl.train.distributed import RankedBackend


class AuditableBackend(RankedBackend, Protocol):
    """What the recorder needs of a backend beyond the contract and its rank: its parameter shards, its optimizer."""

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps taken, as the optimizer counts them (AdamW's ``step`` state)."""
        ...

    def local_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """This rank's shard of every trained parameter, by name."""
        ...


def adam_steps(optimizer: torch.optim.Optimizer) -> int:
    """The largest per-parameter ``step`` in an Adam-family optimizer's state (0 before its first step)."""
    steps = [float(st["step"]) for st in optimizer.state.values() if "step" in st]
    return int(max(steps)) if steps else 0


FINGERPRINT_CHUNK = 1 << 22
"""Elements converted to float64 at a time (32 MB). Converting a whole tensor, then squaring it, held two float64
copies of the largest one (an embedding: 4× its fp32 size, 2.4 GB for a 151,936 × 1,024 table) on a device
that training has already filled."""


def fingerprint(params: Iterator[tuple[str, torch.Tensor]]) -> dict[str, list[float]]:
    """Per parameter ``[sum, sum of squares]`` in float64 (see the module docstring), a chunk at a time."""
    names: list[str] = []
    sums: list[torch.Tensor] = []
    with torch.no_grad():
        for name, p in params:
            flat = p.detach().reshape(-1)  # [N] this rank's shard
            acc = torch.zeros(2, dtype=torch.float64, device=flat.device)  # [2]
            for a in range(0, flat.numel(), FINGERPRINT_CHUNK):
                x = flat[a:a + FINGERPRINT_CHUNK].double()  # [n]
                acc += torch.stack([x.sum(), torch.dot(x, x)])  # [2]
            names.append(name)
            sums.append(acc)  # [2]
    if not sums:
        return {}
    table = torch.stack(sums).cpu().tolist()  # [P, 2]; one device sync for all of them
    return dict(zip(names, table, strict=True))


def trained_tokens(step: OptimizerStep) -> list[dict[str, Any]]:
    """Per rollout of ``step``: the runs of loss-masked positions (token ids, rollout logprobs) and the
    distinct advantages over them, read from the packed tensors exactly as the loss reads them."""
    by_rollout: dict[str, dict[str, Any]] = {}
    for mb in step.micro_batches:
        ids = mb.input_ids.tolist()  # [T]
        mask = mb.loss_mask.bool().tolist()  # [T]
        lps = mb.rollout_logprobs.tolist()  # [T]
        adv = mb.advantages.tolist()  # [T]
        slots = mb.rollout_slots.tolist()  # [T]
        bounds = mb.cu_seqlens.tolist()  # [S + 1]
        for start, end in zip(bounds[:-1], bounds[1:], strict=True):
            pos = start
            while pos < end:
                if not mask[pos]:
                    pos += 1
                    continue
                run_end = pos
                while run_end < end and mask[run_end]:
                    run_end += 1
                rid = step.rollout_ids[slots[pos]]
                entry = by_rollout.setdefault(rid, {"rollout_id": rid, "runs": [], "advantages": []})
                entry["runs"].append({"token_ids": ids[pos:run_end], "logprobs": lps[pos:run_end]})
                for a in adv[pos:run_end]:
                    if a not in entry["advantages"]:
                        entry["advantages"].append(a)
                pos = run_end
    return list(by_rollout.values())


class AuditedBackend:
    """A backend that writes one audit record per ``train_step`` to ``path`` (every other call passes through)."""

    def __init__(self, inner: AuditableBackend, path: Path) -> None:
        self.inner = inner
        self.path = Path(path)
        self._file: IO[str] | None = None
        self._calls = 0

    @property
    def rank(self) -> int:
        return self.inner.rank

    @property
    def weight_version(self) -> int:
        return self.inner.weight_version

    def _write(self, row: dict[str, Any]) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Append: a resumed run adds to the first run's records, never replaces them.
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write(json.dumps(row, allow_nan=True) + "\n")
        self._file.flush()

    def compute_logprobs(self, micro_batches: Sequence[MicroBatch], *, temperature: float, top_p: float = 1.0,
                         top_k: int = -1) -> list[torch.Tensor]:
        return self.inner.compute_logprobs(micro_batches, temperature=temperature, top_p=top_p, top_k=top_k)

    def train_step(self, step: OptimizerStep, loss_fn: LossFn, *, old_logprobs: Sequence[torch.Tensor],
                   temperature: float, top_p: float = 1.0, top_k: int = -1) -> StepResult:
        version = self.inner.weight_version
        steps_before = self.inner.optimizer_steps
        before = fingerprint(self.inner.local_parameters())
        nonzero = any(bool((mb.advantages != 0).any()) for mb in step.micro_batches)
        tokens = trained_tokens(step) if self.inner.rank == 0 else None
        result = self.inner.train_step(step, loss_fn, old_logprobs=old_logprobs, temperature=temperature,
                                       top_p=top_p, top_k=top_k)
        after = fingerprint(self.inner.local_parameters())
        changed = sorted(n for n in before if before[n] != after.get(n))
        self._calls += 1
        self._write({
            "call": self._calls, "rank": self.inner.rank, "weight_version": version,
            "weight_version_after": self.inner.weight_version, "optimizer_steps_before": steps_before,
            "optimizer_steps_after": self.inner.optimizer_steps, "parameters": len(before),
            "parameters_changed": len(changed), "nonzero_advantage": nonzero,
            "rollout_ids": list(step.rollout_ids), "loss": result.metrics.get("loss"),
            "sequence_tokens": sum(mb.num_tokens for mb in step.micro_batches),
            "tokens": tokens,
        })
        return result

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self.inner.export_weights()

    def save_checkpoint(self, path: Path, *, extra_state: dict[str, Any]) -> None:
        self.inner.save_checkpoint(path, extra_state=extra_state)

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        return self.inner.load_checkpoint(path)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
