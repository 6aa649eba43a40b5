"""`lego rollout-check`: real rollouts through generate(), with live progress and a final table."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from lego_rl.cli.console import EXIT_FAILED, EXIT_INFRA, EXIT_OK, EXIT_USAGE, err, out
from lego_rl.cli.options import ConfigOpt, JsonOpt, SetOpt, load
from lego_rl.config.checks import run_checks
from lego_rl.errors import ConfigError, GraderError, TaskDataError


def _fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _results_table(results: list) -> Table:
    harnesses = sorted({res.harness for res in results})
    one_harness = len(harnesses) == 1
    title = f"Rollouts ({harnesses[0]})" if one_harness else "Rollouts"
    # No vertical rules and ids never split: the table must read in an 80-column log as well.
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("task#sample", no_wrap=True)
    if not one_harness:
        table.add_column("harness", no_wrap=True)
    table.add_column("termination", no_wrap=True)
    for col in ("reward", "turns", "tokens", "agent s"):
        table.add_column(col, justify="right", no_wrap=True)
    for res in results:
        term = f"[red]{res.termination.value}[/]" if res.infrastructure_failure else res.termination.value
        reward = "-" if res.reward is None else (f"[green]{res.reward:g}[/]" if res.reward >= 1 else f"{res.reward:g}")
        row = [f"{res.instance_id}#{res.index}", *([] if one_harness else [res.harness]), term, reward,
               str(res.turns), str(res.sampled_tokens), _fmt_s(res.timings.get("agent"))]
        table.add_row(*row)
    return table


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
    """Run real rollouts (CLI in a sandbox, adapter, engine, grader) over a dataset, without training.

    Saves tokens, loss masks, logprobs and per-rollout outcomes, and every artifact under RUN_ROOT.
    Exit 0 when at least one sample earned reward 1; 1 when none did (or a baseline already passes);
    2 when the configuration or the data is unusable; 3 when the baseline grader itself failed.
    """
    sets = list(overrides or [])
    if data is not None:
        sets.append(f'rollout.prompt_data="{data.resolve()}"')
    if vllm_url:
        sets += ['serving.backend="vllm"', "serving.urls=" + json.dumps(vllm_url)]
    try:
        r = load(config, sets)
        from lego_rl.rollout.harnesses import harness_inventory

        errors = [f for f in run_checks(r, harnesses=harness_inventory(r)) if f.severity == "error"]
        if errors:
            for f in errors:
                err.print(f"[bold red]config:[/] {f.message} — {f.fix}", highlight=False)
            err.print("run `lego validate` for the full picture")
            raise typer.Exit(EXIT_USAGE)
        from lego_rl.rollout.session import RolloutCheckSession

        session = RolloutCheckSession(r, ids=ids)
    except (ConfigError, TaskDataError) as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(EXIT_USAGE) from None
    if baseline:
        try:
            passing = asyncio.run(session.baseline(progress_console=None if as_json else err))
        except GraderError as exc:
            session.run_dir.close()
            err.print(f"[bold red]baseline:[/] the grader could not decide: {exc}", highlight=False)
            raise typer.Exit(EXIT_INFRA) from None
        if passing:
            session.run_dir.close()
            err.print(f"[bold red]baseline:[/] already solved without any change: {', '.join(passing)}")
            raise typer.Exit(EXIT_FAILED)
    total = len(session.rows) * samples
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, disable=as_json, transient=False) as bar:
        task = bar.add_task("rollouts", total=total)

        def on_progress(event: str, spec, result) -> None:  # type: ignore[no-untyped-def]
            if event == "finished":
                bar.advance(task)
                bar.update(task, description=f"rollouts  {result.instance_id}#{result.index}: "
                           f"{result.termination.value}")

        report = asyncio.run(session.run(samples=samples, harness=harness, concurrency=concurrency,
                                         output=output, progress=on_progress))
    if as_json:
        out.print_json(json.dumps({"rewarded": report.rewarded, "rollouts": len(report.results),
                                   "terminations": dict(report.terminations), "run_root": str(session.run_dir.root),
                                   "results": [res.summary() for res in report.results]}))
    else:
        out.print(_results_table(report.results))
        counts = ", ".join(f"{k} {v}" for k, v in report.terminations.most_common())
        out.print(f"{report.rewarded}/{len(report.results)} rewarded; {counts}. Artifacts: {session.run_dir.root}")
    raise typer.Exit(EXIT_OK if report.rewarded else EXIT_FAILED)


def register(app: typer.Typer) -> None:
    app.command("rollout-check")(rollout_check)
