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


def rollout_options(data: Path | None, vllm_url: list[str] | None, harness: str | None) -> dict[str, tuple[Any, str]]:
    """The typed overrides of the commands that roll out (`lego rollout-check`, `lego tasks screen`).

    Typed options reach the resolver as values, never re-parsed from `--set` text (where a backslash in a path is
    an escape). `--harness` becomes the run's default harness so that the same check that refuses `--set
    agent.default_harness=nosuch` refuses it, before the engine or a sandbox starts.
    """
    typed: dict[str, tuple[Any, str]] = {}
    if data is not None:
        typed["rollout.prompt_data"] = (str(data), "--data")
    if vllm_url:
        typed["serving.backend"] = ("vllm", "--vllm-url")
        typed["serving.urls"] = (list(vllm_url), "--vllm-url")
    if harness is not None:
        typed["agent.default_harness"] = (harness, "--harness")
    return typed


def refuse_config_errors(r: ResolvedConfig, *, hint: str) -> None:
    """``compose.preflight``'s errors, each with the explicit keys it names and their sources, then exit 2
    (``hint`` closes the list); nothing when the config is fit to start."""
    from lego_rl.cli.console import EXIT_USAGE, err, fail
    from lego_rl.compose.preflight import preflight_errors

    errors = preflight_errors(r)
    if not errors:
        return
    for f in errors:
        given = ", ".join(f"{key} from {r.source(key)}" for key in f.keys if r.is_explicit(key))
        fail(f"{f.message} — {f.fix}" + (f" ({given})" if given else ""), label="config")
    err.print(hint, markup=False)
    raise typer.Exit(EXIT_USAGE)

