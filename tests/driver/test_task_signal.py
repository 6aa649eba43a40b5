"""Zero-variance groups per task (``driver.task_signal``) and retiring the tasks that stopped carrying signal.

The groups hold real ``RolloutResult`` objects built by hand (no sample needed: the counter reads terminations
and rewards only); the prompt stream is the loop's own. test_loop.py runs the counting inside the training loop.
"""

from __future__ import annotations

import pytest

from lego_rl.driver.loop import PromptStream, TrainingError
from lego_rl.driver.scheduler import Group, Prompt
from lego_rl.driver.task_signal import TaskSignal
from lego_rl.rollout.generate import RolloutResult
from lego_rl.termination import TerminationReason as TR
from lego_rl.train.advantages import admission_policy

ADMISSION = admission_policy("exclude")


def group(task: str, *outcomes: float | None) -> Group:
    """A group of ``task``: one rollout per outcome (None: lost to the infrastructure)."""
    results = [RolloutResult(rollout_id=f"{task}-{i}", instance_id=task, harness="h",
                             termination=TR.SANDBOX_SETUP if r is None else TR.COMPLETED, reward=r, samples=[],
                             timings={}, artifacts=None, index=i) for i, r in enumerate(outcomes)]
    return Group(Prompt(task, {}), 0, results)


def test_consecutive_zero_variance_groups_are_counted_and_signal_resets_them() -> None:
    sig = TaskSignal(["a", "b", "c"])
    assert sig.observe([group("a", 1, 1, 1), group("b", 0, 1, 0)], ADMISSION) == ({"a": 1}, [])
    assert sig.observe([group("a", 1, 1, None), group("b", 0, 0, 0)], ADMISSION) == ({"a": 2, "b": 1}, [])
    # one admitted rollout is no evidence: the streak stays; variance resets it
    assert sig.observe([group("a", None, None, 1), group("b", 1, 0, 0)], ADMISSION) == ({}, [])
    assert sig.streaks == {"a": 2}
    # a task drawn twice in one step: the later group decides
    assert sig.observe([group("a", 1, 1), group("a", 0, 1)], ADMISSION) == ({}, [])
    assert sig.streaks == {} and sig.retired == []  # never retires at retire_after = 0


def test_a_task_is_retired_after_n_in_a_row_but_never_the_last_one() -> None:
    sig = TaskSignal(["a", "b"], retire_after=2)
    assert sig.observe([group("a", 1, 1), group("b", 0, 0)], ADMISSION) == ({"a": 1, "b": 1}, [])
    zero, retired = sig.observe([group("a", 1, 1), group("b", 0, 0)], ADMISSION)
    assert zero == {"a": 2, "b": 2} and retired == ["a"]  # b would be the last task: kept
    assert sig.observe([group("b", 0, 0)], ADMISSION) == ({"b": 3}, [])
    restored = TaskSignal(["a", "b"], retire_after=2)
    restored.load(sig.state())
    assert (restored.streaks, restored.retired) == ({"a": 2, "b": 3}, ["a"])
    restored.load(None)  # a checkpoint from before tasks were tracked
    assert (restored.streaks, restored.retired) == ({}, [])
    with pytest.raises(ValueError, match="retire_after"):
        TaskSignal(["a"], retire_after=-1)


def test_the_stream_never_draws_a_retired_prompt() -> None:
    prompts = [Prompt(f"p{i}", {}) for i in range(5)]
    stream = PromptStream(prompts, seed=3)
    stream.retired = {"p1", "p3"}
    drawn = [stream.next().id for _ in range(30)]
    assert set(drawn) == {"p0", "p2", "p4"} and all(drawn.count(p) == 10 for p in ("p0", "p2", "p4"))
    stream.retired = {p.id for p in prompts}
    with pytest.raises(TrainingError, match="every task of the training data is retired"):
        stream.next()
