"""Evidence 2 (issue 11): SFT warm start into a solve-rate band, then GRPO through real Claude Code in bwrap,
against a zero-advantage control from the same checkpoint.

Nothing below the model is simulated: the tiny model on lego's own CPU engine, the real adapter, Claude Code
installed offline into bubblewrap sandboxes, the task's hidden tests as the grader. The whole benchmark runs
in one loopback-only network namespace (it re-executes itself under ``unshare -n``, as ``make run`` does).

Protocol, on one task row (``--task``, default lego-example-median), everything in ``--out``:

1. ``demos.jsonl``: demonstrations recorded through Claude Code with the scripted policy at the model boundary
   (scripts/record_demos.py: one Bash call applying the reference patch), or ``--demos`` given.
2. SFT rounds: ``lego train --sft`` for ``--sft-steps`` more steps from the previous round's checkpoint, then
   the solve rate of the new checkpoint from ``--k`` rollouts (``lego tasks screen``, the config's policy with
   model.checkpoint pointed at it). Stops when the rate is inside [--band-low, --band-high], above it, or after
   ``--sft-rounds`` rounds; the rate and where it landed are printed either way.
3. Per seed, two ``TrainSession`` runs from that checkpoint, ``--steps`` GRPO steps of ``--group`` rollouts of
   the task each: ``grpo`` (the product's loss from train.*) and ``control``, the same run with
   ``train.control = "zero_advantage"`` (the product's switch: the loss sees every advantage as 0).
   Everything else (rollouts, sampling, optimizer, weight sync) is identical, so a rise in the grpo arm that
   the control lacks is the policy gradient's doing. The solve rate per step is that step's reward mean over
   its ``--group`` rollouts (the on-policy rate; reward is 1 exactly when the hidden tests pass).

Output: the SFT rounds (steps, loss, solve rate), per seed and arm the solve rate per step, and per arm the
gain (mean of the last 3 steps minus the SFT'd rate) with mean and spread over seeds, grpo minus control in
the same run. ``summary.json`` in ``--out`` has every figure.

model.max_response_tokens is raised to ``--max-response-tokens`` (default 512) for every stage: the demo's
tool call is ~330 tokens of the tiny tokenizer and lego.toml's 256 would cut it mid-patch, so the SFT'd
policy could never reproduce it.

    .venv/bin/python benchmarks/learning_real_bench.py --seeds 3 --steps 20 --group 4 --k 8
    .venv/bin/python benchmarks/learning_real_bench.py --seeds 1 --steps 2 --demos runs/x/demos.jsonl

Exit status 0 when every stage ran, 1 when a stage failed (its log's tail is printed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
NETNS_MARK = "LEGO_LEARNING_BENCH_NETNS"

from lego_rl.cli.options import load  # noqa: E402
from lego_rl.compose.train_session import TrainSession  # noqa: E402
from lego_rl.runstore import RunLayout, follow_metrics  # noqa: E402
from lego_rl.runstore import metric_catalog as mc  # noqa: E402

ARMS = ("grpo", "control")


def run_logged(argv: list[str], log: Path) -> int:
    """Run one stage's command with its output in ``log``; its exit status."""
    with log.open("wb") as fh:
        return subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO, check=False).returncode


def tail(path: Path, n: int = 2500) -> str:
    return path.read_bytes()[-n:].decode(errors="replace") if path.exists() else ""


def fail(stage: str, rc: int, log: Path) -> int:
    print(f"{stage}: exited {rc}; the end of {log}:\n{tail(log)}", flush=True)
    return 1


def common_sets(args: argparse.Namespace, task_file: Path) -> list[str]:
    sets = [f'rollout.prompt_data="{task_file}"', f"model.max_response_tokens={args.max_response_tokens}",
            f"agent.time_budget_s={args.time_budget}", "adapter.port=0"]
    for item in args.set:
        sets.append(item)
    return sets


def set_argv(sets: list[str]) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


