"""`lego rollout-check`: real rollouts through generate(), with live progress and a final table."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from rich import box
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from lego_rl.cli.console import EXIT_FAILED, EXIT_INFRA, EXIT_OK, EXIT_USAGE, err, escape, fail, out
from lego_rl.cli.options import ConfigOpt, JsonOpt, SetOpt, load, refuse_config_errors, rollout_options
from lego_rl.errors import ConfigError, GraderError, TaskDataError
from lego_rl.runstore.events import Baseline

if TYPE_CHECKING:
    from lego_rl.compose.rollout_check import CheckReport
    from lego_rl.compose.sessions.check_session import RolloutCheckSession
    from lego_rl.rollout.generate import RolloutResult


EXIT_NOTHING_RAN = 4
"""Nothing was rolled out: with ``--baseline``, a task's unmodified image already passes its tests."""
EXIT_SIGTERM = 128 + signal.SIGTERM
"""Stopped by SIGTERM, after cleaning up (the shell's convention for a death by that signal)."""

T = TypeVar("T")

EXIT_CODES = f"""Exit codes:
{EXIT_OK}  at least one sample earned reward 1;
{EXIT_FAILED}  rollouts ran to a policy outcome and none earned reward (expected of a random model);
{EXIT_USAGE}  the configuration, the data or the harness is unusable: nothing was started;
{EXIT_INFRA}  infrastructure: every rollout failed in our infrastructure, or the baseline grader could not decide;
{EXIT_NOTHING_RAN}  nothing was rolled out: with --baseline, a task already passes unmodified;
{EXIT_SIGTERM}  stopped by SIGTERM: sandboxes cleaned up, the outcomes so far saved (Ctrl-C does the same)."""


async def _until_sigterm(work: Awaitable[T]) -> T:
    """Await ``work`` with SIGTERM cancelling it, as Ctrl-C does: every rollout cleans up its sandbox and
    saves its outcome before the process ends. (SIGTERM's default action ends the process at once,
    leaving overlay mounts and sandbox state behind and no outcome written.)"""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await work
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def exit_code(results: Sequence[RolloutResult]) -> int:
    """The verdict of finished rollouts: rewarded, ran without reward, or only infrastructure failures.

    Only a policy outcome says something about the model; a run whose every rollout failed in our own
    infrastructure must not read as "ran, no reward" to a launcher that accepts that.
    """
    if any(res.reward is not None and res.reward >= 1.0 for res in results):
        return EXIT_OK
    if results and all(res.infrastructure_failure for res in results):
        return EXIT_INFRA
    return EXIT_FAILED


