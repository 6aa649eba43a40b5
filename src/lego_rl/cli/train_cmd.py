"""`lego train`: the training loop over a resolved config, with a live view on stderr."""

from __future__ import annotations

import asyncio
import inspect
import json
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.live import Live
from rich.text import Text

from lego_rl.cli.console import EXIT_INFRA, EXIT_OK, EXIT_USAGE, err, fail, out
from lego_rl.cli.options import ConfigOpt, JsonOpt, SetOpt, load, refuse_config_errors
from lego_rl.cli.progress_log import LineLog, duration, num
from lego_rl.errors import ConfigError, LegoError, RunDirLocked, TaskDataError

if TYPE_CHECKING:
    from lego_rl.driver.loop import LoopProgress
    from lego_rl.compose.sft_session import SftSession, SftSummary
    from lego_rl.driver.sft import SftProgress
    from lego_rl.compose.train_session import TrainSession, TrainSummary

EXIT_STOPPED = 130
"""Stopped by Ctrl-C or SIGTERM; the run directory holds a checkpoint to resume from."""

EXIT_LOCKED = 4
"""Another live process holds the run directory (``RUN_ROOT/run.lock``): nothing was started."""

EXIT_CODES = (
    "Exit codes:\n"
    f"{EXIT_OK}  every step of train.num_rollout ran; the final checkpoint is in RUN_ROOT/checkpoints;\n"
    f"{EXIT_USAGE}  the configuration or the data is unusable: nothing was started (the findings are printed);\n"
    f"{EXIT_INFRA}  the engine or the rollouts failed (a dead engine, every rollout of a step failed): see the "
    "message and RUN_ROOT/events.jsonl, fix it, then resume from the last checkpoint;\n"
    f"{EXIT_LOCKED}  another live process trains RUN_ROOT (it is named): nothing was started;\n"
    f"{EXIT_STOPPED}  stopped by Ctrl-C or SIGTERM: the step in flight was abandoned and the last completed step "
    "checkpointed; continue with --resume."
)


ENDED = ("completed", "stopped", "failed")
"""Phases after which nothing remains to estimate."""


def progress_line(p: LoopProgress) -> Text:
    """One status line: step, phase, rollouts, reward, ETA (plain text: no markup from data)."""
    eta = None if p.phase in ENDED else p.eta_s()
    return Text(
        f"step {min(p.step + 1, p.total_steps)}/{p.total_steps}  {p.phase:<8}  rollouts {p.rollouts_done}/"
        f"{p.rollouts_planned} (in flight {p.in_flight})  reward {num(p.last_reward)}  solved "
        f"{num(p.last_solve_rate, '.0%')}  pass@1 {num(p.last_pass_at_1)}  ETA {duration(eta)}"
    )


def sft_progress_line(p: SftProgress) -> Text:
    """The step in flight, and the loss of the last step that finished, named with its own step (the loss of
    the step in flight is not known until it ends)."""
    last = "" if p.last_loss_step is None else f" (step {p.last_loss_step + 1})"
    return Text(f"SFT step {min(p.step + 1, p.total_steps)}/{p.total_steps}  {p.phase:<8}  last loss "
                f"{num(p.last_loss)}{last}")


def _json_outcome(as_json: bool, status: str, exc: BaseException | None, run_root: Path, exit_code: int) -> None:
    """Under ``--json`` a run that did not complete still prints one object, so a script never parses empty stdout."""
    if as_json:
        out.print_json(json.dumps({"status": status, "error": str(exc) if exc is not None else "",
                                   "run_root": str(run_root), "exit_code": exit_code}))


def _progress(session: TrainSession | SftSession) -> LoopProgress | SftProgress | None:
    from lego_rl.compose.sft_session import SftSession

    if isinstance(session, SftSession):
        return session.runner.progress if session.runner is not None else None
    return session.loop.progress if session.loop is not None else None


def _status(session: TrainSession | SftSession) -> Text | None:
    from lego_rl.driver.sft import SftProgress

    p = _progress(session)
    if p is None:
        return None
    return sft_progress_line(p) if isinstance(p, SftProgress) else progress_line(p)


def _line_log(session: TrainSession | SftSession) -> LineLog:
    from lego_rl.compose.sft_session import SftSession

    sft = isinstance(session, SftSession)
    total = session.settings.steps if isinstance(session, SftSession) else session.settings.num_rollout
    return LineLog(session.run_dir.layout.metrics, every_s=session.r.config.log.heartbeat_s, total_steps=total,
                   sft=sft, emit=lambda line: err.print(line, soft_wrap=True, highlight=False, markup=False))