def screen_rate(args: argparse.Namespace, checkpoint: str, root: Path, task_file: Path) -> tuple[int, int]:
    """(solved, attempts) of ``checkpoint`` on the task from ``--k`` rollouts through ``lego tasks screen``."""
    report = root.with_suffix(".report.jsonl")
    argv = [args.lego, "tasks", "screen", "-c", args.config, "--data", str(task_file), "-k", str(args.k),
            "-j", str(args.concurrency), "--report", str(report),
            *set_argv([*common_sets(args, task_file), f'model.checkpoint="{checkpoint}"',
                       f'paths.run_root="{root}"'])]
    rc = run_logged(argv, root.with_suffix(".log"))
    if rc not in (0, 1) or not report.exists():  # 1: the task is outside screen's own band, still measured
        raise StageFailed("screen", rc, root.with_suffix(".log"))
    row = json.loads(report.read_text().splitlines()[0])
    if row["attempts"] < args.k:  # a bad row or rollouts lost to the infrastructure: no rate to trust
        raise StageFailed(f"screen ({row['decision']}: {row['attempts']}/{args.k} attempts)", rc,
                          root.with_suffix(".log"))
    return int(row["solved"]), int(row["attempts"])


class StageFailed(Exception):
    def __init__(self, stage: str, rc: int, log: Path) -> None:
        super().__init__(stage)
        self.stage, self.rc, self.log = stage, rc, log


def latest(sft_root: Path) -> str:
    ckpts = sft_root / "checkpoints"
    return str(ckpts / (ckpts / "latest").read_text().strip())


def arm_worker(args: argparse.Namespace) -> int:
    """One GRPO arm (``--arm``) in this process: TrainSession on the resolved config (the control with
    train.control = "zero_advantage")."""
    torch.manual_seed(args.seed)
    task_file = Path(args.task_file)
    sets = [*common_sets(args, task_file), f'model.checkpoint="{args.checkpoint}"', f'paths.run_root="{args.run_root}"',
            f"train.num_rollout={args.steps}", "rollout.batch_size=1", f"rollout.samples_per_prompt={args.group}",
            f"rollout.concurrency={args.concurrency}", f"train.seed={args.seed}", "train.checkpoint_every=0",
            f'train.control="{"zero_advantage" if args.arm == "control" else "none"}"']
    r = load(Path(args.config), sets)
    session = TrainSession(r)
    summary = asyncio.run(session.run())
    print(json.dumps(summary.as_dict()))
    return 0 if summary.status == "completed" else 1


def step_rates(run_root: Path) -> tuple[list[float], dict[str, float]]:
    """The solve rate per step, and the mean seconds per step of its parts (for the cost projection)."""
    rows = list(follow_metrics(RunLayout(run_root).metrics).read())
    parts = (mc.TIME_STEP_S, mc.TIME_ROLLOUT_S, mc.TIME_TRAIN_S, mc.TIME_SYNC_S)
    means = {str(k): statistics.mean(mc.read(r.values, k) or 0.0 for r in rows) if rows else 0.0 for k in parts}
    return [mc.require(r.values, mc.REWARD_MEAN) for r in rows], means


