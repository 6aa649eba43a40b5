"""The baseline cache: one run per task shared by concurrent grades, failures not kept, bounded."""

from __future__ import annotations

import asyncio

import pytest

from lego_rl.errors import GraderError
from lego_rl.swe.baseline import Baseline, BaselineCache
from lego_rl.swe.grader import named_tests
from lego_rl.swe.testresults import TestRun
from lego_rl.tasks.model import TaskMetadata


def _baseline(tag: str) -> Baseline:
    return Baseline(TestRun("pytest-junit", {tag: "FAILED"}), canary_seen=True, duration_s=0.1)


async def test_concurrent_grades_share_one_baseline_run_and_a_cancelled_waiter_does_not_stop_it() -> None:
    cache, runs, gate = BaselineCache(), [], asyncio.Event()

    async def run() -> Baseline:
        runs.append(1)
        await gate.wait()
        return _baseline("t")

    waiters = [asyncio.ensure_future(cache.get("k", run)) for _ in range(8)]  # a GRPO group of 8
    await asyncio.sleep(0)
    waiters[0].cancel()  # one grade gives up (its rollout was cancelled)
    assert cache.known("k")
    gate.set()
    results = await asyncio.gather(*waiters[1:])
    assert len(runs) == 1 and all(r is results[0] for r in results)
    assert await cache.get("k", run) is results[0] and len(runs) == 1  # done: from the cache


async def test_a_failed_baseline_is_not_kept() -> None:
    cache, calls = BaselineCache(), []

    async def failing() -> Baseline:
        calls.append(1)
        raise GraderError("baseline unusable")

    with pytest.raises(GraderError):
        await cache.get("k", failing)
    await asyncio.sleep(0)
    assert not cache.known("k")
    with pytest.raises(GraderError):
        await cache.get("k", failing)
    assert len(calls) == 2


def test_the_cache_is_bounded_and_keyed_by_grading_fields() -> None:
    cache = BaselineCache(max_tasks=2)
    for tag in ("a", "b", "c"):
        cache.put(tag, _baseline(tag))
    assert not cache.known("a") and cache.known("b") and cache.known("c")
    meta = TaskMetadata(instance_id="i", image="img", problem_statement="p", eval_cmd="pytest")
    same = meta.model_copy(update={"problem_statement": "reworded", "reference_patch": "diff"})
    assert BaselineCache.key(meta, 60) == BaselineCache.key(same, 60)
    assert BaselineCache.key(meta, 60) != BaselineCache.key(
        meta.model_copy(update={"eval_cmd": "pytest -k x"}), 60
    )
    assert BaselineCache.key(meta, 60) != BaselineCache.key(meta, 120)


def test_named_tests_from_row_metadata() -> None:
    base = {"instance_id": "i", "image": "img", "problem_statement": "p", "eval_cmd": "pytest"}
    assert named_tests(TaskMetadata(**base)) is None
    assert named_tests(TaskMetadata(**base, FAIL_TO_PASS='["a"]', PASS_TO_PASS="[]")) == (["a"], [])
    assert named_tests(TaskMetadata(**base, fail_to_pass=["a"], pass_to_pass=["b"])) == (["a"], ["b"])
    with pytest.raises(GraderError, match="metadata.fail_to_pass of i is a string but not a JSON list"):
        named_tests(TaskMetadata(**base, fail_to_pass="a, b"))
    with pytest.raises(GraderError, match="metadata.pass_to_pass of i must be a list of test names"):
        named_tests(TaskMetadata(**base, pass_to_pass=[1]))
