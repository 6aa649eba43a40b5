"""Difficulty screening from rollouts already recorded in run directories (``lego tasks screen --run``).

A task that the policy always solves or never solves gives a GRPO group no reward variance, so no
learning signal. Screening keeps the tasks solved by ``min_solved`` to ``max_solved`` of ``k`` attempts
(default 1 to k-1, the paper's "solved 1-3 times in four trials").

The attempts are read from the runs' event logs (``rollout_started`` names the task, ``rollout_finished``
gives reward and termination): the rollouts of a ``lego rollout-check -n k`` run (the policy through the
same stack as training) or of any run. Only policy outcomes count: a rollout lost to the infrastructure
is not an attempt (it says nothing about difficulty) and is reported in the termination mix. Per task
the first ``k`` attempts in log order are used (or the last ``k``: ``window``); a task with fewer is ``too few attempts`` (not kept:
record more rollouts for it and screen again; reading the logs again costs nothing, so a second screen
over more runs is the resume).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from lego_rl.errors import TaskDataError
from lego_rl.runstore.events import RolloutFinished, RolloutStarted
from lego_rl.runstore.layout import RunLayout
from lego_rl.runstore.log import read_events

Decision = Literal["kept", "always solved", "never solved", "outside the band", "too few attempts", "bad row"]


class TaskScreen(BaseModel):
    """One task's screening verdict (one line of the per-task report)."""

    instance_id: str
    attempts: int
    """Policy outcomes counted (at most ``k``)."""
    solved: int
    pass_rate: float | None
    decision: Decision
    infrastructure_failures: int = 0
    """Rollouts of this task lost to the infrastructure (not counted as attempts)."""
    infrastructure_reasons: dict[str, int] = {}
    """Those rollouts by termination reason (``sandbox_setup``: look at the row's image and repository)."""
    row: int | None = None
    """The task's line in the dataset."""
    detail: str = ""
    """Why a ``bad row`` is bad (nothing was rolled out for it)."""


@dataclass
class Attempts:
    """What the run logs say about each task."""

    rewards: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    """Per task, the rewards of its policy outcomes in log order."""
    infrastructure: Counter[str] = field(default_factory=Counter)
    infrastructure_reasons: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    """Per task, its infrastructure failures by termination reason."""
    started: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    """Per task, every rollout id started for it (finished or not): a new attempt needs a fresh one."""
    terminations: Counter[str] = field(default_factory=Counter)
    """Every finished rollout's termination reason (policy and infrastructure)."""
    runs: list[Path] = field(default_factory=list)


def read_attempts(runs: Iterable[Path]) -> Attempts:
    """Read the rollouts of the run directories ``runs`` (their ``events.jsonl``), in order."""
    found = Attempts()
    for run in runs:
        log = RunLayout(run).events
        if not log.is_file():
            raise TaskDataError(f"{run} holds no run: {log} does not exist")
        read_log(log, found)
        found.runs.append(run)
    return found


def read_log(log: Path, found: Attempts) -> Attempts:
    """Add the rollouts of one event log to ``found`` (a run whose log is elsewhere: ``paths.run_log``)."""
    task_of: dict[str, str] = {}
    for event in read_events(log):
        if isinstance(event, RolloutStarted):
            task_of[event.rollout_id] = event.instance_id
            found.started[event.instance_id].add(event.rollout_id)
        elif isinstance(event, RolloutFinished):
            iid = task_of.get(event.rollout_id)
            if iid is None:
                continue  # its start is in another log (a moved run log): no task to count it for
            found.terminations[event.termination.value] += 1
            if event.infrastructure_failure or event.reward is None:
                found.infrastructure[iid] += 1
                found.infrastructure_reasons[iid][event.termination.value] += 1
            else:
                found.rewards[iid].append(event.reward)
    return found


def screen(ids: Sequence[str], attempts: Attempts, *, k: int, min_solved: int = 1,
           max_solved: int | None = None, solved_at: float = 1.0,
           window: Literal["first", "last"] = "first") -> list[TaskScreen]:
    """A verdict for each of ``ids`` (dataset order). ``solved_at``: the reward that counts as solved.
    ``window="last"`` judges each task by its last ``k`` attempts: over a training run, the tasks that
    stopped carrying signal (always solved lately) fall out of the band and can be retired."""
    high = k - 1 if max_solved is None else max_solved
    if k < 1 or not 0 <= min_solved <= high <= k:
        raise ValueError(f"the band {min_solved}..{high} of k={k} is empty or outside 0..k")
    verdicts = []
    for iid in ids:
        every = attempts.rewards.get(iid, [])
        rewards = every[:k] if window == "first" else every[-k:]
        solved = sum(r >= solved_at for r in rewards)
        decision: Decision
        if len(rewards) < k:
            decision = "too few attempts"
        elif min_solved <= solved <= high:
            decision = "kept"
        elif solved == k:
            decision = "always solved"
        elif solved == 0:
            decision = "never solved"
        else:
            decision = "outside the band"
        verdicts.append(TaskScreen(instance_id=iid, attempts=len(rewards), solved=solved,
                                   pass_rate=round(solved / len(rewards), 4) if rewards else None,
                                   decision=decision, infrastructure_failures=attempts.infrastructure.get(iid, 0),
                                   infrastructure_reasons=dict(attempts.infrastructure_reasons.get(iid, {}))))
    return verdicts


def missing_attempts(ids: Sequence[str], attempts: Attempts, *, k: int) -> dict[str, int]:
    """Per task of ``ids``, the attempts still to roll out for ``k`` policy outcomes (tasks with none
    missing left out). A rollout lost to the infrastructure is no attempt, so it is rolled out again."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    return {iid: k - n for iid in ids if (n := len(attempts.rewards.get(iid, []))) < k}
