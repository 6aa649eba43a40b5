"""R3 (rollout routing replay), trainer side: the experts the engine chose at rollout, forced in training.

A mixture-of-experts policy recomputed by the trainer can send a token to other experts than the engine
did (bf16 vs fp32, batched vs packed kernels: a near tie in the router flips), and then its logprob is not
the rollout's even on identical weights. With ``rollout.use_rollout_routing_replay`` the engine returns the
experts of every forwarded token, they travel with the ``Sample`` (output routes per token, one prompt
snapshot per turn), and here the trainer's routers are made to pick exactly those experts. The routing
*weights* still come from the trainer's router logits (softmax over all experts, gathered at the replayed
ids, renormalised when the model does), so the router keeps its gradient.

One route per position, in one forward: a token gets the route of the forward that first computed it at
rollout. Its own output route when it was sampled and then forwarded; otherwise the earliest turn whose
prompt snapshot covers it (the engine prefills each turn's whole prompt when it records routing, so the
turn that first saw a piece of context routed it for that turn's output). A later turn may have routed the
same prefix differently; one forward cannot hold both, and the earliest is the one under which the tokens
that depend on it first were sampled. The last id of a turn's output was never forwarded; the next turn's
snapshot covers it, and the last id of a sequence predicts nothing, so its route does not matter.

Refused, never trained silently: a snapshot of another rollout or group, routes of inconsistent shape,
repeated or negative expert ids (``sample_routes``); a layer count, top-k or expert id the model does not
have, and a trained token whose prefix has a position without a route (``RouteReplay.check``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lego_rl.errors import TrajectoryError
from lego_rl.trajectory.sample import Sample

if TYPE_CHECKING:  # batching imports this module (micro_batch_routes)
    from lego_rl.train.batching import MicroBatch


def _where(sample: Sample) -> str:
    return f"rollout {sample.rollout_id!r} segment {sample.segment}"


def _shape_of(routes: Sequence[Sequence[Sequence[int]]]) -> tuple[int, int] | None:
    for r in routes:
        if r:
            return len(r), len(r[0])
    return None


ROUTE_DTYPE = torch.int16
"""Expert ids are stored as int16 (MoE models have at most a few hundred experts): a 64k-token sample of a
48-layer top-8 model is 48 MiB of routes instead of 192 MiB in int64; the replay widens one layer at a time."""


def sample_routes(sample: Sample) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``([n, L, K] int16 experts, [n] bool valid)`` for ``sample.tokens``, or None when the sample carries
    no routing at all. Positions no route covers are invalid (their experts row is 0 and is not replayed)."""
    out_routes = sample.routed_experts
    snaps = sorted(sample.prompt_routing, key=lambda s: s.turn)
    if out_routes is None and not snaps:
        return None
    for snap in snaps:
        if (snap.rollout_id, snap.group_index) != (sample.rollout_id, sample.group_index):
            raise TrajectoryError(
                f"{_where(sample)}: prompt routing of turn {snap.turn} belongs to rollout {snap.rollout_id!r} "
                f"group {snap.group_index}, not to this sample's group {sample.group_index}: routes replayed "
                "on other tokens than they were recorded for")
    shape = _shape_of(out_routes or []) or next((s for s in (_shape_of(p.routes) for p in snaps) if s), None)
    if shape is None:
        return None
    layers, k = shape
    n = len(sample.tokens)
    experts = torch.zeros(n, layers, k, dtype=ROUTE_DTYPE)  # [n, L, K]
    valid = torch.zeros(n, dtype=torch.bool)  # [n]
    covered = 0
    for snap in snaps:  # earliest turn first: each only fills what no earlier snapshot covered
        if snap.prompt_len > covered:
            part = snap.routes[covered:snap.prompt_len]
            experts[covered:snap.prompt_len] = _as_tensor(part, layers, k, sample, f"turn {snap.turn} prompt "
                                                          f"routing, position {covered}+")  # [p, L, K]
            valid[covered:snap.prompt_len] = True
            covered = snap.prompt_len
    if out_routes is not None:
        rows = [i for i, r in enumerate(out_routes) if r]
        if rows:
            idx = torch.tensor(rows, dtype=torch.long)  # [m]
            experts[idx] = _as_tensor([out_routes[i] for i in rows], layers, k, sample,
                                      "output routes")  # [m, L, K]
            valid[idx] = True
    negative = valid & (experts < 0).flatten(1).any(1)  # [n]
    if bool(negative.any()):
        pos = int(negative.nonzero()[0, 0])
        raise TrajectoryError(f"{_where(sample)}: negative expert id in the route of position {pos}")
    repeated = valid & (experts.sort(-1).values.diff(dim=-1) == 0).flatten(1).any(1)  # [n]
    if bool(repeated.any()):
        pos = int(repeated.nonzero()[0, 0])
        raise TrajectoryError(f"{_where(sample)}: the route of position {pos} names one expert twice in a layer "
                              f"({experts[pos].tolist()}): not a top-{k} choice")
    return experts, valid


