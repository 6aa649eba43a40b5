"""The `lego` command: one typer app; each noun lives in its own module and is registered here."""

from __future__ import annotations

import sys

import typer

from lego_rl import __version__
from lego_rl.cli.console import EXIT_USAGE, fail, quiet_foreign_progress
from lego_rl.errors import ConfigError, TaskDataError

app = typer.Typer(
    name="lego",
    help=(
        "Train coding agents with RL through their real CLIs.\n\n"
        "Typical flow: turn a dataset into task rows with `lego tasks prepare`, import their images with "
        "`lego images`, write lego.toml, check it with `lego validate -c lego.toml`, then run real rollouts "
        "on a few tasks with `lego rollout-check`."
    ),
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    rich_markup_mode="rich",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"lego-rl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """lego-rl command line."""
    quiet_foreign_progress()


def _register() -> None:
    # Each module imports only typer/rich at its top; heavy imports (torch, sandboxes) wait inside commands.
    from lego_rl.cli import (
        adapter_cmd,
        audit_cmd,
        config_cmd,
        harness_cmd,
        monitor_cmd,
        rollout_cmd,
        sandbox_cmd,
        serving_cmd,
        tasks_cmd,
        train_cmd,
    )

    for module in (config_cmd, rollout_cmd, train_cmd, tasks_cmd, harness_cmd, serving_cmd, adapter_cmd,
                   sandbox_cmd, monitor_cmd, audit_cmd):
        module.register(app)


_register()


def main() -> None:
    """Console-script entry point: maps lego's own errors to one line and exit code 2."""
    try:
        app()
    except (ConfigError, TaskDataError) as exc:
        fail(exc)
        sys.exit(EXIT_USAGE)
