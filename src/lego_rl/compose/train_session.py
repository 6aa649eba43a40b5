"""One training run from a resolved config: data, run directory, engines, trainer, loop. No printing.

``lego train`` is a thin view over this (progress on stderr, a JSON summary); tests and notebooks can
drive it without typer. Two kinds of rollouts, chosen by ``train.environment``:

* unset: coding-agent rollouts (``rollout.generate``: sandbox, CLI through the adapter, grader), rows
  from ``rollout.prompt_data`` as task rows, the harness named per row (``metadata.agent``);
* a registered environment: it samples from the engine and scores the text itself; rows are the
  environment's own JSON objects.

The trainer comes from ``BACKENDS[train.backend]``: a factory ``(config, model_dir) -> (backend, loss)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from lego_rl.config.dataset_scan import row_keys
from lego_rl.config.resolve import ResolvedConfig, config_json
from lego_rl.config.resume_keys import Change, changes_on_resume
from lego_rl.config.schema import LegoConfig
from lego_rl.errors import ConfigError, TaskDataError
from lego_rl.harness.toolchain import Toolchain
from lego_rl.images.importer import load_images_json
from lego_rl.driver.environments import EnvOutcome, Environment, Sampler, completion_sample, load_environment
from lego_rl.compose.harnesses import harness_factory
from lego_rl.compose.projection import loop_settings, metrics_sinks
from lego_rl.driver.loop import Prompt, RolloutFn, RolloutSlot, TrainingError, TrainLoop
from lego_rl.compose.rollout_check import settings_from_config
from lego_rl.compose.stack import Engines, model_dir, serving_engines, serving_stack
from lego_rl.driver.weight_sync import EmbeddedWeightSync, InFlight, RouteWeightSync, WeightSync
from lego_rl.rollout.generate import RolloutContext, RolloutResult, RolloutSpec, generate
from lego_rl.runstore import RolloutFiles, RunDir, RunLayout, latest_checkpoint
from lego_rl.runstore.env_rollouts import EnvCompletionRecord, EnvRolloutRecord, write_env_rollout
from lego_rl.runstore.events import (
    ArtifactNotSaved,
    ResumeOverride,
    RolloutFinished,
    RolloutStarted,
    ServingReady,
    TrainingFinished,
)
from lego_rl.serving.errors import EngineFailed, EngineUnavailable, InvalidReply
from lego_rl.swe.task_sandbox import RunProviders
from lego_rl.termination import TerminationReason, is_infrastructure_failure
from lego_rl.train.backend import LossFn, TrainerBackend
from lego_rl.train.losses import LossConfig, make_loss
from lego_rl.tasks.rows import load_tasks

if TYPE_CHECKING:
    from lego_rl.cluster.actors import RayCluster
    from lego_rl.train.audit import AuditableBackend
    from lego_rl.train.distributed import RankedBackend
    from lego_rl.train.megatron_backend import MegatronTrainSettings
    from lego_rl.train.torch_backend import TorchTrainSettings

BackendFactory = Callable[[LegoConfig, Path], tuple[TrainerBackend, LossFn]]
"""Builds the trainer for ``train.backend`` from the config and the policy's checkpoint directory."""

def loss_config(c: LegoConfig) -> LossConfig:
    """The policy objective from ``train.*`` (the one projection of those keys)."""
    t = c.train
    return LossConfig(algorithm=t.algorithm, clip_low=t.clip_low, clip_high=t.clip_high, dual_clip_c=t.dual_clip_c,
                      is_correction=t.is_correction, is_level=t.is_level, is_low=t.is_low, is_high=t.is_high,
                      kl_coef=t.kl_coef, use_score_centering=t.use_score_centering,
                      loss_agg=t.loss_agg)


def overridden_on_resume(r: ResolvedConfig, root: Path) -> list[Change]:
    """The keys shaping training that this resume changes because ``train.resume_override`` names them
    (any other change was refused by ``config.checks.resume_changes``). Call it before the run directory is
    opened: opening records the new launch's config, which is then the newest."""
    c = r.config
    if not c.train.resume or not c.train.resume_override:
        return []
    return [ch for ch in changes_on_resume(root, config_json(r)) if ch.key in c.train.resume_override]


