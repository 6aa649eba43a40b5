"""`lego serve` (the embedded engine) and `lego model tiny` (build the offline test model)."""

from __future__ import annotations

from pathlib import Path

import typer

from lego_rl.cli.console import EXIT_USAGE, err, out

model_app = typer.Typer(help="Build and inspect local models.", no_args_is_help=True)


@model_app.command("tiny")
def model_tiny(
    out_dir: Path = typer.Option(..., "--out", help="Directory to write the model into (created)."),
    seed: int = typer.Option(0, help="Seed of the random weights."),
    force: bool = typer.Option(False, "--force", help="Replace an existing directory."),
) -> None:
    """Build the tiny Qwen3-architecture model (random weights, our BPE and chat template) offline."""
    from lego_rl.errors import ConfigError
    from lego_rl.serving.tiny_model import build_tiny_model

    try:
        path = build_tiny_model(out_dir, seed=seed, force=force)
    except ConfigError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(EXIT_USAGE) from None
    out.print(str(path), highlight=False)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `lego` app."""
    app.add_typer(model_app, name="model")