def _as_tensor(routes: Sequence[Sequence[Sequence[int]]], layers: int, k: int, sample: Sample,
               what: str) -> torch.Tensor:
    """``[p, L, K]`` from nested lists; a ragged or differently shaped route is refused with its position."""
    try:
        t = torch.from_numpy(np.array(routes, dtype=np.int16))  # [p, L, K] (numpy: ~2x faster from lists)
    except OverflowError as exc:
        raise TrajectoryError(f"{_where(sample)}: {what}: an expert id is out of range ({exc})") from None
    except (ValueError, TypeError) as exc:
        raise TrajectoryError(f"{_where(sample)}: {what}: routes are ragged or not integers ({exc})") from None
    if t.dim() != 3 or tuple(t.shape[1:]) != (layers, k):
        raise TrajectoryError(f"{_where(sample)}: {what}: routes have shape {tuple(t.shape)}, the sample's other "
                              f"routes are [*, {layers} layers, top-{k}]")
    return t


def micro_batch_routes(members: Sequence[Sample]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The members' routes concatenated: ``([T, L, K], [T] valid)``, or None when no member has any. A member
    without routing contributes invalid rows (``RouteReplay.check`` refuses it when replay is on)."""
    parts = [sample_routes(s) for s in members]
    shapes = {tuple(p[0].shape[1:]) for p in parts if p is not None}
    if not shapes:
        return None
    if len(shapes) > 1:
        raise TrajectoryError(f"samples packed together carry routes of different shapes {sorted(shapes)} "
                              "([layers, top-k]): they come from different models")
    layers, k = next(iter(shapes))
    experts, valid = [], []
    for s, p in zip(members, parts, strict=True):
        if p is None:
            experts.append(torch.zeros(len(s.tokens), layers, k, dtype=ROUTE_DTYPE))  # [n, L, K]
            valid.append(torch.zeros(len(s.tokens), dtype=torch.bool))  # [n]
        else:
            experts.append(p[0])
            valid.append(p[1])
    return torch.cat(experts), torch.cat(valid)  # [T, L, K], [T]


def check_routes(mb: MicroBatch, *, layers: int, k: int, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``mb``'s ``(routed_experts [T, L, K], routes_valid [T])`` when a model of ``layers`` MoE layers, top-``k``
    over ``num_experts`` can replay them; else a ``ValueError`` naming what does not fit. Refused too: a trained
    token whose prefix has a position without a route (its logprob would mix replayed and free routing)."""
    if mb.routed_experts is None or mb.routes_valid is None:
        raise ValueError(f"routing replay is on (rollout.use_rollout_routing_replay) but input samples "
                         f"{mb.sample_indices} carry no routed experts")
    experts, valid = mb.routed_experts, mb.routes_valid
    if tuple(experts.shape[1:]) != (layers, k):
        raise ValueError(f"the replayed routes are [{experts.shape[1]} layers, top-{experts.shape[2]}] but the "
                         f"model has {layers} MoE layers with top-{k}: routes of another model")
    top = int(experts[valid].max()) if bool(valid.any()) else -1
    if top >= num_experts:
        raise ValueError(f"a replayed route names expert {top} but the model has {num_experts} experts")
    bounds = mb.cu_seqlens.tolist()
    for s, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        trained = mb.loss_mask[a:b].nonzero()
        if not trained.numel():
            continue
        last = int(trained[-1, 0])  # its logprob depends on the routes of positions [0, last)
        gaps = (~valid[a:a + last]).nonzero()
        if gaps.numel():
            raise ValueError(
                f"routing replay is on but input sample {mb.sample_indices[s]} has no route at position "
                f"{int(gaps[0, 0])}, before its trained token at {last} (the rollout lost its routing; "
                "it cannot be replayed, and training it unreplayed would defeat R3)")
    return experts, valid


class RouteReplay:
    """Forward hooks on every router (``*.mlp.gate``) of a Hugging Face MoE model that, while ``set``, replace
    its top-k choice with the replayed experts (rows marked valid) and recompute the routing weights.

    The routers must return ``(logits, weights, indices)`` and carry ``top_k``, ``num_experts`` and
    ``norm_topk_prob`` (transformers >= 5's Qwen3-MoE / Qwen2-MoE / Mixtral routers): one that returns only
    logits is refused at construction, since there would be no choice to replace.
    """

    def __init__(self, model: Any) -> None:
        routers = [m for name, m in model.named_modules() if name.endswith("mlp.gate")]
        if not routers:
            raise ValueError("routing replay needs a mixture-of-experts model: no router modules (*.mlp.gate)")
        for r in routers:
            if not all(hasattr(r, a) for a in ("top_k", "num_experts", "norm_topk_prob")):
                raise ValueError(f"router {type(r).__name__} does not expose top_k, num_experts and norm_topk_prob "
                                 "(a transformers < 5 router returns only logits): its choice cannot be replayed")
        self.layers = len(routers)
        self.k = int(routers[0].top_k)
        self.num_experts = int(routers[0].num_experts)
        self._experts: torch.Tensor | None = None  # [T, L, K] on the model's device while set
        self._valid: torch.Tensor | None = None  # [T]
        for layer, router in enumerate(routers):
            router.register_forward_hook(self._hook(layer))

    def check(self, mb: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """``mb``'s routes (``[T, L, K]``, ``[T]``) once ``check_routes`` accepts them for this model."""
        return check_routes(mb, layers=self.layers, k=self.k, num_experts=self.num_experts)

    def set(self, experts: torch.Tensor, valid: torch.Tensor) -> None:
        """Replay ``experts`` ``[T, L, K]`` at rows where ``valid`` ``[T]`` holds, until ``clear``. Kept through
        backward: activation checkpointing re-runs the routers there and must route the same way."""
        self._experts, self._valid = experts, valid

    def clear(self) -> None:
        self._experts = self._valid = None

    def _hook(self, layer: int) -> Any:
        def replace(module: Any, _inputs: Any, output: Any) -> Any:
            if self._experts is None or self._valid is None:
                return None
            logits, _, own = output  # [N, E], [N, K], [N, K]
            if logits.shape[0] != self._experts.shape[0]:
                raise RuntimeError(f"router of layer {layer} saw {logits.shape[0]} tokens, the replayed routes "
                                   f"cover {self._experts.shape[0]}")
            chosen = torch.where(self._valid[:, None], self._experts[:, layer].long(), own)  # [N, K]
            probs = torch.softmax(logits, dim=-1, dtype=torch.float32)  # [N, E]
            weights = probs.gather(1, chosen)  # [N, K] the trainer's own weights for the replayed experts
            if module.norm_topk_prob:
                weights = weights / weights.sum(dim=-1, keepdim=True)  # [N, K]
            return logits, weights.to(logits.dtype), chosen
        return replace