def mark_overrides(run: RunDir, changes: list[Change], step: int) -> None:
    """One ``resume_override`` event per overridden key, naming the first step it applies to."""
    for ch in changes:
        run.events.emit(ResumeOverride(step=step, key=ch.key, before=ch.before, after=ch.after,
                                       recorded_in=ch.recorded_in))


def torch_settings(c: LegoConfig) -> TorchTrainSettings:
    """The torch backend's optimizer and memory settings from ``train.*``."""
    from lego_rl.train.torch_backend import TorchTrainSettings  # torch loads only when a run trains

    t = c.train
    return TorchTrainSettings(lr=t.lr, warmup_steps=t.warmup_steps, max_grad_norm=t.max_grad_norm,
                              weight_decay=t.weight_decay,
                              gradient_checkpointing=t.gradient_checkpointing is not False,  # unset: on
                              reference_model=t.kl_coef > 0, routing_replay=c.rollout.use_rollout_routing_replay,
                              precision=t.precision, packed_attention=t.packed_attention,
                              true_on_policy=t.true_on_policy)


def torch_backend(c: LegoConfig, model_dir: Path) -> tuple[TrainerBackend, LossFn]:
    # Imported here: torch and transformers load only when a run actually trains.
    from lego_rl.train.torch_backend import TorchBackend

    backend = TorchBackend(model_dir, torch_settings(c))
    return _rank_zero(c, backend, world=backend.world), make_loss(loss_config(c))


def audit_path(c: LegoConfig, rank: int) -> Path:
    """Where trainer rank ``rank`` writes its audit records (``train.audit``; ``compose.sessions.audit`` reads them)."""
    return RunLayout(Path(c.paths.run_root or "runs/unnamed")).audit / f"rank-{rank}.jsonl"


def _audited(c: LegoConfig, backend: AuditableBackend) -> RankedBackend:
    if not c.train.audit:
        return backend
    from lego_rl.train.audit import AuditedBackend

    return AuditedBackend(backend, audit_path(c, backend.rank))


def _rank_zero(c: LegoConfig, backend: AuditableBackend, *, world: int) -> TrainerBackend:
    """Rank 0's backend: audited when ``train.audit`` is on, and under torchrun (``world`` > 1) wrapped so that
    every call is announced to the other ranks first (see ``start_ranks``)."""
    inner = _audited(c, backend)
    if world == 1:
        return inner
    from lego_rl.train.distributed import RankZeroBackend

    return RankZeroBackend(inner)


def start_ranks(c: LegoConfig, *, data_parallel: int | None = None) -> int:
    """Under ``torchrun`` (``WORLD_SIZE`` > 1): join the process group and return this process's rank; else 0.

    Rank 0 goes on to run the whole session (its backend is wrapped in ``RankZeroBackend``); a caller on
    any other rank runs ``follow_rank_zero_session`` instead. ``train.data_parallel``, when set, must equal the
    number of ranks torchrun started (pass it only when the operator set it: resolution fills in a default).
    """
    import os

    world = int(os.environ.get("WORLD_SIZE", "1"))
    dp = data_parallel
    # The Megatron backend checks TP × DP = world itself (megatron_model.init_parallel); FSDP2 is DP only.
    if c.train.backend == "torch" and dp is not None and dp != world:
        raise ConfigError(f"train.data_parallel = {dp} but {world} process(es) were started (torchrun "
                          f"--nproc-per-node); make them equal or unset train.data_parallel",
                          parameter="train.data_parallel", value=dp)
    if world == 1:
        t = c.train
        processes = t.tensor_parallel * t.pipeline_parallel * (t.data_parallel or 1)
        if t.backend == "megatron" and processes > 1 and c.cluster.mode != "ray":
            # Refused here, before the run directory exists: the backend would only find out after it. (Ray mode
            # places its own ranks from this one process.)
            raise ConfigError(f"train.tensor_parallel × train.pipeline_parallel × train.data_parallel = "
                              f"{t.tensor_parallel}×{t.pipeline_parallel}×{t.data_parallel or 1} = {processes} "
                              f"trainer processes, but 1 is running: launch them with `torchrun --nproc-per-node "
                              f"{processes} -m lego_rl train ...`, or place them with cluster.mode = \"ray\" "
                              "(docs/cluster.md)",
                              parameter="train.pipeline_parallel" if t.pipeline_parallel > 1
                              else "train.tensor_parallel", value=processes)
        return 0
    if c.cluster.mode == "ray":
        raise ConfigError(f"cluster.mode = \"ray\" places its own trainer ranks (cluster.trainer_nodes × "
                          f"cluster.gpus_per_node); run one `lego train`, not {world} under torchrun",
                          parameter="cluster.mode", value=c.cluster.mode)
    import torch
    import torch.distributed as dist

    from lego_rl.train.distributed import check_rendezvous

    if not dist.is_initialized():
        check_rendezvous()
        gpu = torch.cuda.is_available() and c.serving.device != "cpu"
        if gpu:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if gpu else "gloo")
    return int(dist.get_rank())


