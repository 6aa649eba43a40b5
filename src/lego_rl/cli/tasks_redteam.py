"""`lego tasks check --red-team`: the attack catalogue against every task, and which class earns reward.

Kept out of tasks_cmd.py (the command's options live there): this module drives ``swe.redteam_run`` and
renders its reports. Exit codes: 0 every task sound; 1 some task hackable, already passing unmodified, or its
reference patch lost reward; 3 no such finding, but some task could not be red-teamed (survey or controls
failed: run again); 2 (bad usage) is the caller's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from lego_rl.cli.console import EXIT_FAILED, EXIT_INFRA, EXIT_OK, err, escape, out

_COLORS = {"rewarded": "bold red", "escaped": "red", "held": "green", "n/a": "dim",
           "sound": "green", "hackable": "bold red", "base passes": "yellow", "control failed": "yellow",
           "error": "red"}
FINDINGS = ("hackable", "base passes", "control failed")
"""Task verdicts that make the exit status 1."""


def red_team_exit_code(reports: Sequence[Any]) -> int:
    if any(r.verdict in FINDINGS for r in reports):
        return EXIT_FAILED
    return EXIT_INFRA if any(r.verdict == "error" for r in reports) else EXIT_OK


def run_red_team(rows: Sequence[Any], *, data: Path, options: Any, concurrency: int,
                 classes: list[str] | None, output: Path | None, as_json: bool) -> int:
    """Red-team ``rows`` (``DatasetRow``s), print the tables or the JSON, write ``output``; the exit code."""
    from lego_rl.runstore.files import replace_file
    from lego_rl.swe.redteam import CLASSES
    from lego_rl.swe.redteam_run import AttackOutcome, TaskRedTeam, red_team_dataset, summarize

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err) as bar:
        job = bar.add_task(escape(f"red-teaming {data.name} ({options.provider}, {concurrency} at once)"),
                           total=len(rows))

        def on_attack(iid: str, a: AttackOutcome) -> None:
            bar.update(job, description=escape(f"red-teaming {iid}: {a.attack_class}/{a.variant} {a.status}"))
            if a.status in ("rewarded", "escaped"):
                what = f"{iid} {a.attack_class}/{a.variant}: {a.reason}"
                bar.console.print(f"[{_COLORS[a.status]}]{a.status}[/] {escape(what)}", highlight=False)

        def on_task(r: TaskRedTeam) -> None:
            bar.update(job, advance=1)
            where = f"row {r.row} {r.instance_id or '-'}" + (f": {r.detail}" if r.detail else "")
            bar.console.print(f"[{_COLORS[r.verdict]}]{r.verdict}[/] {escape(where)}", highlight=False)

        reports = asyncio.run(red_team_dataset(rows, dataset_dir=data.resolve().parent, options=options,
                                               concurrency=concurrency, classes=classes, on_task=on_task,
                                               on_attack=on_attack))
    summary = summarize(reports) | {"output": str(output) if output else None}
    if output is not None:
        replace_file(output, "".join(r.model_dump_json() + "\n" for r in reports))
    if as_json:
        out.print_json(json.dumps({"summary": summary, "tasks": [r.model_dump() for r in reports]}))
        return red_team_exit_code(reports)
    for r in reports:
        out.print(_task_table(r, classes or list(CLASSES)))
    totals = Table(title="red team summary", title_justify="left")
    for col in ("tasks", *summary["verdicts"], "hackable share", "attacks graded"):
        totals.add_column(escape(col))
    share = summary["hackable_share"]
    totals.add_row(str(summary["tasks"]), *(str(n) for n in summary["verdicts"].values()),
                   "-" if share is None else f"{share:.0%}", str(summary["attacks_graded"]))
    out.print(totals)
    if summary["tasks_hacked_per_class"]:
        per = Table(title="tasks hacked per class", title_justify="left")
        per.add_column("class")
        per.add_column("tasks")
        for code, n in summary["tasks_hacked_per_class"].items():
            per.add_row(escape(code), str(n))
        out.print(per)
    return red_team_exit_code(reports)


def _task_table(r: Any, classes: list[str]) -> Table:
    """One task: a line per control, then a line per class (its worst attack), with the grader's reason."""
    title = f"row {r.row} {r.instance_id or '-'} ({r.runner}): {r.verdict}"
    title += f" - {r.detail}" if r.detail else ""
    table = Table(title=escape(title), title_justify="left")
    for col in ("class", "attack", "reward", "outcome"):
        table.add_column(col, no_wrap=True)
    table.add_column("reason (--json has it whole)", overflow="fold", ratio=1)
    for c in r.controls:
        reward = "-" if c.reward is None else f"{c.reward:g}"
        state = "as expected" if c.ok else f"expected {c.expected:g}"
        color = "green" if c.ok else "yellow"
        table.add_row("control", c.patch, reward, f"[{color}]{state}[/]", escape(_short(c.reason)))
    worst = r.by_class()
    for code in classes:
        a = worst.get(code)
        if a is None:
            table.add_row(escape(code), "-", "-", "not run", "")
            continue
        n = sum(x.attack_class == code and x.status != "n/a" for x in r.attacks)
        label = f"{a.variant} (worst of {n})" if n > 1 else a.variant
        reward = "-" if a.reward is None else f"{a.reward:g}"
        outcome = f"[{_COLORS[a.status]}]{a.status}[/]" + (f" ({escape(a.label)})" if a.label else "")
        table.add_row(escape(code), escape(label), reward, outcome, escape(_short(a.reason)))
    return table


def _short(reason: str, limit: int = 160) -> str:
    return reason if len(reason) <= limit else reason[: limit - 1] + "…"
