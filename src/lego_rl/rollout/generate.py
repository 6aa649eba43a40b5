"""generate(): one task row to graded, trainable samples.

Stages, each timed and logged to the run's event log, all under one whole-rollout guard deadline:

1. open an adapter session (its id is the CLI's API key);
2. create the agent sandbox (at most ``boot_concurrency`` at a time) and prepare the workspace, snapshot;
3. install the harness's CLI offline and run it with the agent time budget;
4. capture the patch (workspace after minus before);
5. grade it in a fresh sandbox of the same image;
6. turn the session's turn records into Samples.

Every artifact (CLI event log and files, sandbox commands, patch, grader output, turn records, samples) is
written under the rollout's artifact folder *before* the sandbox is destroyed. Whatever happens, generate()
returns a ``RolloutResult`` with exactly one termination reason; no exception escapes it, except
cancellation (re-raised after cleanup) and a rollout id whose artifact folder already exists
(``FileExistsError`` before anything starts: a caller's bug, since artifacts are never overwritten).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lego_rl.adapter.sessions import Session, SessionRegistry, save_turn_records
from lego_rl.errors import GraderError, LegoError, TrajectoryError
from lego_rl.harness.models import HarnessOutcome, RunRequest
from lego_rl.harness.plugins import HarnessHandle
from lego_rl.harness.toolchain import Toolchain
from lego_rl.rollout.recording import RecordingSandbox
from lego_rl.rollout.rundir import RunDir, safe_name, write_new
from lego_rl.termination import TerminationReason, is_infrastructure_failure
from lego_rl.sandbox.base import ImageSpec, Sandbox
from lego_rl.sandbox.factory import create_sandbox
from lego_rl.swe.grader import GradeResult, grade
from lego_rl.swe.patch import capture_patch, take_snapshot
from lego_rl.swe.seed import seeded_opener
from lego_rl.swe.workspace import DEFAULT_PROBLEM_PATH, prepare_workspace
from lego_rl.tasks.model import TaskRow
from lego_rl.trajectory.manager import TrajectoryOptions, build_samples
from lego_rl.trajectory.sample import Sample, save_samples

STAGES = ("harness_lookup", "sandbox_setup", "harness_install", "agent", "patch", "cleanup", "grading", "samples")
"""Timed stages, in order. ``cleanup`` covers saving the agent sandbox's artifacts, destroying it and
closing the adapter session (turn records saved)."""


@dataclass
class RolloutSettings:
    """The slice of the resolved config a rollout needs (kept plain so tests can build one)."""

    provider: str = "bwrap"
    grader_provider: str | None = None
    provider_options: dict[str, Any] = field(default_factory=dict)
    """Constructor options of the agent's provider."""
    grader_provider_options: dict[str, Any] | None = None
    """Constructor options of the grader's provider when it differs (None: the agent's options)."""
    sandbox_options: dict[str, Any] = field(default_factory=dict)
    """Per-sandbox options for ``provider.create`` (memory_mb, network, ...)."""
    default_harness: str = "claude_code"
    agent_time_budget_s: float = 1200.0
    grader_timeout_s: float = 180.0
    guard_s: float = 1680.0
    max_turns: int = 40
    max_context_tokens: int = 65536
    max_output_tokens: int = 8192
    max_requests_per_session: int = 500
    prompt_template: str = "{problem}"
    model_name: str = "lego-policy"
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    agent_user: str = "agent"
    trajectory: TrajectoryOptions = field(default_factory=TrajectoryOptions)

    def options_for(self, provider: str) -> dict[str, Any]:
        """Provider options for ``provider``: a grader on another provider gets its own (sunabako's
        options mean nothing to bwrap and are refused by it)."""
        if provider == self.provider or self.grader_provider_options is None:
            return self.provider_options
        return self.grader_provider_options


@dataclass
class RolloutContext:
    """What many rollouts share: settings, run directory, adapter sessions, images, harnesses."""

    settings: RolloutSettings
    run: RunDir
    sessions: SessionRegistry
    adapter_url: str
    """Adapter root as reachable from inside the sandboxes (``http://127.0.0.1:18091``)."""
    harness_for: Callable[[str], HarnessHandle]
    toolchain: Toolchain
    images: Mapping[str, ImageSpec] | None = None
    dataset_dir: Path | None = None
    boot: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(2))


@dataclass
class RolloutSpec:
    row: TaskRow
    rollout_id: str
    group_index: int = 0
    index: int = 0


