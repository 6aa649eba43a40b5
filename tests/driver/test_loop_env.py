"""Environments by entry point, their rows, their failures, and the loop's prompt stream.

Real pieces throughout: the installed entry point, the serving client against a port where nothing
listens (a dead engine), the toy environment's scoring.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lego_rl.chat.render import ChatRenderer
from lego_rl.cli.train_cmd import progress_line
from lego_rl.errors import ConfigError, TaskDataError
from lego_rl.driver.environments import (
    Completion,
    EnvOutcome,
    Sampler,
    available_environments,
    completion_sample,
    load_environment,
)
from lego_rl.driver.loop import DataCursor, LoopProgress, Prompt, PromptStream, RolloutSlot
from lego_rl.driver.toy_env import FirstLetterEnv, make_rows, score
from lego_rl.compose.train_session import env_rollout_fn, load_env_prompts
from lego_rl.runstore import RunDir, read_events
from lego_rl.runstore.env_rollouts import MAX_COMPLETIONS, METADATA_CHARS, env_rollouts, read_env_rollout
from lego_rl.serving.client import ServingClient
from lego_rl.serving.tiny_model import ensure_tiny_model
from lego_rl.termination import TerminationReason as TR


def test_first_letter_is_installed_through_its_entry_point() -> None:
    assert available_environments()["first_letter"] == "lego_rl.driver.toy_env:FirstLetterEnv"
    env = load_environment("first_letter", {"max_tokens": 2})
    assert isinstance(env, FirstLetterEnv) and env.max_tokens == 2


def test_built_in_environments_load_without_package_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    """A source tree on PYTHONPATH has no entry points (no dist-info): the built-in environment still loads,
    and an installed entry point of the same name would win over it."""
    import lego_rl.driver.environments as envs

    monkeypatch.setattr(envs, "entry_points", lambda group: [])
    assert available_environments() == {"first_letter": "lego_rl.driver.toy_env:FirstLetterEnv"}
    assert isinstance(load_environment("first_letter"), FirstLetterEnv)
    from importlib.metadata import EntryPoint

    other = EntryPoint(name="first_letter", value="lego_rl.driver.toy_env:make_rows", group=envs.ENTRY_POINT_GROUP)
    monkeypatch.setattr(envs, "entry_points", lambda group: [other])
    assert available_environments()["first_letter"] == "lego_rl.driver.toy_env:make_rows"


def test_bad_options_and_unknown_names_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"refused its options \{'max_tokens': 0\}.*at least 1"):
        load_environment("first_letter", {"max_tokens": 0})
    with pytest.raises(ConfigError, match=r"refused its options.*unexpected keyword"):
        load_environment("first_letter", {"nope": 1})
    with pytest.raises(ConfigError, match="no environment 'x'.*first_letter"):
        load_environment("x")


@pytest.mark.parametrize(("answer", "reward"), [(" apple", 1.0), ("Ant", 1.0), ("\n a", 1.0), ("bat", 0.0),
                                                ("", 0.0), ("  ", 0.0), ("<tool_call>a", 0.0)])
def test_first_letter_score_reads_the_first_non_blank_character(answer: str, reward: float) -> None:
    assert score("a", answer) == reward


def test_completion_becomes_a_sample_with_the_prompt_masked() -> None:
    c = Completion(prompt_ids=[1, 2, 3], output_ids=[7, 8], logprobs=[-0.5, -1.25], weight_versions=[4, 4],
                   finish_reason="stop", text="x")
    s = completion_sample(c, rollout_id="r", group_index=2, index=1, reward=1.0, termination=TR.COMPLETED)
    assert s.tokens == [1, 2, 3, 7, 8] and s.loss_mask == [0, 0, 0, 1, 1]
    assert s.rollout_logprobs == [0.0, 0.0, 0.0, -0.5, -1.25] and s.weight_versions == [-1, -1, -1, 4, 4]


def test_env_rows_are_validated_with_file_and_line(tmp_path: Path) -> None:
    env = FirstLetterEnv()
    good = tmp_path / "rows.jsonl"
    good.write_text("".join(json.dumps(r) + "\n" for r in make_rows(5)))
    assert [p.id for p in load_env_prompts(env, good, key="rollout.prompt_data")] == \
        [r["id"] for r in make_rows(5)]
    for text, match in [('{"id": "a", "letter": "7"}\n', "row 1.*letter must be one ASCII letter"),
                        ('[1]\n', "row 1.*expected a JSON object"),
                        ('{"id": "a", "letter": "a"}\n{"id": "a", "letter": "b"}\n', "row 2.*'a' repeats line 1"),
                        ('{"id": "a", "letter": "a", "x": 1}\n', "row 1.*x: Extra inputs"),
                        ('{"id": "a"\n', "row 1.*not a first_letter row")]:
        bad = tmp_path / "bad.jsonl"
        bad.write_text(text)
        with pytest.raises(TaskDataError, match=match):
            load_env_prompts(env, bad, key="rollout.prompt_data")
    with pytest.raises(ConfigError, match="holds no rows"):
        (tmp_path / "empty.jsonl").write_text("\n")
        load_env_prompts(env, tmp_path / "empty.jsonl", key="rollout.prompt_data")


async def test_dead_engine_is_an_engine_error_rollout_not_an_exception(tmp_path: Path) -> None:
    renderer = ChatRenderer.from_pretrained(ensure_tiny_model())
    async with ServingClient(["http://127.0.0.1:9"], retry_deadline_s=0.2) as client:
        sampler = Sampler(client, renderer, temperature=1.0, top_p=1.0, top_k=-1, max_tokens=4)
        run = RunDir.open(tmp_path / "run", config={})
        fn = env_rollout_fn(FirstLetterEnv(), sampler, run)
        res = await fn(Prompt("fl-0", FirstLetterEnv().parse_row({"id": "fl-0", "letter": "a"})),
                       RolloutSlot("s00000-g0-fl-0-0", 0, 0))
        run.close()
    assert res.termination == TR.ENGINE_ERROR and res.samples == [] and res.reward is None
    assert "EngineUnavailable" in res.detail
    finished = [e for e in read_events(run.layout.events) if e.kind == "rollout_finished"]
    assert finished[0].infrastructure_failure and finished[0].termination == TR.ENGINE_ERROR


async def test_a_bug_in_the_environment_is_an_internal_error_with_its_traceback(tmp_path: Path) -> None:
    class Broken(FirstLetterEnv):
        async def rollout(self, row, sampler):  # type: ignore[no-untyped-def]
            raise KeyError("oops")

    run = RunDir.open(tmp_path / "run", config={})
    fn = env_rollout_fn(Broken(), None, run)  # type: ignore[arg-type]
    res = await fn(Prompt("fl-0", None), RolloutSlot("x", 0, 0))
    run.close()
    assert res.termination == TR.INTERNAL_ERROR and "KeyError" in res.detail
    [finished] = [e for e in read_events(run.layout.events) if e.kind == "rollout_finished"]
    assert finished.traceback and "oops" in finished.traceback


def test_prompt_stream_covers_each_epoch_and_resumes_from_its_cursor() -> None:
    prompts = [Prompt(f"p{i}", i) for i in range(5)]
    a = PromptStream(prompts, seed=3)
    drawn = [a.next().id for _ in range(12)]
    assert sorted(drawn[:5]) == sorted(drawn[5:10]) == [f"p{i}" for i in range(5)]
    assert drawn[:5] != drawn[5:10]  # reshuffled per epoch
    b = PromptStream(prompts, seed=3, cursor=DataCursor(epoch=1, position=2))
    assert [b.next().id for _ in range(5)] == drawn[7:12]
    with pytest.raises(ConfigError, match="no rows"):
        PromptStream([], seed=0)


def test_progress_line_shows_step_rollouts_reward_and_eta() -> None:
    p = LoopProgress(step=2, total_steps=10, in_flight=3, rollouts_done=5, rollouts_planned=16, phase="rollout",
                     last_reward=0.4375, last_solve_rate=0.25, step_seconds=[30.0, 30.0])
    line = progress_line(p).plain
    assert "step 3/10" in line and "rollouts 5/16 (in flight 3)" in line and "reward 0.438" in line
    assert "solved 25%" in line and "ETA 4m00s" in line and "pass@1 -" in line


class Verbose(FirstLetterEnv):
    """An environment of this test (user code, not a double of lego's): a long first answer, more turns than
    the record keeps, metadata past its bound; the completions are built here, so no engine is needed."""

    async def rollout(self, row, sampler):  # type: ignore[no-untyped-def]
        def answer(text: str, finish: str) -> Completion:
            return Completion(prompt_ids=[1, 2], output_ids=[3] * 7, logprobs=[-0.5] * 7,
                              weight_versions=[0] * 7, finish_reason=finish,  # type: ignore[arg-type]
                              text=text)

        long = "apple " * 1000  # 6,000 characters: its two ends are kept
        turns = [answer(long, "length")] + [answer(f"turn {k}", "stop") for k in range(1, 20)]
        return EnvOutcome(completions=turns, reward=1.0, metadata={"answer": long[:5], "log": "x" * 9000})


async def test_an_environment_rollout_keeps_its_texts_and_metadata_bounded(tmp_path: Path) -> None:
    run = RunDir.open(tmp_path / "run", config={})
    fn = env_rollout_fn(Verbose(), None, run)  # type: ignore[arg-type]
    res = await fn(Prompt("fl-0", None), RolloutSlot("s00000-g0-fl-0-0", 0, 0))
    broken = env_rollout_fn(_Broken(), None, run)  # type: ignore[arg-type]
    await broken(Prompt("fl-1", None), RolloutSlot("s00000-g0-fl-1-0", 0, 0))
    run.close()
    assert res.artifacts == run.layout.rollout("s00000-g0-fl-0-0")
    rec = read_env_rollout(run.layout, "s00000-g0-fl-0-0")
    assert rec is not None and (rec.environment, rec.instance_id, rec.reward) == ("first_letter", "fl-0", 1.0)
    assert rec.completions_total == 20 and len(rec.completions) == MAX_COMPLETIONS
    first = rec.completions[0]
    assert (first.text_chars, first.finish_reason, first.output_tokens) == (6000, "length", 7)
    assert first.text.startswith("apple " * 10) and first.text.rstrip().endswith("apple")
    assert "[... 2000 characters cut ...]" in first.text and len(first.text) < 4100
    assert [c.text for c in rec.completions[1:3]] == ["turn 1", "turn 2"]
    assert rec.metadata is None and rec.metadata_cut is not None and len(rec.metadata_cut) == METADATA_CHARS
    assert rec.metadata_cut.startswith('{"answer": "apple"')
    failed = read_env_rollout(run.layout, "s00000-g0-fl-1-0")
    assert failed is not None and failed.termination == TR.INTERNAL_ERROR and failed.completions == []
    assert "KeyError" in failed.detail and failed.reward is None
    assert [r.rollout_id for r in env_rollouts(run.layout)] == ["s00000-g0-fl-0-0", "s00000-g0-fl-1-0"]
    assert read_env_rollout(run.layout, "never-ran") is None


class _Broken(FirstLetterEnv):
    async def rollout(self, row, sampler):  # type: ignore[no-untyped-def]
        raise KeyError("oops")