def _fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _results_table(results: Sequence[RolloutResult]) -> Table:
    harnesses = sorted({res.harness for res in results})
    one_harness = len(harnesses) == 1
    title = f"Rollouts ({harnesses[0]})" if one_harness else "Rollouts"
    # No vertical rules and ids never split: the table must read in an 80-column log as well.
    table = Table(title=escape(title), title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("task#sample", no_wrap=True)
    if not one_harness:
        table.add_column("harness", no_wrap=True)
    table.add_column("termination", no_wrap=True)
    for col in ("reward", "turns", "tokens", "agent s"):
        table.add_column(col, justify="right", no_wrap=True)
    for res in results:
        # Ids and harness names come from the dataset: Text, so "[x]" in an id is shown, not read as markup.
        term = Text(res.termination.value, style="red" if res.infrastructure_failure else "")
        reward = Text("-" if res.reward is None else f"{res.reward:g}",
                      style="green" if res.reward is not None and res.reward >= 1 else "")
        row = [Text(f"{res.instance_id}#{res.index}"), *([] if one_harness else [Text(res.harness)]), term, reward,
               Text(str(res.turns)), Text(str(res.sampled_tokens)), Text(_fmt_s(res.timings.get("agent")))]
        table.add_row(*row)
    return table


def _print_baseline(event: Baseline) -> None:
    if event.error is not None:
        verdict, why = "[red]grader error[/]", event.error
    else:
        verdict, why = ("[red]passes (bad)[/]" if event.solved else "[green]fails (good)[/]"), event.reason
    err.print(f"baseline {escape(event.instance_id)}: {verdict} — {escape(why)}", highlight=False)


def rollout_check(
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    data: Annotated[Path | None, typer.Option("--data", help="Task rows (JSONL); default rollout.prompt_data.")] = None,
    ids: Annotated[list[str] | None, typer.Option("--ids", help="Only these instance ids (repeatable).")] = None,
    samples: Annotated[int, typer.Option("-n", "--samples", min=1, help="Samples per task.")] = 1,
    harness: Annotated[str | None, typer.Option("--harness", help="Harness for every task (default: each "
                                                "row's metadata.agent, else agent.default_harness).")] = None,
    vllm_url: Annotated[list[str] | None, typer.Option("--vllm-url", help="Use these vLLM servers instead of "
                                                       "the embedded engine (repeatable).")] = None,
    output: Annotated[Path | None, typer.Option("--output", help="Where samples and outcomes go "
                                                "(default $RUN_ROOT/rollout-check).")] = None,
    baseline: Annotated[bool, typer.Option("--baseline", help="First grade each unmodified task: it must "
                                           "fail, or its reward says nothing.")] = False,
    concurrency: Annotated[int, typer.Option(min=1, help="Rollouts in flight at once.")] = 4,
    as_json: JsonOpt = False,
) -> None:
    """Run real rollouts (CLI in a sandbox, adapter, engine, grader) over a dataset, without training."""
    try:
        r = load(config, overrides, rollout_options(data, vllm_url, harness))
        refuse_config_errors(r, hint="run `lego validate` for the full picture")
        from lego_rl.compose.sessions.check_session import RolloutCheckSession

        session = RolloutCheckSession(r, ids=ids)
    except (ConfigError, TaskDataError) as exc:
        fail(exc)
        raise typer.Exit(EXIT_USAGE) from None
    if baseline:
        _baseline_or_exit(session, as_json=as_json)
    report = _roll_out(session, samples=samples, harness=harness, concurrency=concurrency, output=output,
                       as_json=as_json)
    if as_json:
        out.print_json(json.dumps({"rewarded": report.rewarded, "rollouts": len(report.results),
                                   "terminations": dict(report.terminations), "run_root": str(session.run_dir.root),
                                   "results": [res.summary() for res in report.results]}))
    else:
        out.print(_results_table(report.results))
        counts = ", ".join(f"{k} {v}" for k, v in report.terminations.most_common())
        out.print(f"{report.rewarded}/{len(report.results)} rewarded; {counts}. Artifacts: {session.run_dir.root}",
                  markup=False, highlight=False)
    raise typer.Exit(exit_code(report.results))


def _baseline_or_exit(session: RolloutCheckSession, *, as_json: bool) -> None:
    """Grade every unmodified task first; exit when one already passes, the grader fails, or SIGTERM comes."""
    try:
        passing = asyncio.run(_until_sigterm(session.baseline(on_result=None if as_json else _print_baseline)))
    except asyncio.CancelledError:
        session.run_dir.close()
        fail("stopped by SIGTERM during the baseline", label="baseline")
        raise typer.Exit(EXIT_SIGTERM) from None
    except GraderError as exc:
        session.run_dir.close()
        fail(f"the grader could not decide: {exc}", label="baseline")
        raise typer.Exit(EXIT_INFRA) from None
    if passing:
        session.run_dir.close()
        fail(f"already solved without any change, nothing rolled out: {', '.join(passing)}", label="baseline")
        raise typer.Exit(EXIT_NOTHING_RAN)


def _roll_out(session: RolloutCheckSession, *, samples: int, harness: str | None, concurrency: int,
              output: Path | None, as_json: bool) -> CheckReport:
    """The session's rollouts under a progress bar (on stderr, none with ``--json``); SIGTERM exits."""
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, disable=as_json, transient=False) as bar:
        task = bar.add_task("rollouts", total=len(session.rows) * samples)

        def on_progress(event: str, spec: object, result: RolloutResult | None) -> None:
            if event == "finished" and result is not None:
                bar.advance(task)
                bar.update(task, description=escape(f"rollouts  {result.instance_id}#{result.index}: "
                                                    f"{result.termination.value}"))

        try:
            work = session.run(samples=samples, harness=harness, concurrency=concurrency, output=output,
                               progress=on_progress)
            return asyncio.run(_until_sigterm(work))
        except asyncio.CancelledError:
            fail(f"stopped by SIGTERM; sandboxes cleaned up, outcomes so far saved under "
                 f"{session.run_dir.root}", label="rollout-check")
            raise typer.Exit(EXIT_SIGTERM) from None


rollout_check.__doc__ = f"""{rollout_check.__doc__}

Saves tokens, loss masks, logprobs and per-rollout outcomes, and every artifact under RUN_ROOT.

{EXIT_CODES}
"""


def register(app: typer.Typer) -> None:
    app.command("rollout-check")(rollout_check)
