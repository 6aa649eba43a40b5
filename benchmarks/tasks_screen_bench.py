"""`lego tasks screen` end to end over a generated dataset: rollouts per minute, and every broken row named.

The dataset is tests/support/task_dataset.py's (copies of the example tasks, some broken on purpose: base
passes, reference fails, flaky, future history, hidden tests reachable, three malformed rows). Each task gets
k rollouts of real Claude Code in real bwrap sandboxes, through the real adapter and grader, against the
scripted policy (TEST DOUBLE at the model boundary, tests/support/scripted_engine.py, served over vLLM's
generate route): it reads the problem statement, then writes the reference fix with probability 1/2 (seeded),
else nothing. Then the same command again in the same run root (the baseline: the resume, which rolls out
nothing). Checks what screening must find: the rows whose repository already passes are always solved, the
flaky ones never solved, the malformed ones named as bad rows with nothing rolled out.

    .venv/bin/python benchmarks/tasks_screen_bench.py [--rows 50] [-k 2] [--concurrency 4]   (root: bwrap)
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from aiohttp import web  # noqa: E402
from support.scripted_engine import ScriptedPolicyEngine, tool_call_text  # noqa: E402
from support.task_dataset import generate  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from lego_rl.cli.main import app  # noqa: E402
from lego_rl.serving.tiny_model import ensure_tiny_model  # noqa: E402

EXAMPLES = REPO / "examples" / "tasks"
FIXES = {  # a phrase of the problem statement -> (file, reference fix)
    "parse_duration": ("timefmt/duration.py", (EXAMPLES / "src/duration/fix/timefmt/duration.py").read_text()),
    "stats.median": ("stats/center.py", (EXAMPLES / "src/median/fix/stats/center.py").read_text()),
    "textkit.slugify": ("textkit/slug.py", (EXAMPLES / "src/slugify/fix/textkit/slug.py").read_text()),
}


def coin_flip_fixer(seed: int) -> Any:
    rng = random.Random(seed)
    lock = threading.Lock()

    def policy(prompt: str, index: int) -> str:
        if "<tool_response>" not in prompt:
            return tool_call_text("Bash", {"command": "cat /tmp/PROBLEM_STATEMENT.md", "description": "Read it"})
        if "written " in prompt.rsplit("<tool_response>", 1)[-1]:
            return "Done."
        phrase = next(p for p in FIXES if p in prompt)
        with lock:
            fix = rng.random() < 0.5
        if not fix:
            return "I changed nothing."
        path, content = FIXES[phrase]
        blob = base64.b64encode(content.encode()).decode()  # no quoting trouble in the tool call
        command = f"printf %s {blob} | base64 -d > {path} && echo written {path}"
        return tool_call_text("Bash", {"command": command, "description": f"Write {path}"})

    return policy


class EngineThread:
    """The scripted engine's HTTP server on its own event loop (the CLI runs ``asyncio.run`` itself)."""

    def __init__(self, engine: ScriptedPolicyEngine) -> None:
        self.engine, self.url = engine, ""
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        threading.Thread(target=self._main, daemon=True).start()
        assert self.ready.wait(60)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        runner = web.AppRunner(self.engine.app(), access_log=None)
        self.loop.run_until_complete(runner.setup())
        self.loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        self.ready.set()
        self.loop.run_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50)
    parser.add_argument("-k", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    engine = EngineThread(ScriptedPolicyEngine(ensure_tiny_model(), coin_flip_fixer(0), score=False))
    with tempfile.TemporaryDirectory() as tmp:
        ds = generate(Path(tmp) / "data", rows=args.rows)
        run_root = Path(tmp) / "screen"
        argv = ["tasks", "screen", "-c", str(REPO / "lego.toml"), "--data", str(ds.path), "-k", str(args.k),
                "--vllm-url", engine.url, "--harness", "claude_code", "--concurrency", str(args.concurrency),
                "--json", "--set", f'paths.run_root="{run_root}"', "--set", f'sandbox.images="{ds.images}"',
                "--set", "adapter.port=0", "--set", "model.max_response_tokens=1024",
                "--set", "agent.time_budget_s=180"]
        timed = []
        for label in ("fresh", "resumed (baseline)"):
            start = time.monotonic()
            res = CliRunner().invoke(app, argv)
            wall = time.monotonic() - start
            got = json.loads(res.stdout)
            timed.append((label, wall, got["summary"], res.exit_code))
        (_, fresh_s, fresh, code), (_, resume_s, resumed, _) = timed
        tasks = {t["row"]: t for t in got["tasks"]}
        print(f"{args.rows} rows ({sum(e != 'valid' for e in ds.expected.values())} broken), k={args.k}, "
              f"Claude Code in bwrap, concurrency {args.concurrency}, exit {code}")
        print(f"{'run':>20} {'wall s':>8} {'rolled out':>10} {'reused':>6} {'rollouts/min':>12} {'s/rollout':>9}")
        for label, wall, summary, _ in timed:
            n = summary["rolled_out"]
            print(f"{label:>20} {wall:>8.1f} {n:>10} {summary['reused']:>6} "
                  f"{(60 * n / wall if n else 0):>12.1f} {(wall / n if n else 0):>9.2f}")
        print(f"fresh / resumed wall: {fresh_s / resume_s:.0f}x; decisions {fresh['decisions']}; "
              f"terminations {fresh['terminations']}")
        by_kind: dict[str, list[str]] = {}
        for row, kind in sorted(ds.expected.items()):
            by_kind.setdefault(kind, []).append(tasks[row]["decision"])
        for kind, decisions in by_kind.items():
            print(f"  {kind:>24}: {dict(sorted((d, decisions.count(d)) for d in set(decisions)))}")
        assert set(by_kind["base passes"]) == {"always solved"}, by_kind
        assert set(by_kind["flaky"]) == {"never solved"}, by_kind
        assert set(by_kind["malformed row"]) == {"bad row"}, by_kind
        assert resumed["rolled_out"] == 0 and resumed["decisions"] == fresh["decisions"]


if __name__ == "__main__":
    main()
