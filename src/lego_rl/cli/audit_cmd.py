"""`lego audit`: check a run's chain from engine to optimizer (a run trained with ``train.audit = true``)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from lego_rl.cli.console import EXIT_FAILED, EXIT_OK, EXIT_USAGE, escape, fail, out


def audit(
    run_dir: Path = typer.Argument(..., help="The run directory (paths.run_root of a run with train.audit = true)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON instead of a table."),
) -> None:
    """Check a run end to end from what it recorded, and write audit/report.json in it.

    Needs `train.audit = true` in the run's config (every trainer rank then records its steps, and the embedded
    engine its served tokens; separate engines record with `lego serve --served-log RUN/audit/engine-<name>.jsonl`).

    Checks: every trainer rank recorded every optimizer step; every trained token and its rollout logprob, as the
    loss read them, equal an engine reply; advantages are group-normalised over distinct rollouts; the optimizer
    ran on every rank; parameters changed on every rank exactly when an advantage was non-zero; the engines
    served each step weights it could use (synchronous runs: the previous step's). Figures: consistency, step time
    split and model FLOP/s per trainer GPU per step.

    Exit codes: 0 every check passed, 1 some check failed, 2 not an audited run directory.
    """
    from lego_rl.errors import ConfigError
    from lego_rl.compose.sessions.audit import audit_run, write_report

    try:
        report = audit_run(run_dir)
    except (ConfigError, FileNotFoundError) as exc:
        fail(exc, label="audit")
        raise typer.Exit(EXIT_USAGE) from None
    path = write_report(report)
    if as_json:
        out.print_json(report.model_dump_json())
    else:
        table = Table(title=f"audit of {escape(str(run_dir))}: {report.ranks} trainer rank(s), "
                            f"{report.steps_trained} trained step(s)")
        table.add_column("check")
        table.add_column("result")
        table.add_column("detail", overflow="fold")
        for c in report.checks:
            table.add_row(c.name, "[green]pass[/]" if c.passed else "[bold red]FAIL[/]", escape(c.detail))
        out.print(table)
        out.print(f"report: {escape(str(path))}", highlight=False)
    raise typer.Exit(EXIT_OK if report.passed else EXIT_FAILED)


def register(app: typer.Typer) -> None:
    app.command("audit")(audit)
