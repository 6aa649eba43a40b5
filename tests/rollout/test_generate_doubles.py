"""generate() around a TEST DOUBLE harness: internal errors, a failing session close, the harness's
adapter options and side turns. Everything else is real: the run directory, the adapter (HTTP) in
front of the scripted policy engine, bwrap sandboxes of the example tasks, the grader. The harness
double stands in for a CLI: its ``run`` speaks the Chat Completions protocol to the adapter, as a
CLI would, with the session id as its API key."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import assert_nothing_running, make_context, spec_for

from lego_rl.adapter.chat_completions import TITLE_PROMPT_PREFIX
from lego_rl.adapter.sessions import SessionRegistry
from lego_rl.harness.models import HarnessOutcome, RunRequest
from lego_rl.harness.toolchain import Toolchain
from lego_rl.rollout.generate import RolloutResult, generate
from lego_rl.runstore import read_events
from lego_rl.runstore.events import (
    RolloutFinished,
    RunEvent,
    SessionCloseFailed,
    SessionOpened,
    StageFinished,
)
from lego_rl.sandbox.base import Sandbox
from lego_rl.termination import TerminationReason
from lego_rl.trajectory.manager import TrajectoryOptions

NO_TOOLCHAIN = Toolchain(Path("/nonexistent-toolchain"))  # the double installs nothing


class DoubleHarness:
    """TEST DOUBLE of a HarnessHandle. ``requests`` lists the chat requests its "CLI" sends, in order:
    ``"main"`` or ``"title"`` (a side request: title generation). ``fail_install`` raises from install."""

    name = "double"

    def __init__(
        self,
        requests: list[str] | None = None,
        *,
        adapter_options: dict[str, Any] | None = None,
        fail_install: BaseException | None = None,
    ) -> None:
        self.requests = requests or []
        self.options = adapter_options or {"protocol": "chat"}
        self.fail_install = fail_install
        self.statuses: list[int] = []

    def adapter_options(self) -> dict[str, Any]:
        return dict(self.options)

    async def install(self, sandbox: Sandbox, toolchain: Toolchain) -> None:
        if self.fail_install is not None:
            raise self.fail_install

    async def verify(self, sandbox: Sandbox, user: str = "agent") -> str:
        return "double 1.0"

    async def artifacts(self, sandbox: Sandbox, request: RunRequest) -> dict[str, bytes]:
        return {}

    async def run(self, sandbox: Sandbox, request: RunRequest) -> HarnessOutcome:
        start = time.monotonic()
        headers = {"Authorization": f"Bearer {request.session_id}"}
        async with aiohttp.ClientSession() as http:
            for kind in self.requests:
                messages = [{"role": "user", "content": request.prompt}]
                if kind == "title":
                    messages.insert(0, {"role": "system", "content": TITLE_PROMPT_PREFIX + " the task."})
                body = {"model": request.model, "messages": messages, "max_tokens": 64}
                async with http.post(
                    f"{request.base_url}/v1/chat/completions", json=body, headers=headers
                ) as r:
                    self.statuses.append(r.status)
                    await r.read()
        return HarnessOutcome(harness=self.name, exit_code=0, duration_s=time.monotonic() - start)


def events_of(result: RolloutResult, run_root: Path) -> list[RunEvent]:
    return [
        e
        for e in read_events(run_root / "events.jsonl")
        if getattr(e, "rollout_id", None) == result.rollout_id
    ]


def the_finish(events: list[RunEvent]) -> RolloutFinished:
    """The one event naming the termination reason (asserted to be the only one)."""
    assert [e.kind for e in events if "termination" in type(e).model_fields] == ["rollout_finished"]
    finished = events[-1]
    assert isinstance(finished, RolloutFinished)
    return finished


def harness_for(double: Any) -> Callable[[str], Any]:
    return lambda name: double


# -- no sandbox needed ------------------------------------------------------------------------------


async def test_a_bug_in_harness_lookup_is_internal_error_with_its_traceback(
    example_rows: dict[str, Any], tmp_path: Path
) -> None:
    def buggy_lookup(name: str) -> Any:
        raise RuntimeError("TEST DOUBLE: a plain bug, outside lego's error model")

    sessions = SessionRegistry()
    ctx = make_context(
        tmp_path / "run", sessions, "http://127.0.0.1:9", NO_TOOLCHAIN, harness_for=buggy_lookup
    )
    result = await generate(ctx, spec_for(example_rows["lego-example-median"], "double"))
    ctx.run.close()
    assert result.termination is TerminationReason.INTERNAL_ERROR and result.infrastructure_failure
    assert "RuntimeError: TEST DOUBLE" in result.detail and result.reward is None
    events = events_of(result, tmp_path / "run")
    finished = the_finish(events)
    assert finished.termination is TerminationReason.INTERNAL_ERROR
    assert finished.traceback is not None and "buggy_lookup" in finished.traceback
    assert "RuntimeError: TEST DOUBLE" in finished.traceback
    stages = [(e.stage, e.status) for e in events if isinstance(e, StageFinished)]
    assert stages == [("harness_lookup", "failed")]
    assert sessions.open_ids() == []


class CloseFails(SessionRegistry):
    """TEST DOUBLE: a session registry whose close raises a plain bug after the real close."""

    def close(self, session_id: str, *, out_dir: Path | None = None) -> Any:
        super().close(session_id)
        raise RuntimeError("TEST DOUBLE: close blew up")


async def test_a_failing_session_close_is_an_event_and_the_reason_stands(
    example_rows: dict[str, Any], tmp_path: Path
) -> None:
    """The sandbox provider does not exist (sandbox_setup, after the session opened); closing the session
    then raises: an event with the traceback, and the rollout still ends as sandbox_setup."""
    ctx = make_context(
        tmp_path / "run",
        CloseFails(),
        "http://127.0.0.1:9",
        NO_TOOLCHAIN,
        harness_for=harness_for(DoubleHarness()),
        provider="no_such_provider",
    )
    result = await generate(ctx, spec_for(example_rows["lego-example-median"], "double"))
    ctx.run.close()
    assert result.termination is TerminationReason.SANDBOX_SETUP, result.detail
    assert "no_such_provider" in result.detail
    events = events_of(result, tmp_path / "run")
    (failed,) = [e for e in events if isinstance(e, SessionCloseFailed)]
    assert failed.error == "RuntimeError: TEST DOUBLE: close blew up" and ", in close\n" in failed.traceback
    assert the_finish(events).termination is TerminationReason.SANDBOX_SETUP


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"max_requests": 3}, 3),  # OpenCode's own cap
        ({"enforce_turn_limit": True}, 6),  # Codex: no turn flag, the adapter enforces max_turns (6 here)
        ({"max_requests": 900}, 500),  # a harness never raises the config's cap
    ],
)
async def test_the_harness_adapter_options_narrow_the_sessions_cap(
    options: dict[str, Any], expected: int, example_rows: dict[str, Any], tmp_path: Path
) -> None:
    ctx = make_context(
        tmp_path / "run",
        SessionRegistry(),
        "http://127.0.0.1:9",
        NO_TOOLCHAIN,
        harness_for=harness_for(DoubleHarness(adapter_options=options)),
        provider="no_such_provider",
        max_requests_per_session=500,
    )
    result = await generate(ctx, spec_for(example_rows["lego-example-median"], "double"))
    ctx.run.close()
    (opened,) = [e for e in events_of(result, tmp_path / "run") if isinstance(e, SessionOpened)]
    assert opened.max_requests == expected and opened.harness_options == options


# -- real bwrap sandboxes, the adapter and the grader -----------------------------------------------


@pytest.mark.root
async def test_a_bug_in_a_sandbox_step_is_internal_error_and_everything_is_cleaned_up(
    scripted_stack: Any, example_rows: dict[str, Any], tmp_path: Path
) -> None:
    stack = await scripted_stack(["never asked"], score=False)
    double = DoubleHarness(fail_install=RuntimeError("TEST DOUBLE: install hit a bug"))
    ctx = make_context(
        tmp_path / "run", stack.sessions, stack.url, NO_TOOLCHAIN, harness_for=harness_for(double)
    )
    result = await generate(ctx, spec_for(example_rows["lego-example-median"], "double"))
    ctx.run.close()
    assert result.termination is TerminationReason.INTERNAL_ERROR, result.detail
    events = events_of(result, tmp_path / "run")
    assert "install hit a bug" in (the_finish(events).traceback or "")
    stages = [(e.stage, e.status) for e in events if isinstance(e, StageFinished)]
    assert ("harness_install", "failed") in stages and ("cleanup", "ok") in stages
    assert result.artifacts is not None and (result.artifacts / "commands-agent.jsonl").is_file()
    assert_nothing_running(stack.sessions)


@pytest.mark.root
async def test_a_harness_request_cap_limits_the_session(
    scripted_stack: Any, example_rows: dict[str, Any], tmp_path: Path
) -> None:
    """The harness's ``max_requests`` of 2: the third request is refused, the rollout hits the turn limit."""
    stack = await scripted_stack(["one", "two", "three"], score=False)
    double = DoubleHarness(["main", "main", "main"], adapter_options={"max_requests": 2})
    ctx = make_context(
        tmp_path / "run", stack.sessions, stack.url, NO_TOOLCHAIN, harness_for=harness_for(double)
    )
    result = await generate(ctx, spec_for(example_rows["lego-example-median"], "double"))
    ctx.run.close()
    assert double.statuses[:2] == [200, 200] and double.statuses[2] >= 400
    assert len(stack.engine.calls) == 2 and result.turns == 2
    assert result.termination is TerminationReason.TURN_LIMIT, result.detail
    assert_nothing_running(stack.sessions)


