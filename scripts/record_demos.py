#!/usr/bin/env python3
"""Record SFT demonstrations through the real CLI: a scripted policy solves the tasks, the samples are kept.

The policy is the TEST DOUBLE at the model boundary (tests/support/scripted_engine.py): for each generate
call it answers with chosen text, tokenised by the real tiny-model tokenizer. Its script, per task row: one
Bash tool call that applies the row's ``reference_patch`` (a quoted here-document), then a final answer
once the tool result is in the prompt. Everything above the model boundary is real: `lego rollout-check`
with the given config (Claude Code in bwrap through lego's adapter, graded by the task's hidden tests in a
fresh sandbox), at the config's ``model.max_response_tokens``: the cap the policy trained on the result rolls
out at, so a call that does not fit it is refused before any rollout (``check_fits_cap``). The samples of the
rollouts that earned reward 1 (``collect_demonstrations``) are written to ``--out``, ready for
``lego train --sft``. The policy finds a prompt's row by the instance id or the statement's first line, so with
several rows the config's ``agent.prompt`` must carry ``{problem}`` (lego.toml's does).

    .venv/bin/python scripts/record_demos.py -c lego.toml --ids lego-example-median -n 2 --out demos.jsonl

Run it where the sandboxes can reach 127.0.0.1 (scripts/run_main_job.sh runs it in its loopback-only
namespace). Exit status: 0 when at least one demonstration was written, 1 when none earned reward 1, else
rollout-check's status.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from aiohttp import web  # noqa: E402
from support.scripted_engine import ScriptedPolicyEngine, tool_call_text  # noqa: E402

from lego_rl.cli.options import load  # noqa: E402
from lego_rl.driver.sft import collect_demonstrations  # noqa: E402
from lego_rl.compose.stack import model_dir  # noqa: E402
from lego_rl.trajectory.sample import save_samples  # noqa: E402

DONE = "I applied the fix; the task is done."


END = "LEGO_PATCH_END"


def patch_command(patch: str) -> str:
    """The patch as a quoted here-document: its text verbatim (the quotes stop expansion). Not base64: the
    policy trained on the demonstration must reproduce this call token by token within
    model.max_response_tokens, and base64 costs the tiny tokenizer ~3x the tokens of the diff itself (816 vs
    ~280 for lego-example-median), with no structure to learn from."""
    if END in patch.splitlines():  # bash would end the here-document there
        raise SystemExit(f"the reference patch contains the here-document terminator {END!r}")
    body = patch if patch.endswith("\n") else patch + "\n"
    return f"patch -p1 <<'{END}'\n{body}{END}"


def demo_call(row: dict[str, Any]) -> str:
    """The one tool call the script answers for ``row``: a Bash call applying its reference patch."""
    meta = row["metadata"]
    if not meta.get("reference_patch"):
        raise SystemExit(f"row {meta['instance_id']} has no reference_patch to demonstrate")
    return tool_call_text("Bash", {"command": patch_command(meta["reference_patch"]), "description": "Apply the fix"})


def check_fits_cap(rows: list[dict[str, Any]], tokenizer: Any, cap: int) -> None:
    """Refuse before any rollout when a demonstration's call (plus the end-of-message token the policy must also
    write) is longer than ``model.max_response_tokens``: the adapter would cut it there, Claude Code would exit 1
    ("exceeded the N output token maximum") and, worse, a policy trained on the demonstration could never
    reproduce it at that cap. The demonstrations are recorded at the cap the job trains and rolls out at."""
    for row in rows:
        n = len(tokenizer(demo_call(row))["input_ids"]) + 1
        if n > cap:
            raise SystemExit(f"the demonstration of {row['metadata']['instance_id']} is {n} tokens, over "
                             f"model.max_response_tokens = {cap}: raise it (MAX_RESPONSE_LEN) to at least {n}")


def task_policy(rows: list[dict[str, Any]]) -> Any:
    """The script. Which row a prompt belongs to: the instance id (Claude Code's prompt names it in its
    per-rollout paths; the problem statement itself is a file in the sandbox), else the problem statement's
    first line; with a single row, every prompt is that row's."""
    calls = []
    for row in rows:
        meta = row["metadata"]
        markers = (meta["instance_id"], meta["problem_statement"].strip().splitlines()[0][:60])
        calls.append((markers, demo_call(row)))

    def policy(prompt: str, index: int) -> str:
        if "<tool_response>" in prompt:
            return DONE
        for markers, call in calls:
            if any(m in prompt for m in markers):
                return call
        return calls[0][1] if len(calls) == 1 else DONE

    return policy


