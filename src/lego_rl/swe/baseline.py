"""Baseline runs: the official tests on the base tree, run once per task and shared by its grades.

A row that names no tests is judged against a baseline: the same test run with no agent patch, in its
own fresh sandbox. The baseline is a property of the task, not of the patch, so one run serves every
grade of that task in the process (a GRPO group grades one task n times at once). It runs in a
task of its own, started when a grade begins, concurrently with the candidate's run: a grade then
takes about as long as one run of the tests (what ``rollout.guard_s`` budgets), and a grade that
gives up (cancelled, or its patch did not apply) does not cancel the run the others wait for.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from lego_rl.swe.testresults import TestRun
from lego_rl.tasks.model import TaskMetadata


@dataclass(frozen=True)
class Baseline:
    """The official tests' per-test report on the base tree (no agent patch)."""

    report: TestRun
    canary_seen: bool
    """Whether the canary tests ran (then a candidate run without them is suspect)."""
    duration_s: float


class BaselineCache:
    """Baselines by task, the most recent ``max_tasks`` kept (a report can hold thousands of tests)."""

    def __init__(self, max_tasks: int = 256) -> None:
        self.max_tasks = max_tasks
        self._done: OrderedDict[str, Baseline] = OrderedDict()
        self._running: dict[str, asyncio.Task[Baseline]] = {}

    @staticmethod
    def key(meta: TaskMetadata, timeout: float) -> str:
        """Everything that decides the baseline: the grading fields of the row and the timeout."""
        fields = meta.model_dump(mode="json", exclude={"problem_statement", "reference_patch", "agent"})
        return hashlib.sha256(json.dumps([fields, timeout], sort_keys=True).encode()).hexdigest()

    def known(self, key: str) -> bool:
        return key in self._done or key in self._running

    def put(self, key: str, baseline: Baseline) -> None:
        self._done[key] = baseline
        self._done.move_to_end(key)
        while len(self._done) > self.max_tasks:
            self._done.popitem(last=False)

    def start(self, key: str, run: Callable[[], Awaitable[Baseline]]) -> asyncio.Future[Baseline]:
        """The baseline for ``key``: done, already running (in this event loop), or started now."""
        if key in self._done:
            self._done.move_to_end(key)
            fut: asyncio.Future[Baseline] = asyncio.get_running_loop().create_future()
            fut.set_result(self._done[key])
            return fut
        task = self._running.get(key)
        if task is None or task.get_loop() is not asyncio.get_running_loop():
            task = asyncio.ensure_future(run())
            self._running[key] = task
            task.add_done_callback(lambda t: self._finished(key, t))
        return task

    def _finished(self, key: str, task: asyncio.Task[Baseline]) -> None:
        if self._running.get(key) is task:
            del self._running[key]
        if task.cancelled():
            return
        exc = task.exception()  # retrieved here, so a baseline nobody waited for logs no warning
        if exc is None:
            self.put(key, task.result())

    async def get(self, key: str, run: Callable[[], Awaitable[Baseline]]) -> Baseline:
        """Wait for the baseline; cancelling the waiter leaves the shared run going."""
        return await asyncio.shield(self.start(key, run))


BASELINES = BaselineCache()
"""The process-wide cache ``grade`` uses unless given another."""
