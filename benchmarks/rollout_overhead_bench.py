"""Orchestration overhead of one rollout on bwrap: everything generate() does except the agent's own turns
(the CLI process) and the tests' run time (the grader's eval command).

Each rollout is real: Claude Code (installed offline from the toolchain) in a bwrap sandbox, the adapter,
a fresh grader sandbox, Samples and artifacts on disk. Only the policy is a TEST DOUBLE: the scripted
engine of tests/support (one tool call writing the median task's reference fix, then an answer), so the
agent's turns are short and repeatable and the overhead is what is left.

    .venv/bin/python benchmarks/rollout_overhead_bench.py [-n 3]

Figures: per stage seconds (median over rollouts); overhead = wall - CLI process - eval command; as a
ratio of this run's wall time (the baseline measured here) and projected onto typical rollouts whose
agent turns take 60 s / 300 s / 1200 s (the overhead does not grow with the agent's time). Needs root,
bubblewrap, scripts/build_rootfs.sh and scripts/setup_toolchain.sh. Runs in a loopback-only network
namespace of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import ctypes
import dataclasses
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
EXAMPLES = REPO / "examples" / "tasks"


def cage() -> None:
    """Loopback-only network namespace for this process (before any thread or socket exists)."""
    if ctypes.CDLL(None, use_errno=True).unshare(0x40000000) != 0:
        sys.exit(f"unshare(CLONE_NEWNET) failed: {os.strerror(ctypes.get_errno())} (run as root)")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)


def eval_seconds(grader_log: str) -> float:
    """Duration of the grader's verdict command ("===== eval as root: exit 0 (0.41 s)")."""
    found = re.findall(r"^===== eval as [^:]+: [^(]*\(([\d.]+) s\)", grader_log, flags=re.MULTILINE)
    return sum(float(x) for x in found)


async def one_rollout(i: int, root: Path, tiny: Path, renderer: Any, row: Any) -> dict[str, float]:
    from aiohttp import web
    from support.scripted_engine import ScriptedPolicyEngine, tool_call_text

    from lego_rl.adapter.core import AdapterCore
    from lego_rl.adapter.server import AdapterServer
    from lego_rl.adapter.sessions import SessionRegistry
    from lego_rl.config.resolve import resolve
    from lego_rl.harness.plugins import get_harness, get_plugin_manager
    from lego_rl.harness.toolchain import Toolchain
    from lego_rl.images.importer import load_images_json
    from lego_rl.compose.rollout_check import settings_from_config
    from lego_rl.rollout.generate import RolloutContext, RolloutSpec, generate
    from lego_rl.runstore import RunDir, read_events
    from lego_rl.runstore.events import AgentExited
    from lego_rl.serving.client import ServingClient
    from lego_rl.swe.task_sandbox import SandboxTarget

    fix = base64.b64encode((EXAMPLES / "src/median/fix/stats/center.py").read_bytes()).decode()
    call = tool_call_text(
        "Bash", {"command": f"printf %s {fix} | base64 -d > stats/center.py", "description": "write the fix"}
    )

    def policy(prompt: str, index: int) -> str:
        return "Fixed." if "<tool_response>" in prompt else call

    engine = ScriptedPolicyEngine(tiny, policy)
    runners = []
    urls = []
    client = None
    sessions = SessionRegistry()
    try:
        for app in (engine.app(),):
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            runners.append(runner)
            urls.append(f"http://127.0.0.1:{runner.addresses[0][1]}")
        client = ServingClient(urls, vocab_size=renderer.vocab_size)
        core = AdapterCore(renderer, client, max_context_tokens=60000, max_response_tokens=1024)
        runner = web.AppRunner(AdapterServer(core, sessions).app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        pm = get_plugin_manager({})
        run = RunDir.open(root / f"run-{i}", config={"bench": True})
        ctx = RolloutContext(
            settings=dataclasses.replace(
                settings_from_config(resolve(environ={})),
                agent_sandbox=SandboxTarget("bwrap", {}, {"network": "host"}),
                grader_sandbox=SandboxTarget("bwrap", {}, {"network": "host"}),
                agent_time_budget_s=180,
                grader_timeout_s=60,
                guard_s=420,
                max_turns=6,
                max_context_tokens=60000,
                max_response_tokens=1024,
            ),
            run=run,
            sessions=sessions,
            adapter_url=f"http://127.0.0.1:{runner.addresses[0][1]}",
            harness_for=lambda name: get_harness(name, environ={}, pm=pm),
            toolchain=Toolchain(REPO / ".lego" / "toolchain"),
            images=load_images_json(EXAMPLES / "images.json"),
            dataset_dir=EXAMPLES,
        )
        start = time.monotonic()
        result = await generate(ctx, RolloutSpec(row=row, rollout_id=f"bench-{i}"))
        wall = time.monotonic() - start
        run.close()
    finally:
        if client is not None:
            await client.close()
        for runner in reversed(runners):
            await runner.cleanup()
    if result.reward != 1.0:
        sys.exit(f"rollout {i} did not score 1: {result.termination} {result.detail}")
    cli = next(e.cli_s for e in read_events(run.events.path) if isinstance(e, AgentExited))
    tests = eval_seconds((result.artifacts / "grader.log").read_text())
    return {
        **result.timings,
        "wall": wall,
        "cli": cli,
        "tests": tests,
        "stage_sum": sum(result.timings.values()),
        "overhead": wall - cli - tests,
    }


async def main(n: int) -> None:
    from lego_rl.chat.render import ChatRenderer
    from lego_rl.rollout.generate import STAGES
    from lego_rl.serving.tiny_model import ensure_tiny_model
    from lego_rl.tasks.rows import load_tasks

    tiny = ensure_tiny_model()
    renderer = ChatRenderer.from_pretrained(tiny)
    row = next(
        r
        for r in load_tasks(EXAMPLES / "tasks.jsonl").rows
        if r.metadata.instance_id == "lego-example-median"
    )
    row = row.model_copy(update={"metadata": row.metadata.model_copy(update={"agent": "claude_code"})})
    with tempfile.TemporaryDirectory(prefix="lego-rollout-bench-") as tmp:
        runs = [await one_rollout(i, Path(tmp), tiny, renderer, row) for i in range(n)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"rollouts: {n} (claude_code, bwrap, scripted policy, median task); medians in seconds")
    for key in STAGES:
        print(f"  stage {key:<16} {med.get(key, 0.0):7.3f}")
    print(
        f"  sum of stages          {med['stage_sum']:7.3f}   wall {med['wall']:.3f} "
        f"(unstaged {med['wall'] - med['stage_sum']:.3f} s = {(med['wall'] - med['stage_sum']) / med['wall']:.1%})"
    )
    print(f"  CLI process (agent's own turns) {med['cli']:.3f}   eval command (tests) {med['tests']:.3f}")
    print(
        f"  orchestration overhead {med['overhead']:7.3f} s = {med['overhead'] / med['wall']:.1%} of this run's "
        f"wall time (baseline), {med['overhead'] / med['stage_sum']:.1%} of the sum of its stages"
    )
    for agent_s in (60.0, 300.0, 1200.0):
        share = med["overhead"] / (med["overhead"] + agent_s + med["tests"])
        print(
            f"  projected: with {agent_s:>6.0f} s of agent turns the overhead is {share:.1%} of the rollout"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=3, help="rollouts to time (sequential)")
    args = parser.parse_args()
    cage()
    asyncio.run(main(args.n))