class EngineThread:
    """The scripted engine's HTTP server (vLLM's generate route) on its own event loop and thread."""

    def __init__(self, engine: ScriptedPolicyEngine) -> None:
        self.engine = engine
        self.url = ""
        self.ready = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        runner = web.AppRunner(self.engine.app(), access_log=None)
        self.loop.run_until_complete(runner.setup())
        self.loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        self.ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(runner.cleanup())

    def start(self) -> str:
        self.thread.start()
        if not self.ready.wait(120):
            raise SystemExit("the scripted engine did not start")
        return self.url

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-c", "--config", default="lego.toml")
    ap.add_argument("--data", default=str(REPO / "examples/tasks/tasks.jsonl"), help="task rows (JSONL)")
    ap.add_argument("--ids", default=None, help="comma-separated instance ids (default: every row)")
    ap.add_argument("-n", type=int, default=1, help="rollouts per task")
    ap.add_argument("--harness", default="claude_code")
    ap.add_argument("--run-root", default=None, help="rollout-check's run directory (default runs/demos-<time>)")
    ap.add_argument("--out", required=True, help="demonstrations file to write (Samples, JSON lines)")
    ap.add_argument("--lego", default=str(Path(sys.executable).with_name("lego")))
    ap.add_argument("--set", action="append", default=[], help="passed on to rollout-check")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if out.exists():
        raise SystemExit(f"{out} exists; demonstrations are never overwritten")
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()]
    if args.ids:
        wanted = args.ids.split(",")
        rows = [r for r in rows if r["metadata"]["instance_id"] in wanted]
        if len(rows) != len(wanted):
            raise SystemExit(f"unknown ids among {wanted}")
    run_root = Path(args.run_root or f"runs/demos-{time.strftime('%Y%m%d-%H%M%S')}")
    scripted = ScriptedPolicyEngine(model_dir("lego:tiny"), task_policy(rows), score=False)
    check_fits_cap(rows, scripted.tokenizer, load(Path(args.config), args.set).config.model.max_response_tokens)
    engine = EngineThread(scripted)
    url = engine.start()
    cmd = [args.lego, "rollout-check", "-c", args.config, "--data", args.data, "-n", str(args.n), "--harness",
           args.harness, "--vllm-url", url, "--set", f'paths.run_root="{run_root}"', "--set", "adapter.port=0"]
    for ident in args.ids.split(",") if args.ids else []:
        cmd += ["--ids", ident]
    for item in args.set:
        cmd += ["--set", item]
    try:
        rc = subprocess.run(cmd, check=False).returncode
    finally:
        engine.stop()
    if rc not in (0, 1):
        print(f"record_demos: rollout-check exited {rc}; see {run_root}/events.jsonl", file=sys.stderr)
        return rc
    demos = collect_demonstrations([run_root], min_reward=1.0)
    if not demos:
        print(f"record_demos: no rollout earned reward 1 (run directory {run_root})", file=sys.stderr)
        return 1
    save_samples(demos, out)
    rollouts = len({s.rollout_id for s in demos})
    print(f"record_demos: {rollouts} demonstration(s), {len(demos)} sample(s), "
          f"{sum(s.num_trained_tokens for s in demos)} trained tokens -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