@pytest.mark.root
@pytest.mark.parametrize("train_side_turns", [True, False])
async def test_side_turns_are_trained_exactly_when_the_option_says(
    train_side_turns: bool, scripted_stack: Any, example_rows: dict[str, Any], tmp_path: Path
) -> None:
    stack = await scripted_stack(["I will read the code first.", "Median of an even list"])
    double = DoubleHarness(["main", "title"])
    ctx = make_context(
        tmp_path / "run",
        stack.sessions,
        stack.url,
        NO_TOOLCHAIN,
        harness_for=harness_for(double),
        trajectory=TrajectoryOptions(train_side_turns=train_side_turns),
    )
    result = await generate(ctx, spec_for(example_rows["lego-example-median"], "double"))
    ctx.run.close()
    assert result.termination is TerminationReason.COMPLETED, result.detail
    assert double.statuses == [200, 200] and result.turns == 1  # one main turn; the title is a side turn
    main_call, side_call = stack.engine.calls
    trained = [[t for t, m in zip(s.tokens, s.loss_mask) if m == 1] for s in result.samples]
    assert main_call.output_ids in trained
    assert (side_call.output_ids in trained) is train_side_turns
    assert len(result.samples) == (2 if train_side_turns else 1)
    assert_nothing_running(stack.sessions)


@pytest.mark.root
async def test_a_bug_while_building_samples_is_internal_error_not_an_escape(
    scripted_stack: Any, example_rows: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def buggy_build(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("TEST DOUBLE: build_samples hit a bug")

    monkeypatch.setattr("lego_rl.rollout.generate.build_samples", buggy_build)
    stack = await scripted_stack(["I will look."], score=False)
    double = DoubleHarness(["main"])
    ctx = make_context(
        tmp_path / "run", stack.sessions, stack.url, NO_TOOLCHAIN, harness_for=harness_for(double)
    )
    result = await generate(ctx, spec_for(example_rows["lego-example-median"], "double"))
    ctx.run.close()
    assert result.termination is TerminationReason.INTERNAL_ERROR and result.samples == []
    assert "build_samples hit a bug" in (the_finish(events_of(result, tmp_path / "run")).traceback or "")
    assert_nothing_running(stack.sessions)
