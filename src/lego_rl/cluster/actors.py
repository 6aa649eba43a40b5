"""Ray cluster mode (``cluster.mode = "ray"``): trainer ranks and engine replicas as Ray actors across nodes.

``lego train`` keeps running the same ``TrainLoop`` in its own process (the driver: rollouts, the adapter, the
run directory); what moves onto the cluster are the two heavy pieces, placed by two placement groups that
``config.placement.placement_plan`` derives from ``cluster.*``:

* **Trainer ranks** (``TrainerRank``): one actor per rank, each a plain ``TorchBackend`` (or ``MegatronBackend``
  with ``train.backend = "megatron"``: TP × DP over the ranks) in one process group
  (gloo on CPU, NCCL on GPU) whose rendezvous is rank 0's node address. The driver holds a
  ``RayTrainerBackend``, a ``TrainerBackend`` that sends every call to every rank (each call is a collective:
  all ranks must make it, in the same order) and returns rank 0's result (logprobs are all-gathered, metrics
  reduced: rank 0 has the whole answer). The other ranks return nothing, so nothing large travels back twice.
* **Engine replicas** (``EngineReplica``): one actor per replica, each the embedded engine behind its
  vLLM-shaped HTTP routes, bound to its node's address. The driver's ``ServingClient`` and adapter reach them
  like any vLLM URLs (``compose.ray_run.serving_on_replicas``), with the usual sticky routing of sessions to
  replicas.
* **Weight sync** (``RayWeightSync``): every rank exports (the FSDP all-gathers are collectives); rank 0's full
  tensors become one object in Ray's object store on rank 0's node, and each replica pulls it to its own node
  and copies it in place with ``EmbeddedWeightSync`` (same pause / drain / resume semantics as one process).
  The tensors never pass through the driver. One copy per engine node crosses the network per sync: fine for
  the models the embedded engine serves; a GPU cluster with vLLM would broadcast over NCCL instead.

Checkpoints are written by the ranks themselves (rank 0 the model, every rank its optimizer shard), so
``paths.run_root`` must be on a filesystem every trainer node sees at the same path (the reference example's
shared ``DATA_ROOT``); the same holds for the model checkpoint and the Python environment (Ray starts the actors
with the interpreter ``ray start`` ran under). docs/cluster.md has the launch recipe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
import torch
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from lego_rl.config.placement import GroupPlan, PlacementPlan, key_for, shortfalls
from lego_rl.config.remote import ray_head_unreachable
from lego_rl.config.schema import ClusterConfig
from lego_rl.errors import ConfigError, LegoError
from lego_rl.driver.loop import TrainingError
from lego_rl.cluster.ray_nodes import RayNodes, start_ray_nodes
from lego_rl.driver.weight_sync import EmbeddedWeightSync, InFlight, SyncReport, WeightSource, WeightSync
from lego_rl.train.backend import LossFn, StepResult
from lego_rl.train.batching import MicroBatch, OptimizerStep

if TYPE_CHECKING:
    from lego_rl.serving.server import EmbeddedServer
    from lego_rl.train.audit import AuditableBackend
    from lego_rl.train.distributed import RankedBackend
    from lego_rl.train.megatron_backend import MegatronTrainSettings
    from lego_rl.train.torch_backend import TorchTrainSettings

JOIN_TIMEOUT_S = 60.0
"""How long a node whose ``ray start`` finished may take to show as alive to the driver."""
log = logging.getLogger(__name__)

PLACEMENT_TIMEOUT_S = 600.0
"""How long the placement groups may wait for their resources (nodes joining, other jobs releasing them)."""

Named = list[tuple[str, torch.Tensor]]


def connect(cl: ClusterConfig, started_at: str | None = None) -> bool:
    """Join (or start) the Ray cluster ``cluster.*`` names; True when this call connected (or started Ray in
    this process), so that the caller disconnects at the end.

    ``started_at``: the head address of the cluster ``ray_nodes.start_ray_nodes`` started on the training nodes.
    Else ``cluster.ray_address`` set: join it. Unset: ``cluster.start_ray`` starts a one-node head here (the
    trainer and the engines on this machine, placed like on a cluster); ``start_ray = false`` joins the cluster
    that ``ray start`` made on this node (or ``$RAY_ADDRESS``). Worker output stays in Ray's logs: ``lego
    train``'s stdout is the JSON summary's.
    """
    if ray.is_initialized():
        return False
    kw: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.ERROR}
    head = started_at or cl.ray_address
    key = "cluster.train_head" if started_at else "cluster.ray_address"
    if head:
        address = head
        dead = ray_head_unreachable(address, timeout=10.0)  # ray.init would retry a dead address for minutes
        if dead is not None:
            fix = ("its head stopped answering; its `ray start` output is in Ray's logs on the node" if started_at
                   else "start it with `ray start --head` or fix the address")
            raise ConfigError(f"cannot join the Ray cluster at {address!r}: {dead}; {fix}", parameter=key,
                              value=address)
    elif cl.start_ray:
        address, key = "local", "cluster.start_ray"
        kw["include_dashboard"] = False
    else:
        address, key = "auto", "cluster.start_ray"
    try:
        ray.init(address=address, **kw)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        value = {"cluster.ray_address": cl.ray_address, "cluster.train_head": cl.train_head}.get(key, cl.start_ray)
        raise ConfigError(f"cannot join the Ray cluster at {address!r}: {exc}", parameter=key, value=value) from None
    return True


def wait_joined(nodes: RayNodes, timeout: float = JOIN_TIMEOUT_S) -> None:
    """Until every node ``lego train`` started is alive in the connected cluster; a timeout names the missing."""
    deadline = time.monotonic() + timeout
    while True:
        nodes.check()
        alive = {n.get("NodeManagerAddress") for n in ray.nodes() if n.get("Alive")}
        missing = [what for ip, what in nodes.expected.items() if ip not in alive]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise TrainingError(f"{', '.join(missing)}: not alive in the Ray cluster at {nodes.address} "
                                f"{timeout:g} s after its `ray start` reported it started; `ray status --address "
                                f"{nodes.address}` shows the nodes")
        time.sleep(0.5)


def alive_node_resources() -> list[dict[str, float]]:
    """Total resources of every alive node of the connected cluster."""
    return [{k: float(v) for k, v in n["Resources"].items()} for n in ray.nodes() if n.get("Alive")]


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class TrainerRank:
    """One trainer rank on a Ray node: a ``TorchBackend`` (FSDP2) or a ``MegatronBackend`` (TP × DP) in a process
    group of ``world`` ranks, chosen by the settings it is handed."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self.backend: RankedBackend | None = None

    def address(self) -> tuple[str, int]:
        """This node's address and a free port on it: rank 0's answer is every rank's rendezvous."""
        host = ray.util.get_node_ip_address()
        return host, _free_port(host)

    def setup(self, master: tuple[str, int], model_dir: str, settings: TorchTrainSettings | MegatronTrainSettings,
              audit: str | None = None) -> int:
        """Join the process group and load the model (sharded by FSDP2, or split by Megatron's TP/DP groups, when
        ``world`` > 1). ``audit``: the folder of ``train.audit``'s per-rank records."""
        import torch.distributed as dist

        from lego_rl.train.megatron_backend import MegatronTrainSettings

        if self.world > 1:
            gpu = torch.cuda.is_available() and settings.device != "cpu"
            host, port = master
            dist.init_process_group("nccl" if gpu else "gloo", init_method=f"tcp://{host}:{port}",
                                    rank=self.rank, world_size=self.world)
        backend: AuditableBackend
        if isinstance(settings, MegatronTrainSettings):
            from lego_rl.train.megatron_backend import MegatronBackend, require_megatron

            require_megatron()
            backend = MegatronBackend(Path(model_dir), settings)  # joins Megatron's groups in the one above
        else:
            from lego_rl.train.torch_backend import TorchBackend

            backend = TorchBackend(Path(model_dir), settings)
        if audit is not None:
            from lego_rl.train.audit import AuditedBackend

            self.backend = AuditedBackend(backend, Path(audit) / f"rank-{self.rank}.jsonl")
        else:
            self.backend = backend
        return self.backend.weight_version

    def weight_version(self) -> int:
        assert self.backend is not None, "setup() first"
        return self.backend.weight_version

    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Make one backend call; rank 0 returns its result, the others None (rank 0 holds the whole answer)."""
        assert self.backend is not None, "setup() first"
        if name == "export_weights":
            # Every rank walks the generator (each parameter's all-gather is a collective); rank 0 keeps copies
            # (the generator may hand out views of buffers it reuses).
            named: Named = []
            for n, t in self.backend.export_weights():
                if self.rank == 0:
                    named.append((n, t.detach().to("cpu").clone()))
            return named if self.rank == 0 else None
        result = getattr(self.backend, name)(*args, **kwargs)
        return result if self.rank == 0 else None


class _Exported:
    """A ``WeightSource`` over tensors already exported (what an engine replica receives)."""

    def __init__(self, named: Named, version: int) -> None:
        self.named, self.version = named, version

    @property
    def weight_version(self) -> int:
        return self.version

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.named)


class EngineReplica:
    """One embedded engine on a Ray node, serving its HTTP routes on the node's address (an async actor)."""

    def __init__(self) -> None:
        self.server: EmbeddedServer | None = None

    async def start(self, model_dir: str, engine_kw: dict[str, Any]) -> str:
        from lego_rl.serving.server import EmbeddedServer

        self.server = EmbeddedServer(model_dir, host=ray.util.get_node_ip_address(), port=0, **engine_kw)
        return await self.server.start()

    async def load_weights(self, named: Named, version: int, in_flight: InFlight) -> dict[str, Any]:
        """Copy ``named`` into the engine in place (``EmbeddedWeightSync``: pause, drain or freeze, copy, resume)."""
        assert self.server is not None and self.server.engine is not None, "start() first"
        report = await EmbeddedWeightSync(self.server.engine, in_flight=in_flight).push(_Exported(named, version))
        return report.model_dump()

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop()


