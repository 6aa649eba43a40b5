"""What a Ray cluster run needs: the placement groups of ``cluster.*``, and how a cluster's nodes fall short.

One projection of the ``cluster.*`` keys, read by both sides: ``cluster.actors`` creates these placement
groups, and ``lego validate --remote`` compares them with the resources of the running cluster before anything
is started. Pure data: no Ray import here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from lego_rl.config.resolve import trainer_devices
from lego_rl.config.schema import ClusterConfig, LegoConfig, RayPlacement

Bundle = dict[str, float]
"""One placement bundle: Ray resource name → amount (``CPU``, ``GPU``, custom resources)."""


class GroupPlan(BaseModel):
    """One placement group: a bundle per actor, and how the bundles spread over nodes."""

    model_config = ConfigDict(frozen=True)

    name: str
    """``trainer`` or ``engine`` (findings name it)."""
    bundles: list[Bundle]
    strategy: RayPlacement


class PlacementPlan(BaseModel):
    """The trainer ranks' group and the engine replicas' group of a ``cluster.mode = "ray"`` run."""

    model_config = ConfigDict(frozen=True)

    trainer: GroupPlan
    engine: GroupPlan

    @property
    def groups(self) -> tuple[GroupPlan, GroupPlan]:
        return self.trainer, self.engine


def _bundle(cpus: float, gpus: int, custom: Mapping[str, float]) -> Bundle:
    out: Bundle = {"CPU": cpus}
    if gpus:
        out["GPU"] = float(gpus)
    out.update(custom)
    return out


def placement_plan(c: LegoConfig) -> PlacementPlan:
    """The placement ``cluster.*`` asks for: one trainer bundle per rank (``trainer_devices``: a GPU each, or one
    CPU rank per trainer node) and one engine bundle per ``cluster.engine_replicas``."""
    cl = c.cluster
    ranks = trainer_devices(c)
    gpu = 1 if cl.gpus_per_node else 0
    trainer = GroupPlan(name="trainer", strategy=cl.trainer_placement,
                        bundles=[_bundle(cl.cpus_per_actor, gpu, cl.trainer_resources) for _ in range(ranks)])
    engine = GroupPlan(name="engine", strategy=cl.engine_placement,
                       bundles=[_bundle(cl.cpus_per_actor, cl.gpus_per_engine, cl.engine_resources)
                                for _ in range(cl.engine_replicas)])
    return PlacementPlan(trainer=trainer, engine=engine)


def _fmt(x: float) -> str:
    return f"{x:g}"


def shortfalls(plan: PlacementPlan, nodes: Sequence[Mapping[str, float]]) -> list[tuple[str, str]]:
    """``(resource, why)`` for every way ``nodes`` (each alive node's total resources) cannot hold ``plan``.

    Checked: the sum of each resource over both groups against the cluster's; every bundle against the largest
    node (a bundle never spans nodes); STRICT_SPREAD's one node per bundle; STRICT_PACK's one node for the whole
    group. Ray's scheduler decides the rest (a feasible total may still fragment badly); this catches what no
    scheduling can fix, naming the resource.
    """
    out: list[tuple[str, str]] = []
    need: dict[str, float] = {}
    for group in plan.groups:
        for bundle in group.bundles:
            for res, amount in bundle.items():
                need[res] = need.get(res, 0.0) + amount
    for res, amount in sorted(need.items()):
        have = sum(float(n.get(res, 0.0)) for n in nodes)
        if have < amount:
            users = " + ".join(f"{g.name} {_fmt(sum(b.get(res, 0.0) for b in g.bundles))}" for g in plan.groups
                               if any(res in b for b in g.bundles))
            out.append((res, f"{res}: the placement needs {_fmt(amount)} ({users}), the cluster has {_fmt(have)} "
                             f"over {len(nodes)} node(s)"))
    short = {res for res, _ in out}  # a resource short in total is named once, by the total
    for group in plan.groups:
        if not group.bundles:
            continue
        bundle = group.bundles[0]  # a group's bundles are all alike
        for res, amount in sorted(bundle.items()):
            biggest = max((float(n.get(res, 0.0)) for n in nodes), default=0.0)
            if res not in short and biggest < amount:
                short.add(res)
                out.append((res, f"{res}: one {group.name} bundle needs {_fmt(amount)} on one node, the largest "
                                 f"node has {_fmt(biggest)}"))
        if group.strategy == "STRICT_SPREAD":
            fitting = sum(1 for n in nodes if all(float(n.get(r, 0.0)) >= a for r, a in bundle.items()))
            res = next((r for r, a in bundle.items()
                        if sum(1 for n in nodes if float(n.get(r, 0.0)) >= a) < len(group.bundles)), "nodes")
            if fitting < len(group.bundles) and res not in short:
                out.append((res, f"{res}: {group.name} placement STRICT_SPREAD needs {len(group.bundles)} nodes "
                                 f"that each hold a bundle {bundle}, the cluster has {fitting}"))
        if group.strategy == "STRICT_PACK":
            total = {r: a * len(group.bundles) for r, a in bundle.items()}
            if not any(all(float(n.get(r, 0.0)) >= a for r, a in total.items()) for n in nodes):
                res = next((r for r, a in total.items() if max((float(n.get(r, 0.0)) for n in nodes), default=0.0)
                            < a), "nodes")
                if res not in short:
                    out.append((res, f"{res}: {group.name} placement STRICT_PACK needs {total} on one node, no "
                                     "node has that"))
    return out


def key_for(resource: str, cl: ClusterConfig) -> str:
    """The ``cluster.*`` key that asks for ``resource`` (what a finding about it names)."""
    if resource in cl.trainer_resources:
        return "cluster.trainer_resources"
    if resource in cl.engine_resources:
        return "cluster.engine_resources"
    return {"GPU": "cluster.gpus_per_node", "CPU": "cluster.cpus_per_actor"}.get(resource, "cluster.trainer_nodes")