@dataclass
class RolloutResult:
    rollout_id: str
    instance_id: str
    harness: str
    termination: TerminationReason
    reward: float | None
    """Verifier reward; None when grading never happened (an infrastructure failure before it)."""
    samples: list[Sample]
    timings: dict[str, float]
    artifacts: Path | None
    detail: str = ""
    turns: int = 0
    sampled_tokens: int = 0
    group_index: int = 0
    index: int = 0

    @property
    def infrastructure_failure(self) -> bool:
        return is_infrastructure_failure(self.termination)

    def summary(self) -> dict[str, Any]:
        return {
            "rollout_id": self.rollout_id, "instance_id": self.instance_id, "harness": self.harness,
            "termination": self.termination.value, "reward": self.reward, "turns": self.turns,
            "sampled_tokens": self.sampled_tokens, "segments": len(self.samples), "timings": self.timings,
            "group_index": self.group_index, "index": self.index, "detail": self.detail,
            "infrastructure_failure": self.infrastructure_failure,
        }


class _Failure(Exception):
    """A stage failed: carries the termination reason decided by the stage that knows best."""

    def __init__(self, reason: TerminationReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class _Rollout:
    """State of one generate() call; methods are the stages, in order."""

    def __init__(self, ctx: RolloutContext, spec: RolloutSpec) -> None:
        self.ctx, self.spec = ctx, spec
        self.meta = spec.row.metadata
        self.harness_name = self.meta.agent or ctx.settings.default_harness
        self.timings: dict[str, float] = {}
        self._cleanup_t0: float | None = None
        self.folder: Path | None = None
        self.session: Session | None = None
        self.sandboxes: list[RecordingSandbox] = []
        self.patch: bytes | None = None
        self.grade_result: GradeResult | None = None
        self.outcome: HarnessOutcome | None = None
        self.harness: HarnessHandle | None = None

    def emit(self, kind: str, **fields: Any) -> None:
        self.ctx.run.events.emit(kind, rollout_id=self.spec.rollout_id, **fields)

    @contextlib.asynccontextmanager
    async def stage(self, name: str, on_error: TerminationReason) -> AsyncIterator[None]:
        """Time a stage; map our own errors raised inside it to ``on_error`` (or a finer default)."""
        start = time.monotonic()
        status = "ok"
        try:
            yield
        except _Failure:
            status = "failed"
            raise
        except LegoError as exc:
            status = "failed"
            raise _Failure(on_error, f"{name}: {exc}") from exc
        except OSError as exc:
            status = "failed"
            raise _Failure(on_error, f"{name}: {type(exc).__name__}: {exc}") from exc
        except BaseException:  # the guard's cancellation (or a bug): the stage did not finish
            status = "interrupted"
            raise
        finally:
            self.timings[name] = round(time.monotonic() - start, 3)
            self.emit("stage", stage=name, status=status, duration_s=self.timings[name])

    def save(self, name: str, data: str | bytes) -> None:
        if self.folder is not None:
            write_new(self.folder / name, data)

    def opener(self, provider: str) -> Callable[[], contextlib.AbstractAsyncContextManager[Sandbox]]:
        s = self.ctx.settings

        options = s.options_for(provider)

        def open_plain() -> Any:
            return create_sandbox(self.meta.image, provider=provider, images=self.ctx.images,
                                  provider_options=options, **s.sandbox_options)

        return seeded_opener(open_plain, self.meta, self.ctx.dataset_dir)

    async def run(self) -> RolloutResult:
        s = self.ctx.settings
        self.folder = self.ctx.run.rollout_dir(self.spec.rollout_id)
        self.emit("rollout_started", instance_id=self.meta.instance_id, harness=self.harness_name,
                  group_index=self.spec.group_index, index=self.spec.index)
        reason, detail = TerminationReason.COMPLETED, ""
        try:
            async with asyncio.timeout(s.guard_s):
                reason, detail = await self._stages()
        except _Failure as exc:
            reason, detail = exc.reason, str(exc)
        except TimeoutError:
            reason, detail = TerminationReason.GUARD_TIMEOUT, f"whole-rollout guard of {s.guard_s:g} s expired"
        except Exception as exc:  # noqa: BLE001 - a bug must not take the run down; it is recorded
            reason, detail = TerminationReason.ADAPTER_ERROR, f"internal error: {type(exc).__name__}: {exc}"
        return await self._finish(reason, detail)

    async def _stages(self) -> tuple[TerminationReason, str]:
        s = self.ctx.settings
        async with contextlib.AsyncExitStack() as stack:
            # Saved on the way out, before the sandbox itself closes (the stack unwinds in reverse).
            stack.push_async_callback(self._cleanup_finished)
            stack.push_async_callback(self._close_session)
            async with self.stage("harness_lookup", TerminationReason.HARNESS_INSTALL):
                self.harness = self.ctx.harness_for(self.harness_name)
            async with self.stage("sandbox_setup", TerminationReason.SANDBOX_SETUP):
                self.session = self.ctx.sessions.open(
                    safe_name(self.spec.rollout_id), template_kwargs=s.template_kwargs,
                    max_requests=s.max_requests_per_session, max_context=s.max_context_tokens,
                    max_response_tokens=s.max_output_tokens,
                )
                async with self.ctx.boot:
                    inner = await stack.enter_async_context(self.opener(s.provider)())
                sb = RecordingSandbox(inner, "agent")
                self.sandboxes.append(sb)
                stack.push_async_callback(self._save_sandbox_artifacts, sb)
                stack.push_async_callback(self._cleanup_started)
                await prepare_workspace(sb, workdir=self.meta.workdir, problem_statement=self.meta.problem_statement,
                                        pre_commands=self.meta.pre_commands, agent_user=s.agent_user)
                snapshot = await take_snapshot(sb, self.meta.workdir)
            async with self.stage("harness_install", TerminationReason.HARNESS_INSTALL):
                await self.harness.install(sb, self.ctx.toolchain)
                version = await self.harness.verify(sb, s.agent_user)
                self.emit("harness_ready", harness=self.harness_name, version=version)
            async with self.stage("agent", TerminationReason.SANDBOX_LOST):
                request = RunRequest(
                    session_id=self.session.id, base_url=self.ctx.adapter_url, model=s.model_name,
                    prompt=s.prompt_template.format(problem=self.meta.problem_statement, workdir=self.meta.workdir,
                                                    problem_file=DEFAULT_PROBLEM_PATH),
                    workdir=self.meta.workdir, time_budget_s=s.agent_time_budget_s, max_turns=s.max_turns,
                    max_context_tokens=s.max_context_tokens, max_output_tokens=s.max_output_tokens,
                    user=s.agent_user, artifacts_dir=self.folder,
                )
                self.outcome = await self.harness.run(sb, request)
                self.emit("agent_exited", cli_s=round(self.outcome.duration_s, 3), exit_code=self.outcome.exit_code,
                          outcome=self.outcome.kind, detail=self.outcome.detail[:300])
                with contextlib.suppress(LegoError, OSError):
                    for name, data in (await self.harness.artifacts(sb, request)).items():
                        self.save(f"cli-{safe_name(name)}", data)
            reason, detail = self._policy_outcome()
            if self.outcome is not None and self.outcome.crashed and not await _alive(sb):
                reason, detail = TerminationReason.SANDBOX_LOST, f"the agent sandbox died during the run: {detail}"
            if is_infrastructure_failure(reason):
                return reason, detail
            async with self.stage("patch", TerminationReason.SANDBOX_LOST):
                self.patch = await capture_patch(sb, snapshot)
                self.save("patch.diff", self.patch)
        async with self.stage("grading", TerminationReason.GRADER_ERROR):
            try:
                self.grade_result = await grade(self.meta, self.patch or b"",
                                                open_sandbox=self.opener(s.grader_provider or s.provider),
                                                timeout=s.grader_timeout_s)
            except GraderError as exc:
                self.save("grader.log", getattr(exc, "output", "") or str(exc))
                raise
            self.save("grader.log", self.grade_result.output)
        # The verdict's reason ("tests passed", "tests timed out after 180 s") belongs in the outcome: a
        # grader timeout is a verdict of 0 for the policy (its patch may hang the tests), not an outage.
        return reason, "; ".join(part for part in (detail, f"grader: {self.grade_result.reason}") if part)

    def _policy_outcome(self) -> tuple[TerminationReason, str]:
        """Termination from the CLI's outcome and the adapter session, most telling first."""
        out, session = self.outcome, self.session
        assert out is not None and session is not None
        if session.infra_failure:
            return TerminationReason.ENGINE_ERROR, f"adapter session failed: {session.infra_failure}"
        if out.crashed:
            return TerminationReason.HARNESS_INSTALL, f"the CLI crashed: {out.detail or out.stderr_tail[-300:]}"
        if out.timed_out:
            return TerminationReason.TIME_BUDGET, f"agent time budget of {self.ctx.settings.agent_time_budget_s:g} s"
        if session.termination == "context_limit":
            return TerminationReason.CONTEXT_LIMIT, "the conversation filled the context window"
        if out.hit_turn_limit or session.termination == "request_limit":
            return TerminationReason.TURN_LIMIT, out.detail or "turn/request limit"
        if out.adapter_error and session.requests == 0:
            # The CLI never got a request through: the adapter was unreachable or refused it outright.
            # Once turns were served, an "API error" is the CLI's reading of an answer it got (an output
            # that hit max tokens, say): the policy's doing, left to the exit-code rule below.
            return TerminationReason.ADAPTER_ERROR, f"the CLI could not reach the adapter: {out.detail}"
        if out.exit_code not in (0, None):
            return TerminationReason.AGENT_ERROR_EXIT, f"the CLI exited {out.exit_code}: {out.detail}"
        return TerminationReason.COMPLETED, ""

    async def _cleanup_started(self) -> None:
        self._cleanup_t0 = time.monotonic()

    async def _cleanup_finished(self) -> None:
        if self._cleanup_t0 is not None:
            self.timings["cleanup"] = round(time.monotonic() - self._cleanup_t0, 3)
            self.emit("stage", stage="cleanup", status="ok", duration_s=self.timings["cleanup"])

    async def _save_sandbox_artifacts(self, sb: RecordingSandbox) -> None:
        with contextlib.suppress(OSError):
            self.save(f"commands-{sb.label}.jsonl", sb.jsonl())
        if self.outcome is not None and self.outcome.event_log and self.outcome.event_log_path is None:
            with contextlib.suppress(OSError):
                self.save("cli-events.jsonl", self.outcome.event_log)

    async def _close_session(self) -> None:
        if self.session is not None and self.session.id in self.ctx.sessions.open_ids():
            self.ctx.sessions.close(self.session.id)
            if self.folder is not None:
                save_turn_records(self.session, self.folder)

    async def _finish(self, reason: TerminationReason, detail: str) -> RolloutResult:
        with contextlib.suppress(Exception):
            await self._close_session()
        reward = self.grade_result.reward if self.grade_result is not None else None
        samples: list[Sample] = []
        records = self.session.main_records() if self.session is not None else []
        if records:
            start = time.monotonic()
            try:
                samples, _ = build_samples(
                    records, rollout_id=self.spec.rollout_id, group_index=self.spec.group_index,
                    index=self.spec.index, reward=reward, termination=reason,
                    metadata={"instance_id": self.meta.instance_id, "harness": self.harness_name},
                    options=self.ctx.settings.trajectory,
                )
            except TrajectoryError as exc:
                if not is_infrastructure_failure(reason):
                    reason, detail = TerminationReason.ADAPTER_ERROR, f"samples: {exc}"
            self.timings["samples"] = round(time.monotonic() - start, 3)
            if samples and self.folder is not None:
                save_samples(samples, self.folder / "samples.jsonl")
        result = RolloutResult(
            rollout_id=self.spec.rollout_id, instance_id=self.meta.instance_id, harness=self.harness_name,
            termination=reason, reward=reward, samples=samples, timings=self.timings, artifacts=self.folder,
            detail=detail, turns=len(records), sampled_tokens=sum(len(r.output_ids) for r in records),
            group_index=self.spec.group_index, index=self.spec.index,
        )
        with contextlib.suppress(OSError):
            self.save("outcome.json", json.dumps(result.summary(), indent=2))
        self.emit("rollout_finished", termination=reason.value, reward=reward, detail=detail[:500],
                  infrastructure_failure=result.infrastructure_failure, timings=self.timings, turns=result.turns)
        return result


async def generate(ctx: RolloutContext, spec: RolloutSpec) -> RolloutResult:
    """Run one rollout end to end; see the module docstring. Never raises for a failed rollout."""
    return await _Rollout(ctx, spec).run()


async def _alive(sb: Sandbox) -> bool:
    """Whether the sandbox still runs commands (told apart: a crashed CLI from a dead sandbox)."""
    try:
        return (await sb.exec(["true"], timeout=15)).exit_code == 0
    except (LegoError, OSError):
        return False