def spread(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{statistics.mean(xs):+.2f} (min {min(xs):+.2f}, max {max(xs):+.2f}, n={len(xs)})"


def orchestrate(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} is not empty: every benchmark run gets a new folder (--out)")
    out.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()]
    picked = [r for r in rows if r["metadata"]["instance_id"] == args.task]
    if len(picked) != 1:
        raise SystemExit(f"--task {args.task!r} names {len(picked)} rows of {args.data}")
    row = picked[0]
    archive = row["metadata"].get("repo_archive")
    if archive and not Path(archive).is_absolute():  # relative to the dataset's folder, and the copy lives in --out
        row["metadata"]["repo_archive"] = str(Path(args.data).resolve().parent / archive)
    task_file = out / "task.jsonl"
    task_file.write_text(json.dumps(row) + "\n")
    started = time.time()
    timings: dict[str, float] = {}
    summary: dict[str, Any] = {"args": vars(args), "loadavg_start": os.getloadavg(), "timings_s": timings}

    def save() -> None:
        summary["loadavg_end"] = os.getloadavg()
        (out / "summary.json").write_text(json.dumps(summary, indent=2))

    try:
        demos = Path(args.demos).resolve() if args.demos else out / "demos.jsonl"
        if not args.demos:
            t0 = time.time()
            rc = run_logged([sys.executable, "scripts/record_demos.py", "-c", args.config, "--ids", args.task,
                             "-n", str(args.demos_n), "--run-root", str(out / "demos-run"), "--out", str(demos)],
                            out / "demos.log")
            timings["record_demos"] = time.time() - t0
            if rc != 0:
                raise StageFailed("record demos", rc, out / "demos.log")
        checkpoint = args.start_checkpoint or "lego:tiny"
        rounds: list[dict[str, Any]] = []
        summary["sft_rounds"] = rounds
        rate = 0.0
        for i in range(args.sft_rounds):
            root = out / f"sft-{i}"
            t0 = time.time()
            rc = run_logged([args.lego, "train", "-c", args.config, "--sft", str(demos), "--steps", str(args.sft_steps),
                             "--run-root", str(root),
                             *set_argv([*common_sets(args, task_file), f'model.checkpoint="{checkpoint}"',
                                        f"train.lr={args.sft_lr}", f"train.warmup_steps={args.sft_warmup}",
                                        "train.checkpoint_every=0"])],
                            root.with_suffix(".log"))
            sft_s = time.time() - t0
            if rc != 0:
                raise StageFailed(f"SFT round {i}", rc, root.with_suffix(".log"))
            checkpoint = latest(root)
            losses = [mc.read(row.values, mc.LOSS) for row in follow_metrics(RunLayout(root).metrics).read()]
            t0 = time.time()
            solved, attempts = screen_rate(args, checkpoint, out / f"screen-{i}", task_file)
            rate = solved / attempts if attempts else 0.0
            rounds.append({"round": i, "checkpoint": checkpoint, "sft_s": sft_s, "screen_s": time.time() - t0,
                           "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
                           "solved": solved, "attempts": attempts, "load_1min": os.getloadavg()[0]})
            print(f"SFT round {i}: {args.sft_steps} steps in {sft_s:.0f}s, loss {losses[0]:.3f} -> {losses[-1]:.3f}; "
                  f"solve rate {solved}/{attempts} = {rate:.0%} (screen {rounds[-1]['screen_s']:.0f}s)", flush=True)
            save()
            if rate >= args.band_low:
                break
        if not rounds and args.start_rate is not None:  # measured in an earlier run of this script
            rate = args.start_rate
            print(f"no SFT round: {checkpoint}'s solve rate given as {rate:.0%} (--start-rate)", flush=True)
        elif not rounds:  # --sft-rounds 0: GRPO straight from --start-checkpoint, its rate taken as 0
            print(f"no SFT round: the solve rate of {checkpoint} is not measured here; gains are against 0",
                  flush=True)
        landed = "inside" if args.band_low <= rate <= args.band_high else "outside"
        summary["sft_rate"], summary["sft_checkpoint"] = rate, checkpoint
        print(f"SFT'd solve rate {rate:.0%}: {landed} the band {args.band_low:.0%}-{args.band_high:.0%}", flush=True)
        if landed == "outside" and not args.grpo_anyway:
            print("not starting GRPO outside the band (--grpo-anyway to start it regardless)")
            save()
            return 1
        arms: list[dict[str, Any]] = []
        summary["arms"] = arms
        for seed in range(args.seeds):
            for arm in ARMS:
                if arm == "control" and args.control_seeds is not None and seed >= args.control_seeds:
                    continue  # the control's weights never move: its seeds only resample the start policy
                root = out / f"{arm}-seed{seed}"
                t0 = time.time()
                rc = run_logged([sys.executable, __file__, "--arm", arm, "--seed", str(seed), "--checkpoint", checkpoint,
                                 "--run-root", str(root), "--task-file", str(task_file), "--steps", str(args.steps),
                                 "--group", str(args.group), "--concurrency", str(args.concurrency),
                                 "--config", args.config, "--max-response-tokens", str(args.max_response_tokens),
                                 "--time-budget", str(args.time_budget), *[a for s in args.set for a in ("--set", s)]],
                                root.with_suffix(".log"))
                if rc != 0:
                    raise StageFailed(f"{arm} seed {seed}", rc, root.with_suffix(".log"))
                rates, per_step = step_rates(root)
                last = rates[-3:]
                arms.append({"arm": arm, "seed": seed, "rates": rates, "wall_s": time.time() - t0,
                             "gain": statistics.mean(last) - rate, "load_1min": os.getloadavg()[0],
                             "mean_s_per_step": per_step})
                print(f"seed {seed} {arm:7s} {time.time() - t0:6.0f}s  solve rate per step "
                      f"{[round(x, 2) for x in rates]}  gain {arms[-1]['gain']:+.2f}  s/step "
                      + " ".join(f"{k[5:-2]} {v:.0f}" for k, v in per_step.items()), flush=True)
                save()
    except StageFailed as exc:
        save()
        return fail(exc.stage, exc.rc, exc.log)
    print(f"\nTask {args.task}; start {summary['sft_rate']:.0%} after {len(rounds)} SFT round(s); {args.steps} GRPO "
          f"steps x {args.group} rollouts; {args.seeds} seed(s); {(time.time() - started) / 60:.1f} min in all; "
          f"load {summary['loadavg_start'][0]:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print("| seed | arm | solve rate per step | last-3 mean | gain vs SFT'd |")
    print("|---|---|---|---|---|")
    for a in arms:
        print(f"| {a['seed']} | {a['arm']} | {' '.join(f'{x:.2f}' for x in a['rates'])} | "
              f"{statistics.mean(a['rates'][-3:]):.2f} | {a['gain']:+.2f} |")
    gains = {arm: [a["gain"] for a in arms if a["arm"] == arm] for arm in ARMS}
    diffs = [g - c for g, c in zip(gains["grpo"], gains["control"])]  # the seeds that ran both arms
    for arm in ARMS:
        print(f"{arm}: gain {spread(gains[arm])}")
    print(f"grpo - control (same seed, {len(diffs)} seed(s)): {spread(diffs)}")
    if not arms:  # --seeds 0: the SFT rounds only
        save()
        return 0
    step_s = statistics.mean(a["wall_s"] / max(1, len(a["rates"])) for a in arms)
    print(f"cost: {step_s:.0f} s per GRPO step (arm wall / steps, start-up included); the full protocol "
          f"(3 seeds x 2 arms x 20 steps) at this rate: {3 * 2 * 20 * step_s / 3600:.1f} h plus the SFT rounds")
    summary["gain_grpo_minus_control"] = diffs
    save()
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="lego-example-median")
    ap.add_argument("--data", default=str(REPO / "examples/tasks/tasks.jsonl"))
    ap.add_argument("--demos", default=None, help="an existing demonstrations file (skips recording)")
    ap.add_argument("--demos-n", type=int, default=2, help="demonstrations to record")
    ap.add_argument("--start-checkpoint", default=None, help="first SFT round starts here (default lego:tiny)")
    ap.add_argument("--sft-steps", type=int, default=8, help="SFT steps per round")
    ap.add_argument("--sft-rounds", type=int, default=8)
    ap.add_argument("--sft-lr", type=float, default=2e-3)
    ap.add_argument("--sft-warmup", type=int, default=3,
                    help="train.warmup_steps of each SFT round (a fresh AdamW at full lr jumps off the demo)")
    ap.add_argument("--k", type=int, default=8, help="rollouts per solve-rate measurement after each SFT round")
    ap.add_argument("--band-low", type=float, default=0.10)
    ap.add_argument("--band-high", type=float, default=0.50)
    ap.add_argument("--start-rate", type=float, default=None,
                    help="with --sft-rounds 0: --start-checkpoint's solve rate measured earlier (gains are against it)")
    ap.add_argument("--grpo-anyway", action="store_true", help="run the GRPO arms even outside the band")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--control-seeds", type=int, default=None,
                    help="run the control arm for the first N seeds only (default: every seed)")
    ap.add_argument("--steps", type=int, default=20, help="GRPO steps per arm")
    ap.add_argument("--group", type=int, default=4, help="rollouts per GRPO step (one prompt x group)")
    ap.add_argument("--concurrency", type=int, default=4, help="rollouts in flight")
    ap.add_argument("--max-response-tokens", type=int, default=512)
    ap.add_argument("--time-budget", type=float, default=300.0, help="agent.time_budget_s per rollout")
    ap.add_argument("--config", default="lego.toml")
    ap.add_argument("--set", action="append", default=[], help="one more config override for every stage")
    ap.add_argument("--lego", default=str(REPO / ".venv" / "bin" / "lego"))
    ap.add_argument("--out", default=str(REPO / "runs" / time.strftime("learning-real-%Y%m%d-%H%M%S")))
    # worker mode (one GRPO arm), started by the orchestrating process
    ap.add_argument("--arm", choices=ARMS, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--run-root", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--task-file", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    # subprocess.run kills its child when an exception leaves it: a SIGTERM stops the stage running, too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.arm is not None:
        sys.exit(arm_worker(args))
    if os.environ.get(NETNS_MARK) != "1":  # every stage inside one loopback-only namespace (as make run)
        env = {**os.environ, NETNS_MARK: "1"}
        sys.exit(subprocess.run(["unshare", "-n", "bash", "-c", 'ip link set lo up && exec "$@"', "netns",
                                 sys.executable, __file__, *sys.argv[1:]], env=env, cwd=REPO, check=False).returncode)
    sys.exit(orchestrate(args))


if __name__ == "__main__":
    main()
