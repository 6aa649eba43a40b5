"""generate(): one task row to graded, trainable samples.

Stages, each timed and logged to the run's event log, all under one whole-rollout guard deadline:

1. look up the harness; open an adapter session (its id is the CLI's API key) with the config's limits,
   narrowed by the harness's adapter options (its own request cap; the turn limit for a CLI without one);
2. create the agent sandbox (at most ``boot_concurrency`` at a time) and prepare the workspace, snapshot;
3. install the harness's CLI offline and run it with the agent time budget;
4. capture the patch (workspace after minus before);
5. grade it in a fresh sandbox of the same image;
6. turn the session's turn records into Samples (side turns too, when the trajectory options train them).

Every artifact (CLI event log and files, sandbox commands, patch, grader output, turn records, samples) is
written under the rollout's artifact folder *before* the sandbox is destroyed. When a rollout ends early
(an infrastructure failure, the guard, a cancellation) the CLI's files and the patch are still taken
whenever the sandbox answers, within ``SALVAGE_S``: evidence is most needed when something broke.
Whatever happens, generate() returns a ``RolloutResult`` with exactly one termination reason; no exception
escapes it except cancellation, which is re-raised after cleanup and after the outcome (``interrupted``)
is saved and handed to ``on_result``. A rollout id whose artifact folder already exists is an
``internal_error`` result that writes nothing (artifacts are never overwritten).

The reason is decided once and written once, in the ``rollout_finished`` event. Our own errors
(``lego_rl.errors``, OS errors) map to the failing stage's reason; any other exception is a bug in lego
itself: ``internal_error``, with its traceback in that event. Once the policy's first answer has reached
the CLI, a death of the CLI is the policy's (``agent_error_exit``): see ``lego_rl.termination`` for the
rule behind every label.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import traceback
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lego_rl.errors import (
    GraderError,
    LegoError,
    SandboxError,
    SandboxLimitExceeded,
    SandboxLost,
    TrajectoryError,
)
from lego_rl.harness.models import HarnessOutcome, RunRequest
from lego_rl.harness.plugins import HarnessHandle
from lego_rl.harness.toolchain import Toolchain
from lego_rl.rollout.ports import AdapterSessions, SessionView
from lego_rl.rollout.recording import RecordingSandbox
from lego_rl.rollout.settings import RolloutSettings
from lego_rl.runstore import RolloutFiles, RunDir, safe_name, write_new
from lego_rl.runstore.events import (
    AgentExited,
    ArtifactNotSaved,
    HarnessReady,
    RolloutFinished,
    RolloutStarted,
    SessionCloseFailed,
    SessionOpened,
    StageFinished,
    StageName,
    StageStatus,
)
from lego_rl.sandbox.base import ImageSpec, Sandbox
from lego_rl.swe.grader import GradeResult, grade
from lego_rl.swe.patch import Snapshot, capture_patch, take_snapshot
from lego_rl.swe.task_sandbox import RunProviders, SandboxOpener, SandboxTarget, task_sandbox_opener
from lego_rl.swe.workspace import DEFAULT_PROBLEM_PATH, prepare_workspace
from lego_rl.tasks.model import TaskRow
from lego_rl.termination import TerminationReason, is_infrastructure_failure, parse_termination
from lego_rl.trajectory.manager import TrajectoryStats, build_samples
from lego_rl.trajectory.sample import Sample, save_samples

SALVAGE_S = 60.0
"""Bound on saving what an early-ended rollout's sandbox still holds (liveness probe, CLI files, patch):
a sandbox that hangs must not hold the cleanup, and a stopped run (SIGTERM) must end soon."""

STAGES = ("harness_lookup", "sandbox_setup", "harness_install", "agent", "patch", "cleanup", "grading", "samples")
"""Timed stages, in order. ``cleanup`` covers saving the agent sandbox's artifacts, destroying it and
closing the adapter session (turn records saved)."""


@dataclass
class RolloutContext:
    """What many rollouts share: settings, run directory, adapter sessions, images, harnesses."""

    settings: RolloutSettings
    run: RunDir
    sessions: AdapterSessions
    adapter_url: str
    """Adapter root as reachable from inside the sandboxes (``http://127.0.0.1:18091``)."""
    harness_for: Callable[[str], HarnessHandle]
    toolchain: Toolchain
    images: Mapping[str, ImageSpec] | None = None
    dataset_dir: Path | None = None
    boot: asyncio.Semaphore | None = None
    """Gate on agent sandbox creation; None: one of ``settings.boot_concurrency`` slots is made."""
    providers: RunProviders | None = None
    """The run's shared sandbox providers (warm pools live there); None: one provider per sandbox."""

    def __post_init__(self) -> None:
        if self.boot is None:
            self.boot = asyncio.Semaphore(max(1, self.settings.boot_concurrency))

    def opener(self, row: TaskRow, target: SandboxTarget) -> SandboxOpener:
        return task_sandbox_opener(row.metadata, target, images=self.images, dataset_dir=self.dataset_dir,
                                   providers=self.providers)


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
    trajectory: TrajectoryStats | None = None
    """How the turn records became segments (tokenisation health); None when no samples were built."""

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
            "tokenisation": None if self.trajectory is None else {
                "segments": self.trajectory.segments_started, "false_forks": self.trajectory.false_forks,
                "repeated_prompt_tokens": self.trajectory.repeated_prompt_tokens,
                "render_fallbacks": self.trajectory.render_fallbacks,
                "parse_failures": self.trajectory.parse_failures,
            },
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
        self.session: SessionView | None = None
        self._session_closed = False
        self.sandboxes: list[RecordingSandbox] = []
        self.patch: bytes | None = None
        self.grade_result: GradeResult | None = None
        self.outcome: HarnessOutcome | None = None
        self.harness: HarnessHandle | None = None
        self.harness_options: dict[str, Any] = {}
        self.request: RunRequest | None = None
        self.snapshot: Snapshot | None = None
        self._cli_files_taken = False
        self._patch_tried = False
        self.over_limit: SandboxLimitExceeded | None = None
        """The agent sandbox was killed for going over its own limits (memory, processes) during the run."""
        self.on_result: Callable[[RolloutResult], None] | None = None

    @property
    def rid(self) -> str:
        return self.spec.rollout_id

    @contextlib.asynccontextmanager
    async def stage(self, name: StageName, on_error: TerminationReason) -> AsyncIterator[None]:
        """Time a stage; map our own errors raised inside it to ``on_error`` (or a finer default)."""
        start = time.monotonic()
        status: StageStatus = "ok"
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
        except Exception:  # a bug: run() records it as internal_error with its traceback
            status = "failed"
            raise
        except BaseException:  # the guard's cancellation: the stage did not finish
            status = "interrupted"
            raise
        finally:
            self.timings[name] = round(time.monotonic() - start, 3)
            self.ctx.run.events.emit(StageFinished(rollout_id=self.rid, stage=name, status=status,
                                                   duration_s=self.timings[name]))

    def save(self, name: str, data: str | bytes) -> None:
        if self.folder is not None:
            write_new(self.folder / name, data, what="rollout artifact")

    def save_or_log(self, name: str, data: str | bytes) -> None:
        """Save an artifact whose loss must not end the rollout; a failure is an event, not silence."""
        try:
            self.save(name, data)
        except OSError as exc:
            self.ctx.run.events.emit(ArtifactNotSaved(rollout_id=self.rid, name=name,
                                                      error=f"{type(exc).__name__}: {exc}"))

    async def run(self) -> RolloutResult:
        s = self.ctx.settings
        self.ctx.run.events.emit(RolloutStarted(rollout_id=self.rid, instance_id=self.meta.instance_id,
                                                harness=self.harness_name, group_index=self.spec.group_index,
                                                index=self.spec.index))
        reason, detail, trace = TerminationReason.COMPLETED, "", None
        try:
            try:
                self.folder = self.ctx.run.rollout_dir(self.rid)
            except OSError as exc:  # FileExistsError: a reused rollout id; never write into another's folder
                why = f"artifact folder for rollout {self.rid!r}: {type(exc).__name__}: {exc}"
                raise _Failure(TerminationReason.INTERNAL_ERROR, why) from exc
            async with asyncio.timeout(s.guard_s):
                reason, detail = await self._stages()
        except asyncio.CancelledError:
            # The run is stopping (SIGTERM, Ctrl-C) or the scheduler cancelled it (its group went stale): the
            # stages have cleaned up and saved what existed; the outcome is saved too, then the cancellation
            # goes on. The scheduler's rollout_cancelled event says which.
            await self._finish(TerminationReason.INTERRUPTED,
                               "cancelled while in flight (the run stopped, or the scheduler dropped it as stale)",
                               None)
            raise
        except _Failure as exc:
            reason, detail = exc.reason, str(exc)
        except TimeoutError:
            reason, detail = TerminationReason.GUARD_TIMEOUT, f"whole-rollout guard of {s.guard_s:g} s expired"
        except Exception as exc:  # noqa: BLE001 - a bug must not take the run down; it is recorded
            reason, detail = TerminationReason.INTERNAL_ERROR, f"internal error: {type(exc).__name__}: {exc}"
            trace = traceback.format_exc()
        return await self._finish(reason, detail, trace)

    def _open_session(self) -> SessionView:
        """The adapter session, with the config's limits narrowed by what the harness asks of the adapter:
        its own request cap (OpenCode's ``max_requests``), and the turn limit for a CLI that cannot
        enforce one itself (Codex: ``enforce_turn_limit``)."""
        s = self.ctx.settings
        caps = [s.max_requests_per_session]
        if isinstance(self.harness_options.get("max_requests"), int):
            caps.append(self.harness_options["max_requests"])
        if self.harness_options.get("enforce_turn_limit"):
            caps.append(s.max_turns)
        session = self.ctx.sessions.open(
            safe_name(self.rid), template_kwargs=s.template_kwargs, max_requests=min(caps),
            max_context_tokens=s.max_context_tokens, max_response_tokens=s.max_response_tokens,
            records_dir=self.folder,  # each turn record on disk as it happens: a killed trainer keeps them
        )
        self.ctx.run.events.emit(SessionOpened(rollout_id=self.rid, session_id=session.id,
                                               max_requests=min(caps), harness_options=self.harness_options))
        return session

    async def _stages(self) -> tuple[TerminationReason, str]:
        """The rollout's stages in order, each failure mapped to its stage's termination reason (``stage``);
        the reason and detail of a rollout that got as far as grading."""
        async with contextlib.AsyncExitStack() as stack:
            # Saved on the way out, before the sandbox itself closes (the stack unwinds in reverse).
            stack.push_async_callback(self._cleanup_finished)
            stack.push_async_callback(self._close_session)
            async with self.stage("harness_lookup", TerminationReason.HARNESS_INSTALL):
                self.harness = self.ctx.harness_for(self.harness_name)
                self.harness_options = self.harness.adapter_options()
            async with self.stage("sandbox_setup", TerminationReason.SANDBOX_SETUP):
                sb = await self._agent_sandbox(stack)
            async with self.stage("harness_install", TerminationReason.HARNESS_INSTALL):
                await self._install_harness(sb)
            async with self.stage("agent", TerminationReason.SANDBOX_LOST):
                await self._run_agent(sb)
            reason, detail = await self._judge_run(sb)
            if is_infrastructure_failure(reason):
                return reason, detail  # the patch is still taken, by _salvage, while the sandbox answers
            async with self.stage("patch", TerminationReason.SANDBOX_LOST):
                reason, detail = await self._capture_patch(sb, reason, detail)
        async with self.stage("grading", TerminationReason.GRADER_ERROR):
            await self._grade()
        assert self.grade_result is not None
        # The verdict's reason ("tests passed", "tests timed out after 180 s") belongs in the outcome: a
        # grader timeout is a verdict of 0 for the policy (its patch may hang the tests), not an outage. A
        # verdict with a label of its own (tampered, grading_blocked) names the rollout's end: a policy outcome.
        if self.grade_result.label is not None:
            reason = parse_termination(self.grade_result.label)
        return reason, "; ".join(part for part in (detail, f"grader: {self.grade_result.reason}") if part)

    async def _agent_sandbox(self, stack: contextlib.AsyncExitStack) -> RecordingSandbox:
        """Open the adapter session and the agent's sandbox (closed by ``stack``, its artifacts saved first),
        prepare the workspace and snapshot it."""
        s = self.ctx.settings
        self.session = self._open_session()
        assert self.ctx.boot is not None
        async with self.ctx.boot:
            inner = await stack.enter_async_context(self.ctx.opener(self.spec.row, s.agent_sandbox)())
        sb = RecordingSandbox(inner, "agent")
        self.sandboxes.append(sb)
        stack.push_async_callback(self._save_sandbox_artifacts, sb)
        stack.push_async_callback(self._salvage, sb)  # before the command log: its commands are in it
        stack.push_async_callback(self._cleanup_started)
        await prepare_workspace(sb, workdir=self.meta.workdir, problem_statement=self.meta.problem_statement,
                                pre_commands=self.meta.pre_commands, agent_user=s.agent_user)
        self.snapshot = await take_snapshot(sb, self.meta.workdir)
        return sb

    async def _install_harness(self, sb: RecordingSandbox) -> None:
        """Install the harness's CLI into the sandbox (offline) and check it runs."""
        s = self.ctx.settings
        assert self.harness is not None
        await self.harness.install(sb, self.ctx.toolchain)
        version = await self.harness.verify(sb, s.agent_user)
        self.ctx.run.events.emit(HarnessReady(rollout_id=self.rid, harness=self.harness_name,
                                              version=version))

    async def _run_agent(self, sb: RecordingSandbox) -> None:
        """Run the CLI against the adapter session within its budget; its outcome and files are kept."""
        s = self.ctx.settings
        assert self.harness is not None and self.session is not None
        request = self.request = RunRequest(
            session_id=self.session.id, base_url=self.ctx.adapter_url, model=s.model_name,
            prompt=s.prompt_template.format(problem=self.meta.problem_statement, workdir=self.meta.workdir,
                                            problem_file=DEFAULT_PROBLEM_PATH),
            workdir=self.meta.workdir, time_budget_s=s.agent_time_budget_s, max_turns=s.max_turns,
            max_context_tokens=s.max_context_tokens, max_response_tokens=s.max_response_tokens,
            user=s.agent_user, artifacts_dir=self.folder,
        )
        started = time.monotonic()
        try:
            self.outcome = await self.harness.run(sb, request)
        except SandboxLimitExceeded as exc:
            # Its own processes ran the sandbox over a limit (a tool call can: a memory hog): a death
            # of the CLI like any other, judged by when it happened, not an outage.
            self.over_limit = exc
            self.outcome = HarnessOutcome(harness=self.harness_name, exit_code=None, crashed=True,
                                          duration_s=time.monotonic() - started, detail=str(exc))
        # Facts only: the termination reason is decided once, in rollout_finished.
        self.ctx.run.events.emit(AgentExited(
            rollout_id=self.rid, cli_s=round(self.outcome.duration_s, 3), exit_code=self.outcome.exit_code,
            detail=self.outcome.detail[:300],
        ))
        await self._save_cli_files(sb)

    async def _judge_run(self, sb: RecordingSandbox) -> tuple[TerminationReason, str]:
        """The run's termination from the CLI's outcome; a crash with the sandbox gone is the sandbox's."""
        reason, detail = self._policy_outcome()
        died = self.outcome is not None and self.outcome.crashed and self.over_limit is None
        if died and not await _alive(sb):
            reason, detail = TerminationReason.SANDBOX_LOST, f"the agent sandbox died during the run: {detail}"
        return reason, detail

    async def _capture_patch(self, sb: RecordingSandbox, reason: TerminationReason,
                             detail: str) -> tuple[TerminationReason, str]:
        """Capture the workspace's change as the patch to grade; a workspace that defeats the capture is the
        policy's doing (an empty patch), a lost sandbox an outage (raised)."""
        assert self.snapshot is not None
        self._patch_tried = True
        try:
            if self.over_limit is not None:
                raise self.over_limit  # that sandbox is gone: nothing left to capture
            self.patch = await capture_patch(sb, self.snapshot)
        except SandboxError as exc:
            if isinstance(exc, SandboxLost) or (not isinstance(exc, SandboxLimitExceeded)
                                                and not await _alive(sb)):
                raise
            # The sandbox answers, so the workspace itself defeats the capture (a FIFO git cannot
            # add, files too big to hash in time, deleted borrowed objects), or the agent's own
            # processes ran it over its limits: the policy's doing, graded as if it had changed
            # nothing rather than excluded as an outage.
            if exc is not self.over_limit:  # else the CLI's death already says why
                reason, detail = (TerminationReason.AGENT_ERROR_EXIT,
                                  f"the agent's workspace could not be captured as a patch: {exc}")
            self.patch = b""
            self.ctx.run.events.emit(ArtifactNotSaved(rollout_id=self.rid, name=RolloutFiles.PATCH,
                                                      error=f"{type(exc).__name__}: {exc}"))
        else:
            self.save(RolloutFiles.PATCH, self.patch)
        return reason, detail

    async def _grade(self) -> None:
        """Grade the patch in a fresh grader sandbox; the grader's output is saved either way."""
        s = self.ctx.settings
        try:
            self.grade_result = await grade(self.meta, self.patch or b"",
                                            open_sandbox=self.ctx.opener(self.spec.row, s.grader_sandbox),
                                            timeout=s.grader_timeout_s, suspect_policy=s.suspect_policy)
        except GraderError as exc:
            self.save(RolloutFiles.GRADER_LOG, getattr(exc, "output", "") or str(exc))
            raise
        self.save(RolloutFiles.GRADER_LOG, self.grade_result.output)

    def _policy_outcome(self) -> tuple[TerminationReason, str]:
        """Termination from the CLI's outcome and the adapter session, most telling first."""
        out = self.outcome
        assert out is not None and self.session is not None
        session = self.ctx.sessions.get(self.session.id)
        if session.infra_failure:
            return TerminationReason.ENGINE_ERROR, f"adapter session failed: {session.infra_failure}"
        if out.crashed:
            why = out.detail or out.stderr_tail[-300:]
            # Whose death it is depends on when, not how: once a policy answer has reached the CLI, its tool
            # calls run as the agent user and can kill the CLI (`kill -9 $PPID`, `kill -9 -1`). Calling
            # that infrastructure would exclude the episode from training: a penalty escape to learn.
            if any(r.kind == "main" for r in session.records):
                return TerminationReason.AGENT_ERROR_EXIT, f"the CLI died after the policy's answers: {why}"
            return TerminationReason.HARNESS_INSTALL, f"the CLI died before the policy's first answer: {why}"
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

    async def _save_cli_files(self, sb: Sandbox) -> None:
        """The CLI's own files (transcripts, logs) as ``cli-<name>``; a failure to read them is an event."""
        assert self.harness is not None and self.request is not None
        self._cli_files_taken = True
        try:
            cli_files = await self.harness.artifacts(sb, self.request)
        except (LegoError, OSError) as exc:
            self.ctx.run.events.emit(ArtifactNotSaved(rollout_id=self.rid, name="cli-*",
                                                      error=f"{type(exc).__name__}: {exc}"))
            cli_files = {}
        for name, data in cli_files.items():
            self.save_or_log(f"cli-{safe_name(name)}", data)

    async def _salvage(self, sb: RecordingSandbox) -> None:
        """Before the sandbox goes: take what a rollout that ended early never took (the CLI's files once
        it ran, the patch once the snapshot exists), if the sandbox still answers. Bounded by ``SALVAGE_S``;
        whatever cannot be taken is an ``artifact_not_saved`` event, never an exception."""
        want_cli = self.request is not None and not self._cli_files_taken
        want_patch = self.snapshot is not None and not self._patch_tried
        if not (want_cli or want_patch):
            return
        name = RolloutFiles.PATCH if want_patch else "cli-*"
        try:
            async with asyncio.timeout(SALVAGE_S):
                if not await _alive(sb):
                    raise SandboxError(f"the agent sandbox {sb.id} no longer answers")
                if want_cli:
                    await self._save_cli_files(sb)
                if want_patch:
                    assert self.snapshot is not None
                    self._patch_tried = True
                    self.patch = await capture_patch(sb, self.snapshot)
                    self.save_or_log(RolloutFiles.PATCH, self.patch)
        except (TimeoutError, LegoError, OSError) as exc:
            error = f"not saved within {SALVAGE_S:g} s" if isinstance(exc, TimeoutError) else str(exc)
            self.ctx.run.events.emit(ArtifactNotSaved(rollout_id=self.rid, name=name,
                                                      error=f"{type(exc).__name__}: {error}"))

    async def _cleanup_started(self) -> None:
        self._cleanup_t0 = time.monotonic()

    async def _cleanup_finished(self) -> None:
        if self._cleanup_t0 is not None:
            self.timings["cleanup"] = round(time.monotonic() - self._cleanup_t0, 3)
            self.ctx.run.events.emit(StageFinished(rollout_id=self.rid, stage="cleanup", status="ok",
                                                   duration_s=self.timings["cleanup"]))

    async def _save_sandbox_artifacts(self, sb: RecordingSandbox) -> None:
        self.save_or_log(RolloutFiles.commands(sb.label), sb.jsonl())
        if self.outcome is not None and self.outcome.event_log and self.outcome.event_log_path is None:
            self.save_or_log(RolloutFiles.CLI_EVENTS, self.outcome.event_log)

    async def _close_session(self) -> None:
        """Close the session once, saving its turn records; a failure is logged, never raised (the
        records we hold are still turned into samples, and the rollout's outcome stands)."""
        if self.session is None or self._session_closed:
            return
        self._session_closed = True
        try:
            self.session = self.ctx.sessions.close(self.session.id, out_dir=self.folder)
        except Exception as exc:  # noqa: BLE001 - recorded as an event with its traceback
            self.ctx.run.events.emit(SessionCloseFailed(
                rollout_id=self.rid, error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()
            ))

    async def _finish(self, reason: TerminationReason, detail: str, trace: str | None) -> RolloutResult:
        await self._close_session()
        reward = self.grade_result.reward if self.grade_result is not None else None
        samples: list[Sample] = []
        stats: TrajectoryStats | None = None
        # Main and side turns: the trajectory options decide whether side turns are trained.
        records = list(self.session.records) if self.session is not None else []
        main_turns = sum(1 for r in records if r.kind == "main")
        if records:
            start = time.monotonic()
            try:
                samples, stats = build_samples(
                    records, rollout_id=self.rid, group_index=self.spec.group_index,
                    index=self.spec.index, reward=reward, termination=reason,
                    metadata={"instance_id": self.meta.instance_id, "harness": self.harness_name},
                    options=self.ctx.settings.trajectory,
                )
            except TrajectoryError as exc:
                if not is_infrastructure_failure(reason):
                    reason, detail = TerminationReason.ADAPTER_ERROR, f"samples: {exc}"
            except Exception as exc:  # noqa: BLE001 - a bug in building samples: recorded, never raised
                samples = []
                if trace is None:
                    reason, detail = TerminationReason.INTERNAL_ERROR, f"samples: {type(exc).__name__}: {exc}"
                    trace = traceback.format_exc()
            self.timings["samples"] = round(time.monotonic() - start, 3)
            if samples and self.folder is not None:
                try:
                    save_samples(samples, self.folder / RolloutFiles.SAMPLES)
                except OSError as exc:
                    self.ctx.run.events.emit(ArtifactNotSaved(rollout_id=self.rid, name=RolloutFiles.SAMPLES,
                                                              error=f"{type(exc).__name__}: {exc}"))
        result = RolloutResult(
            rollout_id=self.rid, instance_id=self.meta.instance_id, harness=self.harness_name,
            termination=reason, reward=reward, samples=samples, timings=self.timings, artifacts=self.folder,
            detail=detail, turns=main_turns, sampled_tokens=sum(len(r.output_ids) for r in records),
            group_index=self.spec.group_index, index=self.spec.index, trajectory=stats,
        )
        self.save_or_log(RolloutFiles.OUTCOME, json.dumps(result.summary(), indent=2))
        self.ctx.run.events.emit(RolloutFinished(
            rollout_id=self.rid, termination=reason, reward=reward, detail=detail[:500],
            infrastructure_failure=result.infrastructure_failure, timings=self.timings, turns=result.turns,
            traceback=trace,
        ))
        if self.on_result is not None:
            self.on_result(result)
        return result


async def generate(
    ctx: RolloutContext, spec: RolloutSpec, *, on_result: Callable[[RolloutResult], None] | None = None
) -> RolloutResult:
    """Run one rollout end to end; see the module docstring. Never raises for a failed rollout.

    :param on_result: called once with the result, also for a rollout that a cancellation cut short
        (termination ``interrupted``; generate() then re-raises the cancellation), so a caller that is
        being stopped still learns every outcome.
    """
    rollout = _Rollout(ctx, spec)
    rollout.on_result = on_result
    return await rollout.run()


async def _alive(sb: Sandbox) -> bool:
    """Whether the sandbox still runs commands (told apart: a crashed CLI from a dead sandbox)."""
    try:
        return (await sb.exec(["true"], timeout=15)).exit_code == 0
    except (LegoError, OSError):
        return False