def follow_rank_zero_session(c: LegoConfig) -> int:
    """Ranks 1..N-1 of ``lego train`` under torchrun: build the same backend as rank 0 (``train.backend``) and make
    the calls rank 0 announces until it stops (``train.distributed``). Returns the number of calls made."""
    from lego_rl.train.distributed import follow_rank_zero

    directory = model_dir(c.model.checkpoint)
    backend: AuditableBackend
    if c.train.backend == "megatron":
        from lego_rl.train.megatron_backend import MegatronBackend, require_megatron

        require_megatron()
        backend = MegatronBackend(directory, megatron_settings(c))
    else:
        from lego_rl.train.torch_backend import TorchBackend

        backend = TorchBackend(directory, torch_settings(c))
    return follow_rank_zero(_audited(c, backend))


def megatron_settings(c: LegoConfig) -> MegatronTrainSettings:
    """The Megatron backend's optimizer, memory and parallel sizes from ``train.*``."""
    from lego_rl.train.megatron_backend import MegatronTrainSettings

    t = c.train
    return MegatronTrainSettings(lr=t.lr, warmup_steps=t.warmup_steps, max_grad_norm=t.max_grad_norm,
                                 weight_decay=t.weight_decay, gradient_checkpointing=t.gradient_checkpointing,
                                 reference_model=t.kl_coef > 0, tensor_parallel=t.tensor_parallel,
                                 pipeline_parallel=t.pipeline_parallel, data_parallel=t.data_parallel,
                                 expert_parallel=t.expert_parallel, sequence_parallel=t.sequence_parallel,
                                 routing_replay=c.rollout.use_rollout_routing_replay, bf16=t.precision == "bf16")


def megatron_backend(c: LegoConfig, model_dir: Path) -> tuple[TrainerBackend, LossFn]:
    # megatron-core is the `megatron` extra: a missing install is a ConfigError naming it, not an ImportError.
    from lego_rl.train.megatron_backend import MegatronBackend, require_megatron

    require_megatron()
    backend = MegatronBackend(model_dir, megatron_settings(c))
    return _rank_zero(c, backend, world=backend.layout.world), make_loss(loss_config(c))


BACKENDS: dict[str, BackendFactory] = {"torch": torch_backend, "megatron": megatron_backend}
"""``train.backend`` name → factory."""


def weight_sync_for(engines: Engines, staging: Path, *, in_flight: InFlight = "wait") -> WeightSync:
    """In place into an embedded engine in this process; through the serving routes (a staged checkpoint every
    replica loads) for vLLM. ``in_flight``: ``rollout.sync_in_flight``."""
    if engines.embedded is not None:
        return EmbeddedWeightSync(engines.embedded, in_flight=in_flight)
    return RouteWeightSync(engines.client, staging, in_flight=in_flight)


