"""Distinct ids never collide and one rollout's trouble never ends the others.

Issue 18: instance ids ``collide/1`` and ``collide_1`` mapped to one artifact folder; at concurrency 1 the
second rollout's ``FileExistsError`` ended the whole check and lost the other results, at concurrency 3
the process hung. Real bwrap sandboxes, the real adapter in front of the scripted policy and the real
grader; the CLI is the TEST DOUBLE harness of test_generate_doubles.py (what is tested here is naming and
scheduling, not a CLI).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, REPO, assert_nothing_running, make_context, spec_for
from test_generate_doubles import NO_TOOLCHAIN, DoubleHarness, harness_for
from test_rollout_check_cli import engine_thread  # noqa: F401 - the fixture

from lego_rl.driver.runner import RolloutRunner, plan
from lego_rl.rollout.generate import generate
from lego_rl.termination import TerminationReason

pytestmark = [pytest.mark.root]


def renamed(row: Any, instance_id: str) -> Any:
    return row.model_copy(update={"metadata": row.metadata.model_copy(update={"instance_id": instance_id,
                                                                             "agent": "double"})})


@pytest.mark.parametrize("concurrency", [1, 3])
async def test_ids_that_sanitise_alike_both_run_and_keep_their_outcomes(
    concurrency: int, scripted_stack: Any, example_rows: dict[str, Any], tmp_path: Path
) -> None:
    stack = await scripted_stack(lambda prompt, index: "I looked.", score=False)
    ctx = make_context(tmp_path / "run", stack.sessions, stack.url, NO_TOOLCHAIN,
                       harness_for=harness_for(DoubleHarness(["main"])))
    base = example_rows["lego-example-median"]
    rows = [renamed(base, "collide/1"), renamed(base, "collide_1"), renamed(base, "collide 1")]
    results = await RolloutRunner(ctx, concurrency=concurrency).run(plan(rows, 1))
    ctx.run.close()
    assert [r.instance_id for r in results] == ["collide/1", "collide_1", "collide 1"]
    assert [r.termination for r in results] == [TerminationReason.COMPLETED] * 3, [r.detail for r in results]
    folders = [r.artifacts for r in results]
    assert len(set(folders)) == 3 and all(f is not None and f.is_dir() for f in folders)
    for result in results:
        assert result.artifacts is not None
        outcome = json.loads((result.artifacts / "outcome.json").read_text())
        assert outcome["instance_id"] == result.instance_id and outcome["reward"] == 0.0
    assert_nothing_running(stack.sessions)


async def test_a_reused_rollout_id_is_a_result_not_an_exception(
    scripted_stack: Any, example_rows: dict[str, Any], tmp_path: Path
) -> None:
    """A caller that reuses a rollout id gets an internal_error result; the first rollout's artifacts
    stay as they were (never overwritten) and nothing starts for the second."""
    stack = await scripted_stack(lambda prompt, index: "I looked.", score=False)
    ctx = make_context(tmp_path / "run", stack.sessions, stack.url, NO_TOOLCHAIN,
                       harness_for=harness_for(DoubleHarness(["main"])))
    spec = spec_for(example_rows["lego-example-median"], "double", rollout_id="same/id")
    first = await generate(ctx, spec)
    assert first.artifacts is not None
    before = {p.name: p.read_bytes() for p in first.artifacts.iterdir()}
    second = await generate(ctx, spec)
    ctx.run.close()
    assert first.termination is TerminationReason.COMPLETED, first.detail
    assert second.termination is TerminationReason.INTERNAL_ERROR and second.artifacts is None
    assert "FileExistsError" in second.detail and "same/id" in second.detail
    assert {p.name: p.read_bytes() for p in first.artifacts.iterdir()} == before
    assert len(stack.engine.calls) == 1
    assert_nothing_running(stack.sessions)


@pytest.mark.slow
@pytest.mark.cli
@pytest.mark.parametrize("concurrency", [1, 3])
def test_rollout_check_runs_both_colliding_ids_and_saves_both_outcomes(
    concurrency: int,
    engine_thread: Any,  # noqa: F811
    toolchain: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The issue's own reproduction through `lego rollout-check` with the real Claude Code: a dataset
    holding ``collide/1`` and ``collide_1``."""
    from typer.testing import CliRunner

    from lego_rl.cli.main import app

    monkeypatch.chdir(REPO)
    base = json.loads((EXAMPLES / "tasks.jsonl").read_text().splitlines()[0])
    dataset = tmp_path / "dataset"  # the example dataset's files (rows name them relative to it), new rows
    dataset.mkdir()
    for entry in EXAMPLES.iterdir():
        if entry.name != "tasks.jsonl":
            (dataset / entry.name).symlink_to(entry)
    data = dataset / "tasks.jsonl"
    rows = []
    for instance_id in ("collide/1", "collide_1"):
        row = json.loads(json.dumps(base))
        row["label"] = row["metadata"]["instance_id"] = instance_id
        rows.append(json.dumps(row))
    data.write_text("\n".join(rows) + "\n")
    engine = engine_thread(lambda prompt, index: "Nothing to change.")
    run_root = tmp_path / "run"
    args = [
        "rollout-check", "-c", "lego.toml", "--data", str(data), "-n", "1", "--harness", "claude_code",
        "--vllm-url", engine.url, "--concurrency", str(concurrency), "--json",
        "--set", f'paths.run_root="{run_root}"', "--set", "adapter.port=0",
        "--set", "model.max_response_tokens=1024", "--set", "agent.time_budget_s=180",
    ]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 1, (res.output[-3000:], repr(res.exception))  # ran, no reward
    outcomes = [json.loads(line) for line in (run_root / "rollout-check" / "outcomes.jsonl").read_text().splitlines()]
    assert [(o["instance_id"], o["termination"]) for o in outcomes] == [
        ("collide/1", "completed"), ("collide_1", "completed")
    ], outcomes
    folders = sorted(p.name for p in (run_root / "sandboxes").iterdir())
    assert len(folders) == 2 and "collide_1-s0" in folders, folders
    assert_nothing_running()
