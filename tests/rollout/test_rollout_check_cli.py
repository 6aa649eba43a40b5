"""`lego rollout-check` through typer, end to end: lego.toml + --set, `--vllm-url` pointed at the scripted
policy (TEST DOUBLE at the model boundary, served over vLLM's generate route), `--baseline`, the final
table, the saved report, and the exit code contract (0 only when a sample earned reward 1)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import pytest
from aiohttp import web
from conftest import EXAMPLES, REPO, assert_nothing_running
from support.scripted_engine import ScriptedPolicyEngine
from test_generate_scripted import WRONG_MEDIAN, policy_writing
from typer.testing import CliRunner

from lego_rl.cli.main import app
from lego_rl.runstore import metric_catalog as mc
from lego_rl.runstore.log import follow_metrics

pytestmark = [pytest.mark.slow, pytest.mark.cli, pytest.mark.root]


class EngineThread:
    """The scripted engine's HTTP server on its own event loop (the CLI runs ``asyncio.run`` itself)."""

    def __init__(self, engine: ScriptedPolicyEngine) -> None:
        self.engine = engine
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.url = ""
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.runner = web.AppRunner(self.engine.app(), access_log=None)
        self.loop.run_until_complete(self.runner.setup())
        self.loop.run_until_complete(web.TCPSite(self.runner, "127.0.0.1", 0).start())
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        self.ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.runner.cleanup())
        self.loop.close()

    def __enter__(self) -> Self:
        self.thread.start()
        assert self.ready.wait(60)
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


@pytest.fixture
def engine_thread(tiny_model_dir: Path) -> Iterator[Any]:
    made: list[EngineThread] = []

    def start(script: Any) -> EngineThread:
        made.append(EngineThread(ScriptedPolicyEngine(tiny_model_dir, script, score=False)).__enter__())
        return made[-1]

    yield start
    for thread in made:
        thread.__exit__()


@pytest.mark.parametrize(
    ("content", "code"),
    [((EXAMPLES / "src/median/fix/stats/center.py").read_text(), 0), (WRONG_MEDIAN, 1)],
    ids=["fix-exit-0", "wrong-exit-1"],
)
def test_rollout_check_cli_exit_code_follows_the_reward(
    content: str,
    code: int,
    engine_thread: Any,
    toolchain: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(REPO)
    engine = engine_thread(policy_writing("claude_code", "stats/center.py", content))
    run_root = tmp_path / "run"
    args = [
        "rollout-check",
        "-c",
        "lego.toml",
        "--ids",
        "lego-example-median",
        "-n",
        "1",
        "--harness",
        "claude_code",
        "--vllm-url",
        engine.url,
        "--baseline",
        "--set",
        f'paths.run_root="{run_root}"',
        "--set",
        "adapter.port=0",
        "--set",
        "model.max_response_tokens=1024",
        "--set",
        "agent.time_budget_s=180",
    ]
    as_json = code == 0  # one case checks the JSON report, the other the operator's table
    res = CliRunner().invoke(app, args + (["--json"] if as_json else []))
    assert res.exit_code == code, (res.output[-3000:], repr(res.exception))
    if as_json:
        report = json.loads(res.stdout)
        [result] = report["results"]
        assert report["rewarded"] == 1 and report["run_root"] == str(run_root)
    else:
        # the table folds its cells into CliRunner's 80 columns: its title, then the one-line summary
        assert res.stdout.startswith("Rollouts")
        assert "0/1 rewarded; completed 1." in " ".join(res.stdout.split()), res.stdout
        result = json.loads((run_root / "rollout-check" / "outcomes.jsonl").read_text())
    assert result["termination"] == "completed" and result["reward"] == float(code == 0)
    outcomes = (run_root / "rollout-check" / "outcomes.jsonl").read_text().splitlines()
    assert [json.loads(line)["reward"] for line in outcomes] == [result["reward"]]
    events = [json.loads(line) for line in (run_root / "events.jsonl").read_text().splitlines()]
    baseline = [e for e in events if e["kind"] == "baseline"]
    assert [(e["instance_id"], e["solved"]) for e in baseline] == [("lego-example-median", False)]
    # The session's metrics row, through the declarations of a rollout-check run (step 0: its only session).
    [row] = list(follow_metrics(run_root / "metrics.jsonl").read())
    assert (row.step, mc.read(row.values, mc.ROLLOUTS), mc.read(row.values, mc.REWARD_MEAN),
            mc.read(row.values, mc.SOLVE_RATE)) == (0, 1.0, result["reward"], result["reward"])
    assert row.terminations == {"completed": 1}
    assert len(engine.engine.calls) == 2
    assert_nothing_running()