def env_rollout_fn(env: Environment, sampler: Sampler, run: RunDir) -> RolloutFn:
    """Rollouts of an environment, logged like agent rollouts (``rollout_started`` / ``rollout_finished``),
    each with its completions' text and the environment's metadata in its artifact folder
    (``runstore.env_rollouts``).

    An engine that fails or answers badly is an ``engine_error`` (refilled); any other exception from the
    environment is an ``internal_error`` with its traceback in the log.
    """

    async def rollout(prompt: Prompt, slot: RolloutSlot) -> RolloutResult:
        seeded = sampler.for_rollout(slot.rollout_id) if isinstance(sampler, Sampler) else sampler
        run.events.emit(RolloutStarted(rollout_id=slot.rollout_id, instance_id=prompt.id, harness=f"env:{env.name}",
                                       group_index=slot.group_index, index=slot.index))
        t0 = time.monotonic()
        trace: str | None = None
        samples = []
        reward: float | None = None
        detail = ""
        outcome: EnvOutcome | None = None
        try:
            outcome = out = await env.rollout(prompt.row, seeded)
            reason = out.termination
            reward = out.reward
            n = len(out.completions)
            samples = [completion_sample(c, rollout_id=slot.rollout_id, group_index=slot.group_index,
                                         index=slot.index, reward=out.reward, termination=reason, segment=k,
                                         num_segments=n) for k, c in enumerate(out.completions)]
        except (EngineFailed, EngineUnavailable, InvalidReply) as exc:
            reason, detail = TerminationReason.ENGINE_ERROR, f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # the environment is user code: a bug there is reported, not fatal to the step
            reason, detail = TerminationReason.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}"
            trace = traceback.format_exc()
        elapsed = time.monotonic() - t0
        completions = outcome.completions if outcome is not None else []
        folder = _keep_env_rollout(run, EnvRolloutRecord.of(
            rollout_id=slot.rollout_id, environment=env.name, instance_id=prompt.id, termination=reason,
            reward=reward, detail=detail, metadata=outcome.metadata if outcome is not None else None,
            completions=[EnvCompletionRecord.of(c.text, finish_reason=c.finish_reason,
                                                output_tokens=len(c.output_ids)) for c in completions]))
        run.events.emit(RolloutFinished(rollout_id=slot.rollout_id, termination=reason, reward=reward,
                                        detail=detail[:500], infrastructure_failure=is_infrastructure_failure(reason),
                                        timings={"rollout": round(elapsed, 4)}, traceback=trace))
        return RolloutResult(rollout_id=slot.rollout_id, instance_id=prompt.id, harness=f"env:{env.name}",
                             termination=reason, reward=reward, samples=samples, timings={"rollout": elapsed},
                             artifacts=folder, detail=detail, turns=len(samples),
                             sampled_tokens=sum(s.num_trained_tokens for s in samples),
                             group_index=slot.group_index, index=slot.index)

    return rollout


def _keep_env_rollout(run: RunDir, record: EnvRolloutRecord) -> Path | None:
    """The rollout's texts and metadata into its artifact folder (the folder; None when not written). A failed
    write is an event, never the rollout's failure: its reward and samples are intact."""
    try:
        folder = run.rollout_dir(record.rollout_id)
        write_env_rollout(folder, record)
    except OSError as exc:
        run.events.emit(ArtifactNotSaved(rollout_id=record.rollout_id, name=RolloutFiles.ENV_ROLLOUT,
                                         error=f"{type(exc).__name__}: {exc}"))
        return None
    return folder


def agent_rollout_fn(ctx: RolloutContext) -> RolloutFn:
    """Coding-agent rollouts through ``generate()`` (the harness named by each row)."""

    async def rollout(prompt: Prompt, slot: RolloutSlot) -> RolloutResult:
        return await generate(ctx, RolloutSpec(row=prompt.row, rollout_id=slot.rollout_id,
                                               group_index=slot.group_index, index=slot.index))

    return rollout


def load_env_prompts(env: Environment, path: Path, *, key: str) -> list[Prompt]:
    """An environment's rows from a JSONL file; a bad line is a ``TaskDataError`` naming file and line."""
    if not path.is_file():
        raise ConfigError(f"{path} does not exist or is not a file", parameter=key, value=str(path))
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            if not isinstance(raw, dict):
                raise ValueError(f"expected a JSON object, got {type(raw).__name__}")
            row = env.parse_row(raw)
        except ValueError as exc:
            raise TaskDataError(f"not a {env.name} row: {exc}", source=str(path), row=lineno) from None
        rid = env.row_id(row)
        if rid in seen:
            raise TaskDataError(f"row id {rid!r} repeats line {seen[rid]}", source=str(path), row=lineno)
        seen[rid] = lineno
        prompts.append(Prompt(rid, row))
    if not prompts:
        raise ConfigError(f"{path} holds no rows", parameter=key, value=str(path))
    return prompts


