"""TEST DOUBLE for a long coding-agent training run: writes a run directory of production size (thousands of
rollouts, hundreds of steps) through the run store's own writers, so every line is a typed event a real run
could hold. Used where a real run of that size cannot be recorded here (the monitor's speed benchmark and its
large-run tests); the small real runs are recorded by `lego train` and `lego rollout-check` themselves.

What it imitates: per step, ``groups`` prompts × ``group_size`` rollouts over several harnesses, each going
through the coding-agent stages (sandbox setup, install, agent, patch, grading) with stage events, an
``agent_exited`` fact and one ``rollout_finished``; about 8 % infrastructure failures (refilled), policy
outcomes whose solve rate rises slowly, zero-variance groups, consistency figures in the metrics rows, and a
few rollouts' artifact folders (outcome, turn records, patch, grader log) for the drill-down.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from lego_rl.runstore import RunDir, StepMetrics
from lego_rl.runstore import metric_catalog as mc
from lego_rl.runstore.events import (
    AgentExited,
    CheckpointSaved,
    EvalFinished,
    HarnessReady,
    RolloutFinished,
    RolloutRefilled,
    RolloutStarted,
    StageFinished,
    StepFinished,
    StepStarted,
    TrainingFinished,
)

HARNESSES = ("claude_code", "codex", "opencode", "openhands")
STAGES = (
    ("sandbox_setup", 4.0),
    ("harness_install", 6.0),
    ("agent", 240.0),
    ("patch", 0.5),
    ("grading", 30.0),
)
INFRA = ("sandbox_setup", "engine_error", "grader_error", "harness_install")
POLICY = (
    "completed",
    "completed",
    "completed",
    "agent_error_exit",
    "turn_limit",
    "time_budget",
    "context_limit",
)
TOOLS = ("Bash", "Read", "Edit", "Grep", "Write")


def _turn_record(rid: str, turn: int, rng: random.Random, weight_version: int) -> str:
    tool = rng.choice(TOOLS)
    out = rng.randint(20, 400)
    return json.dumps(
        {
            "session_id": rid,
            "turn": turn,
            "kind": "main",
            "protocol": "anthropic",
            "prompt_ids": list(range(50)),
            "output_ids": list(range(out)),
            "logprobs": [-0.5] * out,
            "render_mode": "bridged" if turn else "full",
            "bridge_prefix_len": 40 if turn else 0,
            "finish_reason": "stop",
            "stop_reason": "tool_use",
            "parse_failures": 0,
            "tool_calls": 1,
            "weight_versions": [weight_version] * out,
            "started_at": 0.0,
            "total_s": 0.5,
            "text": f"<tool_call>\n<function={tool}>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>",
        }
    )


def write_synthetic_run(
    root: Path,
    *,
    steps: int = 200,
    groups: int = 10,
    group_size: int = 5,
    tasks: int = 400,
    artifacts: int = 20,
    seed: int = 0,
    finish: bool = True,
    start_ts: float = 1.8e9,
) -> RunDir:
    """Write the run (``steps × groups × group_size`` rollouts, refills on top) under ``root``; returns the
    open ``RunDir`` (closed already when ``finish``) so a test can keep appending to a "live" run."""
    rng = random.Random(seed)
    config = {
        "train": {"num_rollout": {"value": steps, "source": "synthetic"}},
        "rollout": {
            "batch_size": {"value": groups, "source": "synthetic"},
            "samples_per_prompt": {"value": group_size, "source": "synthetic"},
        },
    }
    run = RunDir.open(root, config=config)
    ts = start_ts
    version = 0
    task_ids = [f"repo__task-{i:04d}" for i in range(tasks)]
    skill = {t: rng.random() * 0.6 for t in task_ids}
    saved = 0
    emit = run.events.emit
    for step in range(steps):
        started = ts
        emit(StepStarted(ts=ts, step=step, weight_version=version))
        counts: dict[str, int] = {}
        rewards: list[float] = []
        refills = 0
        for g in range(groups):
            task = task_ids[(step * groups + g) % tasks]
            harness = HARNESSES[(step + g) % len(HARNESSES)]
            for i in range(group_size):
                attempt = 0
                rid = f"s{step:05d}-g{g}-{task}-{i}"
                while True:
                    ts += rng.random() * 0.4
                    emit(
                        RolloutStarted(
                            ts=ts, rollout_id=rid, instance_id=task, harness=harness, group_index=g, index=i
                        )
                    )
                    infra = rng.random() < 0.08 and attempt < 2
                    fail_stage = rng.randrange(len(STAGES)) if infra else -1
                    timings: dict[str, float] = {}
                    reason = ""
                    for k, (stage, scale) in enumerate(STAGES):
                        d = round(rng.lognormvariate(0, 0.5) * scale, 3)
                        timings[stage] = d
                        failed = k == fail_stage
                        emit(
                            StageFinished(
                                ts=ts + d,
                                rollout_id=rid,
                                stage=stage,  # type: ignore[arg-type]
                                status="failed" if failed else "ok",
                                duration_s=d,
                            )
                        )
                        if stage == "harness_install" and not failed:
                            emit(HarnessReady(ts=ts, rollout_id=rid, harness=harness, version="1.0"))
                        if stage == "agent" and not failed:
                            emit(AgentExited(ts=ts, rollout_id=rid, cli_s=d, exit_code=0, detail="ok"))
                        if failed:
                            reason = INFRA[min(k, len(INFRA) - 1)]
                            break
                    solved = False
                    if not reason:
                        reason = rng.choice(POLICY)
                        p = min(0.95, skill[task] + step / steps * 0.3)
                        solved = reason == "completed" and rng.random() < p
                    reward = None if infra else float(solved)
                    turns = rng.randint(1, 40)
                    emit(
                        RolloutFinished(
                            ts=ts + sum(timings.values()),
                            rollout_id=rid,
                            termination=reason,  # type: ignore[arg-type]
                            reward=reward,
                            detail=f"{reason} after {turns} turns",
                            infrastructure_failure=infra,
                            timings=timings,
                            turns=turns,
                        )
                    )
                    counts[reason] = counts.get(reason, 0) + 1
                    if saved < artifacts:
                        saved += 1
                        folder = run.rollout_dir(rid)
                        (folder / "outcome.json").write_text(
                            json.dumps(
                                {
                                    "rollout_id": rid,
                                    "instance_id": task,
                                    "harness": harness,
                                    "termination": reason,
                                    "reward": reward,
                                    "turns": turns,
                                    "timings": timings,
                                }
                            )
                        )
                        (folder / f"{rid}.turns.jsonl").write_text(
                            "".join(_turn_record(rid, t, rng, version) + "\n" for t in range(min(turns, 6)))
                        )
                        (folder / "patch.diff").write_text(
                            f"--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+{step}\n"
                        )
                        (folder / "grader.log").write_text(f"ran 3 tests: {'ok' if solved else 'FAILED'}\n")
                    if not infra:
                        rewards.append(float(solved))
                        break
                    attempt += 1
                    refills += 1
                    new = f"{rid.split('-refill')[0]}-refill{attempt}"
                    emit(
                        RolloutRefilled(
                            ts=ts,
                            step=step,
                            failed_rollout_id=rid,
                            new_rollout_id=new,
                            termination=reason,
                            attempt=attempt,
                        )
                    )  # type: ignore[arg-type]
                    rid = new
        ts += 30.0 + rng.random() * 10
        zero_var = sum(
            1 for g in range(groups) if len(set(rewards[g * group_size : (g + 1) * group_size])) == 1
        )
        trained = zero_var < groups
        t_train = 20.0 + rng.random() * 5
        t_sync = 2.0 + rng.random()
        version += int(trained)
        mean = sum(rewards) / len(rewards)
        drift = 0.0005 + (0.004 if 120 <= step < 125 else 0.0) + rng.random() * 0.0005
        values = {
            "reward_mean": mean,
            "solve_rate": mean,
            "rollouts": float(groups * group_size + refills),
            "refills": float(refills),
            "zero_variance_groups": float(zero_var),
            "trained": float(trained),
            "weight_version": float(version),
            "sampled_tokens": float(rng.randint(200_000, 400_000)),
            "time_rollout_s": ts - started,
            "time_train_s": t_train,
            "time_sync_s": t_sync,
            "time_step_s": ts - started + t_train + t_sync,
            "loss": 0.1 - step * 1e-4,
            "grad_norm": 1.0,
            "tokens": float(rng.randint(200_000, 400_000)),
            "consistency/pearson": 0.999 - drift,
            "consistency/mean_abs_diff": drift * 5,
            "consistency/p99_abs_diff": drift * 40,
            "consistency/max_abs_diff": drift * 200,
            "consistency/k3_kl": drift,
            "consistency/bridged/k3_kl": drift * 1.5,
            "consistency/full/k3_kl": drift * 0.5,
            "consistency/bridged/pearson": 0.998 - drift,
            "consistency/full/pearson": 0.9995 - drift,
            "policy_lag_mean": 1.0 if step else 0.0,
            "policy_lag_max": 1.0 if step else 0.0,
        }
        ts += t_train + t_sync
        run.metrics.append(
            StepMetrics(step=step, started_at=started, finished_at=ts, values=mc.declared_values(mc.TRAIN, values),
                        terminations=counts)
        )  # type: ignore[arg-type]
        emit(
            StepFinished(
                ts=ts,
                step=step,
                admitted_rollouts=groups * group_size,
                zero_variance_groups=zero_var,
                trained=trained,
                weight_version=version,
                reward_mean=mean,
            )
        )
        if (step + 1) % 50 == 0:
            emit(CheckpointSaved(ts=ts, step=step, path=str(root / "checkpoints" / f"step-{step:06d}")))
            emit(EvalFinished(ts=ts, step=step, pass_at_1=mean, reward_mean=mean, rows=20, samples_per_row=4))
    if finish:
        emit(TrainingFinished(ts=ts, status="completed", steps_done=steps))
        run.close()
    return run