def _unwrap(exc: BaseException, what: str) -> BaseException:
    """A lego error raised inside an actor comes back as itself; anything else (a dead node, an actor killed by
    the OOM killer, a bug) as a ``TrainingError`` naming the piece."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, LegoError):
        return cause
    return TrainingError(f"{what} failed on the Ray cluster: {type(exc).__name__}: {exc}"[:2000])


class RayTrainerBackend:
    """The driver's ``TrainerBackend``: every call goes to every rank actor; rank 0's result is the answer."""

    def __init__(self, ranks: Sequence[Any], version: int) -> None:
        self.ranks = list(ranks)
        self._version = version
        """Rank 0's weight version, kept here: the loop reads it often, and after the actors are gone."""

    def _all(self, name: str, *args: Any, **kwargs: Any) -> Any:
        refs = [r.call.remote(name, args, kwargs) for r in self.ranks]
        try:
            return ray.get(refs)[0]
        except ray.exceptions.RayError as exc:
            raise _unwrap(exc, f"trainer call {name}") from exc

    @property
    def weight_version(self) -> int:
        return self._version

    def compute_logprobs(self, micro_batches: Sequence[MicroBatch], *, temperature: float, top_p: float = 1.0,
                         top_k: int = -1) -> list[torch.Tensor]:
        out: list[torch.Tensor] = self._all("compute_logprobs", list(micro_batches), temperature=temperature,
                                            top_p=top_p, top_k=top_k)
        return out

    def train_step(self, step: OptimizerStep, loss_fn: LossFn, *, old_logprobs: Sequence[torch.Tensor],
                   temperature: float, top_p: float = 1.0, top_k: int = -1) -> StepResult:
        out: StepResult = self._all("train_step", step, loss_fn, old_logprobs=list(old_logprobs),
                                    temperature=temperature, top_p=top_p, top_k=top_k)
        self._version = out.weight_version
        return out

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        named: Named = self._all("export_weights")
        return iter(named)

    def export_refs(self) -> tuple[Any, list[Any]]:
        """Start an export on every rank: rank 0's object reference (its full tensors, kept in the object store
        on its node) and the other ranks' (wait for them: their all-gathers are part of the same export)."""
        refs = [r.call.remote("export_weights", (), {}) for r in self.ranks]
        return refs[0], refs[1:]

    def save_checkpoint(self, path: Path, *, extra_state: dict[str, Any]) -> None:
        self._all("save_checkpoint", path, extra_state=extra_state)

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        out: dict[str, Any] = self._all("load_checkpoint", path)
        try:
            self._version = int(ray.get(self.ranks[0].weight_version.remote()))
        except ray.exceptions.RayError as exc:
            raise _unwrap(exc, "trainer rank 0") from exc
        return out