def load_task_prompts(r: ResolvedConfig, path: Path, *, key: str) -> list[Prompt]:
    if not path.is_file():
        raise ConfigError(f"{path} does not exist or is not a file", parameter=key, value=str(path))
    loaded = load_tasks(path, row_keys(r))
    loaded.raise_on_issues(str(path))
    return [Prompt(row.metadata.instance_id, row) for row in loaded.rows]


@dataclass
class TrainSummary:
    status: Literal["completed", "stopped"]
    run_root: str
    steps_done: int
    num_rollout: int
    last_reward_mean: float | None
    last_pass_at_1: float | None
    weight_version: int

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class TrainSession:
    """Everything ``lego train`` sets up before the first step, checked up front."""

    def __init__(self, r: ResolvedConfig, *, backends: dict[str, BackendFactory] | None = None) -> None:
        self.r = r
        c = r.config
        self.settings = loop_settings(c)
        factories = BACKENDS if backends is None else backends
        if c.train.backend not in factories:
            have = ", ".join(sorted(factories)) or "none"
            raise ConfigError(f"train.backend = {c.train.backend!r} has no trainer in this install (available: "
                              f"{have})", parameter="train.backend", value=c.train.backend)
        self.backend_factory = factories[c.train.backend]
        self.env: Environment | None = (
            load_environment(c.train.environment, c.train.environment_options) if c.train.environment else None)
        data = Path(c.rollout.prompt_data or "")
        self.prompts = self._load(data, "rollout.prompt_data")
        self.eval_prompts = (self._load(Path(c.train.eval_data), "train.eval_data") if c.train.eval_data else [])
        self.settings.check(has_eval_rows=bool(self.eval_prompts))
        root = Path(c.paths.run_root or "runs/unnamed")
        self.sink = metrics_sinks(c, RunLayout(root))  # before the run directory: a missing package starts nothing
        self.overridden = overridden_on_resume(r, root)
        self.run_dir = RunDir.open(
            root, config=config_json(r), resume=c.train.resume,
            artifacts=Path(c.paths.artifacts) if c.paths.artifacts else None,
            run_log=Path(c.paths.run_log) if c.paths.run_log else None,
        )
        self.resume_index = sum(1 for _ in root.glob("config.resume-*.json"))
        self.loop: TrainLoop | None = None
        self._stop_early = False

    def _load(self, path: Path, key: str) -> list[Prompt]:
        if self.env is not None:
            return load_env_prompts(self.env, path, key=key)
        return load_task_prompts(self.r, path, key=key)

    async def _check_engines(self, engines: Engines) -> None:
        health = await engines.client.health()
        dead = [u for u, ok in health.items() if not ok]
        if dead:
            raise TrainingError(f"serving engine(s) not healthy: {', '.join(dead)} (serving.urls); start them or "
                                "fix the URLs")

    def _make_loop(self, model_dir: Path, rollout_fn: RolloutFn, engines: Engines,
                   cluster: RayCluster | None = None) -> TrainLoop:
        in_flight = self.r.config.rollout.sync_in_flight
        backend: TrainerBackend
        loss: LossFn
        sync: WeightSync
        if cluster is not None:  # the trainer ranks and the engines are Ray actors (cluster.actors)
            from lego_rl.cluster.actors import RayWeightSync

            backend, loss = cluster.backend, make_loss(loss_config(self.r.config))
            sync = RayWeightSync(cluster.engines, in_flight=in_flight)
        else:
            backend, loss = self.backend_factory(self.r.config, model_dir)
            sync = weight_sync_for(engines, self.run_dir.root / "sync-weights", in_flight=in_flight)
        loop = TrainLoop(self.settings, backend=backend, loss_fn=loss, rollout_fn=rollout_fn, prompts=self.prompts,
                         run=self.run_dir, eval_prompts=self.eval_prompts, resume_index=self.resume_index,
                         sync=sync)
        if self.r.config.train.resume:
            loop.resume()
            mark_overrides(self.run_dir, self.overridden, loop.next_step)
        self.loop = loop
        if self._stop_early:
            loop.request_stop()
        return loop

    async def _drain_sinks(self, interval_s: float = 2.0) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.sink.drain()

    def request_stop(self) -> None:
        """Stop at the next safe point (before the loop exists: as soon as it does)."""
        self._stop_early = True
        if self.loop is not None:
            self.loop.request_stop()

    def _steps_on_disk(self) -> int:
        """Steps the run directory's newest checkpoint holds; 0 if none (or a broken pointer: this reports a
        failure already, and must not raise a second one)."""
        try:
            latest = latest_checkpoint(self.run_dir.layout.checkpoints)
        except (OSError, ConfigError):
            return 0
        return latest.step + 1 if latest is not None else 0

    async def run(self) -> TrainSummary:
        c = self.r.config
        try:
            async with contextlib.AsyncExitStack() as stack:
                cluster: RayCluster | None = None
                if c.cluster.mode == "ray":
                    from lego_rl.compose.ray_run import cluster_for, serving_on_replicas

                    cluster = await stack.enter_async_context(cluster_for(
                        c, megatron_settings(c) if c.train.backend == "megatron" else torch_settings(c)))
                    c = serving_on_replicas(c, cluster)  # the replicas' URLs, reached like vLLM servers
                if self.env is not None:
                    engines = await stack.enter_async_context(serving_engines(c))
                    await self._check_engines(engines)
                    self.run_dir.events.emit(ServingReady(adapter="", serving=engines.urls))
                    sampler = Sampler(engines.client, engines.renderer, temperature=c.rollout.temperature,
                                      top_p=c.rollout.top_p, top_k=c.rollout.top_k,
                                      max_tokens=c.model.max_response_tokens,
                                      capture_nucleus=c.rollout.capture_nucleus, seed=c.train.seed,
                                      capture_routing=c.rollout.use_rollout_routing_replay)
                    rollout_fn = env_rollout_fn(self.env, sampler, self.run_dir)
                else:
                    st = await stack.enter_async_context(serving_stack(c))
                    engines = Engines(urls=st.serving_urls, client=st.client, renderer=st.core.renderer,
                                      model_dir=Path(""))
                    await self._check_engines(engines)
                    self.run_dir.events.emit(ServingReady(adapter=st.adapter_url, serving=st.serving_urls))
                    images_path = Path(c.sandbox.images) if c.sandbox.images else None
                    # One set of providers for the whole run (warm pools), closed with the stack.
                    providers = await stack.enter_async_context(RunProviders())
                    ctx = RolloutContext(
                        settings=settings_from_config(self.r, st.adapter_url), run=self.run_dir, sessions=st.sessions,
                        adapter_url=st.adapter_url, harness_for=harness_factory(self.r),
                        toolchain=Toolchain(Path(c.paths.toolchain_dir or "")),
                        images=load_images_json(images_path) if images_path and images_path.exists() else None,
                        dataset_dir=Path(c.rollout.prompt_data or ".").resolve().parent, providers=providers,
                    )
                    rollout_fn = agent_rollout_fn(ctx)
                loop = self._make_loop(model_dir(c.model.checkpoint), rollout_fn, engines, cluster)
                # The sinks (TensorBoard, W&B) read the rows back from metrics.jsonl as the loop appends them.
                self.sink.start(loop.next_step)
                self.sink.follow(self.run_dir.layout.metrics)
                drainer = asyncio.create_task(self._drain_sinks())
                try:
                    status = await loop.run()
                finally:
                    drainer.cancel()
                    stop = getattr(loop.backend, "stop", None)  # RankZeroBackend: release the other ranks
                    if stop is not None:
                        stop()
        except BaseException as exc:
            if self.loop is None:
                # Failed before the loop existed (a dead engine, a bad checkpoint): the loop's own
                # training_finished never comes, and the run directory must still say how the run ended.
                self.run_dir.events.emit(TrainingFinished(status="failed", steps_done=self._steps_on_disk(),
                                                          detail=f"{type(exc).__name__}: {exc}"[:500]))
            raise
        finally:
            self.sink.close()
            self.run_dir.close()
        return TrainSummary(status=status, run_root=str(self.run_dir.root), steps_done=loop.next_step,
                            num_rollout=self.settings.num_rollout, last_reward_mean=loop.progress.last_reward,
                            last_pass_at_1=loop.progress.last_pass_at_1, weight_version=loop.backend.weight_version)