async def _drive(session: TrainSession | SftSession, *, live: Live | None,
                 lines: LineLog | None = None) -> TrainSummary | SftSummary:
    """Run the session; the first Ctrl-C/SIGTERM stops cleanly, a second one cancels at once."""
    loop = asyncio.get_running_loop()
    task: asyncio.Future[TrainSummary | SftSummary] = asyncio.ensure_future(session.run())
    signals = 0

    def on_signal(signum: int) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            from lego_rl.compose.sft_session import SftSession

            # An SFT step runs in a worker thread that cannot be interrupted: it is finished, not abandoned.
            what = ("finishing the SFT step in flight, then saving its checkpoint" if isinstance(session, SftSession)
                    else "abandoning the step in flight and saving a checkpoint of the last completed step")
            err.print(f"{signal.Signals(signum).name}: stopping — {what} (again to quit at once)", markup=False,
                      highlight=False)
            session.request_stop()
        else:
            task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=0.5)
            line = _status(session) if live is not None else None
            if live is not None and line is not None:
                live.update(line)
            if lines is not None:
                p = _progress(session)
                lines.show(_status(session), None if p is None else (p.step, p.phase))
        return task.result()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def train(
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    data: Annotated[Path | None, typer.Option("--data", help="Training rows (JSONL); default "
                                              "rollout.prompt_data.")] = None,
    environment: Annotated[str | None, typer.Option("--env", help="Train on a registered verifiable "
                                                    "environment (e.g. first_letter) instead of coding-agent "
                                                    "rollouts; sets train.environment.")] = None,
    steps: Annotated[int | None, typer.Option("--steps", min=1, help="Rollout steps (train.num_rollout).")] = None,
    run_root: Annotated[Path | None, typer.Option("--run-root", help="Run directory (paths.run_root); a new "
                                                  "one per experiment.")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the run in --run-root from its newest "
                                         "checkpoint (train.resume).")] = False,
    vllm_url: Annotated[list[str] | None, typer.Option("--vllm-url", help="Sample from these running vLLM "
                                                       "servers instead of starting the embedded engine "
                                                       "(repeatable).")] = None,
    sft: Annotated[Path | None, typer.Option("--sft", help="Supervised fine-tuning on these demonstrations "
                                             "(Samples as JSON lines) instead of GRPO; sets train.sft_data. "
                                             "--steps then counts SFT steps (train.sft_steps).")] = None,
    override: Annotated[list[str] | None, typer.Option("--override", help="With --resume: let this key that "
                                                        "shapes training (train.lr, model.*, the data, the "
                                                        "environment...) change from the run's last launch; "
                                                        "without it such a change is refused (repeatable; sets "
                                                        "train.resume_override).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Train the policy with GRPO: roll out, score, update, sync the engines, repeat.

    Each step draws rollout.batch_size prompts × rollout.samples_per_prompt rollouts, refills infrastructure failures, computes group-relative advantages, takes the optimizer step(s) and pushes the new weights to the engines. Everything goes to RUN_ROOT: config.json, events.jsonl, metrics.jsonl (one row per step) and checkpoints/. docs/training.md explains the loop and every key it reads.

    Examples:

    lego train -c lego.toml  (coding-agent rollouts through the harnesses)

    lego train --env first_letter --data toy.jsonl --steps 20  (the toy task)

    lego train -c lego.toml --run-root runs/exp1 --resume  (continue after a stop)

    lego train -c lego.toml --run-root runs/exp1 --resume --set train.lr=1e-5 --override train.lr  (continue at a new learning rate)

    lego train -c lego.toml --sft demos.jsonl --steps 30 --run-root runs/sft1  (supervised warm start; then --set model.checkpoint=runs/sft1/checkpoints/step-000029)

    The config is validated first (as `lego validate` does); a failing check starts nothing.
    """  # noqa: E501 (one line per paragraph: rich wraps help text itself)
    typed = _overrides(data=data, environment=environment, steps=steps, run_root=run_root, resume=resume,
                       vllm_url=vllm_url, sft=sft, override=override)
    session = _open(config, overrides, typed)
    if session is None:  # a torchrun rank other than 0: it followed rank 0 to the end
        raise typer.Exit(EXIT_OK)
    summary = _run(session, as_json=as_json)
    if as_json:
        out.print_json(json.dumps(summary.as_dict()))
    else:
        out.print(_summary_line(summary), markup=False, highlight=False)
    raise typer.Exit(EXIT_OK if summary.status == "completed" else EXIT_STOPPED)


def _overrides(*, data: Path | None, environment: str | None, steps: int | None, run_root: Path | None,
               resume: bool, vllm_url: list[str] | None, sft: Path | None,
               override: list[str] | None = None) -> dict[str, tuple[Any, str]]:
    """The command's options as typed config overrides (``--steps`` counts SFT steps with ``--sft``)."""
    typed: dict[str, tuple[Any, str]] = {}
    if data is not None:
        typed["rollout.prompt_data"] = (str(data), "--data")
    if environment is not None:
        typed["train.environment"] = (environment, "--env")
    if sft is not None:
        typed["train.sft_data"] = (str(sft), "--sft")
    if steps is not None:
        typed["train.sft_steps" if sft is not None else "train.num_rollout"] = (steps, "--steps")
    if run_root is not None:
        typed["paths.run_root"] = (str(run_root), "--run-root")
    if override:
        typed["train.resume_override"] = (list(override), "--override")
    if resume:
        typed["train.resume"] = (True, "--resume")
    if vllm_url:
        typed["serving.backend"] = ("vllm", "--vllm-url")
        typed["serving.urls"] = (list(vllm_url), "--vllm-url")
    return typed


def _open(config: Path | None, overrides: list[str] | None,
          typed: dict[str, tuple[Any, str]]) -> TrainSession | SftSession | None:
    """Resolve, refuse a config that fails a check, open the session (``compose.sessions.train``); exit 2 on
    unusable settings or data, 4 when another process holds the run directory."""
    try:
        r = load(config, overrides, typed)
        refuse_config_errors(r, hint="nothing was started; run `lego validate` for the full picture")
        from lego_rl.compose.sessions.train import open_training

        return open_training(r)
    except RunDirLocked as exc:
        fail(exc, label="run directory in use")
        raise typer.Exit(EXIT_LOCKED) from None
    except (ConfigError, TaskDataError) as exc:
        fail(exc)
        raise typer.Exit(EXIT_USAGE) from None


def _run(session: TrainSession | SftSession, *, as_json: bool) -> TrainSummary | SftSummary:
    """Drive the session with the view the terminal takes; a failure or a stop exits with its code."""
    from lego_rl.driver.loop import TrainingError
    from lego_rl.serving.errors import EngineFailed, EngineUnavailable

    root = session.run_dir.root
    try:
        if as_json:
            return asyncio.run(_drive(session, live=None))
        if not err.is_terminal:
            return asyncio.run(_drive(session, live=None, lines=_line_log(session)))
        starting = ("placing the trainer ranks and the engines on the Ray cluster..."
                    if session.r.config.cluster.mode == "ray" else "starting the engine and the trainer...")
        with Live(Text(starting), console=err, refresh_per_second=4, transient=False) as live:
            return asyncio.run(_drive(session, live=live))
    except (ConfigError, TaskDataError) as exc:
        fail(exc)
        raise typer.Exit(EXIT_USAGE) from None
    except (TrainingError, EngineUnavailable, EngineFailed) as exc:
        fail(f"{exc} (run directory: {root})", label="training failed")
        _json_outcome(as_json, "failed", exc, root, EXIT_INFRA)
        raise typer.Exit(EXIT_INFRA) from None
    except asyncio.CancelledError:
        fail(f"cancelled; the newest checkpoint in {root / 'checkpoints'} is where a resume starts", label="stopped")
        _json_outcome(as_json, "stopped", None, root, EXIT_STOPPED)
        raise typer.Exit(EXIT_STOPPED) from None
    except LegoError as exc:
        fail(exc, label="training failed")
        _json_outcome(as_json, "failed", exc, root, EXIT_INFRA)
        raise typer.Exit(EXIT_INFRA) from None


def _summary_line(summary: TrainSummary | SftSummary) -> str:
    from lego_rl.compose.train_session import TrainSummary

    if not isinstance(summary, TrainSummary):  # SFT
        return (f"SFT {summary.status}: {summary.steps_done}/{summary.sft_steps} steps, loss "
                f"{num(summary.first_loss)} -> {num(summary.last_loss)}. Checkpoint (model.checkpoint of the "
                f"GRPO run): {summary.checkpoint}")
    return (f"{summary.status}: {summary.steps_done}/{summary.num_rollout} steps, reward "
            f"{num(summary.last_reward_mean)}, weight version {summary.weight_version}. "
            f"Run directory: {summary.run_root}")


train.__doc__ = f"""{inspect.cleandoc(train.__doc__ or "")}

{EXIT_CODES}
"""


def register(app: typer.Typer) -> None:
    app.command("train")(train)