class RayWeightSync(WeightSync):
    """Trainer rank 0's exported tensors, through Ray's object store, copied in place into every engine replica."""

    def __init__(self, engines: Sequence[Any], *, in_flight: InFlight = "wait") -> None:
        self.engines = list(engines)
        self.in_flight = in_flight

    async def push(self, source: WeightSource) -> SyncReport:
        if not isinstance(source, RayTrainerBackend):
            raise TypeError(f"RayWeightSync syncs the Ray trainer ranks, got {type(source).__name__}")
        version = source.weight_version
        t0 = time.perf_counter()
        head, rest = source.export_refs()
        try:
            # Exported, not fetched here (the tensors stay on rank 0's node); the engines still sample meanwhile.
            refs = [head, *rest]
            await asyncio.to_thread(ray.wait, refs, num_returns=len(refs), fetch_local=False)
            await asyncio.gather(*rest)  # None each; raises what a rank raised
            t1 = time.perf_counter()
            reports = await asyncio.gather(*(e.load_weights.remote(head, version, self.in_flight)
                                             for e in self.engines))
        except ray.exceptions.RayError as exc:
            raise _unwrap(exc, f"weight sync to version {version}") from exc
        t2 = time.perf_counter()
        return SyncReport(version=version, seconds=t2 - t1, stage_seconds=t1 - t0,
                          drain_seconds=max(float(r["drain_seconds"]) for r in reports),
                          bytes=sum(int(r["bytes"]) for r in reports))


