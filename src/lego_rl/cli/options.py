"""Options shared by every command that reads the configuration."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from lego_rl.config.resolve import ResolvedConfig, resolve

ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "-c", "--config",
        help="lego.toml to read (default: $LEGO_CONFIG, else ./lego.toml when present, else built-in defaults).",
        show_default=False,
    ),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        help="Override one key, e.g. --set rollout.batch_size=4 (repeatable; beats env vars and the file).",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]


def config_path(option: Path | None) -> Path | None:
    if option is not None:
        return option
    if env := os.environ.get("LEGO_CONFIG"):
        return Path(env)
    default = Path("lego.toml")
    return default if default.is_file() else None


def load(config: Path | None, overrides: list[str] | None,
         typed: Mapping[str, tuple[Any, str]] | None = None) -> ResolvedConfig:
    """Resolve with ``--set`` strings and, above them, typed options as ``{key: (value, "--option")}``."""
    return resolve(config_path(config), overrides=overrides or [], typed_overrides=typed)