@dataclass
class RayCluster:
    """What ``lego train`` drives on the cluster."""

    backend: RayTrainerBackend
    engines: list[Any]
    """The ``EngineReplica`` actor handles."""
    urls: list[str]
    """The replicas' HTTP roots (``http://<node address>:<port>``)."""



def _strategy(pg: PlacementGroup, index: int) -> PlacementGroupSchedulingStrategy:
    return PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=index)


def _wait_placed(pgs: Sequence[tuple[GroupPlan, PlacementGroup]], timeout: float) -> None:
    for plan, pg in pgs:
        ready, _ = ray.wait([pg.ready()], timeout=timeout)
        if not ready:
            raise TrainingError(f"the {plan.name} placement group ({len(plan.bundles)} × {plan.bundles[0]}, "
                                f"{plan.strategy}) was not placed within {timeout:g} s: the resources exist "
                                "but are held by other work, or a node left; `ray status` shows what is used")


def _served(engine_kw: dict[str, Any], audit: str | None, replica: int) -> dict[str, Any]:
    return engine_kw if audit is None else {**engine_kw, "served_log": Path(audit) / f"engine-{replica}.jsonl"}


@dataclass(frozen=True)
class ReplicaOptions:
    """What every engine replica is started with (projected from ``model.*`` and ``serving.*`` by compose)."""

    dtype: str
    """The served dtype; ``auto`` is resolved here by device (bf16 on a GPU, fp32 on a CPU)."""
    max_batch: int
    max_model_len: int


@contextlib.asynccontextmanager
async def ray_cluster(cl: ClusterConfig, plan: PlacementPlan, model_dir: Path, *,
                      settings: TorchTrainSettings | MegatronTrainSettings, replicas: ReplicaOptions,
                      audit: Path | None) -> AsyncIterator[RayCluster]:
    """Place and start the trainer ranks and the engine replicas; on exit stop them and release the groups.

    With ``cluster.start_ray`` and ``cluster.train_head`` the Ray cluster itself is started first, on the training
    nodes (``ray_nodes``), joined once every node is alive in it, and stopped last.

    A placement the cluster cannot hold at all is refused before anything starts (a ``ConfigError`` naming the
    missing resource, the same finding as ``lego validate --remote``). ``plan``: ``config.placement.placement_plan``
    of the run; ``audit``: the run's audit directory when ``train.audit`` is on (every rank and replica writes
    its records there: a filesystem all nodes share, see the module docstring).
    """
    nodes: RayNodes | None = None
    started = False
    groups: list[PlacementGroup] = []
    actors: list[Any] = []
    engines: list[Any] = []
    try:
        if cl.start_ray and cl.train_head and not cl.ray_address:  # Ray on the training nodes, over SSH
            nodes = await asyncio.to_thread(start_ray_nodes, cl)
        started = connect(cl, started_at=nodes.address if nodes is not None else None)
        if nodes is not None:
            await asyncio.to_thread(wait_joined, nodes)
        missing = shortfalls(plan, alive_node_resources())
        if missing:
            raise ConfigError("the Ray cluster cannot hold the placement: " + "; ".join(why for _, why in missing)
                              + " (`lego validate --remote` checks this before a launch)",
                              parameter=key_for(missing[0][0], cl))
        placed = []
        for g in plan.groups:
            pg = placement_group(g.bundles, strategy=g.strategy, name=f"lego-{g.name}-{os.getpid()}")
            groups.append(pg)
            placed.append((g, pg))
        await asyncio.to_thread(_wait_placed, placed, PLACEMENT_TIMEOUT_S)
        pg_trainer, pg_engine = groups
        env = {"LOCAL_RANK": "0"}  # Ray shows each GPU actor only its own device
        if cl.gloo_socket_ifname:
            env["GLOO_SOCKET_IFNAME"] = cl.gloo_socket_ifname
            env["NCCL_SOCKET_IFNAME"] = cl.gloo_socket_ifname
        world = len(plan.trainer.bundles)
        rank_cls = ray.remote(TrainerRank)
        for i, bundle in enumerate(plan.trainer.bundles):
            actors.append(rank_cls.options(  # type: ignore[attr-defined]
                num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0), scheduling_strategy=_strategy(pg_trainer, i),
                runtime_env={"env_vars": env}, name=f"lego-trainer-{i}-{os.getpid()}").remote(i, world))
        ranks = list(actors)
        engine_cls = ray.remote(EngineReplica)
        for i, bundle in enumerate(plan.engine.bundles):
            engines.append(engine_cls.options(  # type: ignore[attr-defined]
                num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0), scheduling_strategy=_strategy(pg_engine, i),
                name=f"lego-engine-{i}-{os.getpid()}").remote())
        actors.extend(engines)
        gpu = cl.gpus_per_engine > 0
        dtype = replicas.dtype if replicas.dtype != "auto" else ("bfloat16" if gpu else "float32")
        engine_kw: dict[str, Any] = {"device": "cuda" if gpu else "cpu", "dtype": dtype,
                                     "max_batch": replicas.max_batch, "max_model_len": replicas.max_model_len}
        audit_dir = str(audit) if audit is not None else None
        try:
            master = await ranks[0].address.remote()
            # The engines load while the ranks rendezvous and load: both are slow, neither needs the other.
            urls: list[str]
            versions: list[int]
            urls, versions = await asyncio.gather(
                asyncio.gather(*(e.start.remote(str(model_dir), _served(engine_kw, audit_dir, i))
                                 for i, e in enumerate(engines))),
                asyncio.gather(*(r.setup.remote(master, str(model_dir), settings, audit_dir) for r in ranks)))
        except ray.exceptions.RayError as exc:
            raise _unwrap(exc, "starting the trainer ranks and engine replicas") from exc
        yield RayCluster(backend=RayTrainerBackend(ranks, versions[0]), engines=engines, urls=list(urls))
    finally:
        for e in engines:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.wrap_future(e.stop.remote().future()), 30)
        for a in actors:
            with contextlib.suppress(Exception):
                ray.kill(a)
        for pg in groups:
            with contextlib.suppress(Exception):
                remove_placement_group(pg)
        if started:
            ray.shutdown()
        if nodes is not None:  # after the driver left: nothing of this run is on the nodes any more
            problems = await asyncio.to_thread(nodes.stop)
            if problems:
                log.warning("stopping Ray on the training nodes: %s", "; ".join(problems))
