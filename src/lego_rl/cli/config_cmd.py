"""`lego validate` and `lego config show`: resolve the configuration and check it before a launch."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from lego_rl.cli.console import EXIT_FAILED, EXIT_OK, EXIT_USAGE, fail, out
from lego_rl.cli.options import ConfigOpt, JsonOpt, SetOpt, load
from lego_rl.config.checks import Finding, run_checks
from lego_rl.config.resolve import ResolvedConfig, config_json
from lego_rl.config.schema import SECTIONS
from lego_rl.errors import ConfigError

config_app = typer.Typer(help="Inspect the resolved configuration.", no_args_is_help=True)


def _jsonable(value: Any) -> Any:
    return "**********" if hasattr(value, "get_secret_value") else value


def _findings_table(findings: list[Finding]) -> Table:
    table = Table(title="Checks", title_justify="left", show_lines=False, expand=out.is_terminal)
    table.add_column("", width=4)
    table.add_column("check", style="bold", no_wrap=True)
    table.add_column("problem", ratio=3)
    table.add_column("what to do", ratio=2, style="cyan")
    for f in findings:
        mark = "[red]FAIL[/]" if f.severity == "error" else "[yellow]WARN[/]"
        table.add_row(mark, escape(f.code), escape(f.message), escape(f.fix))
    return table


def _section_table(r: ResolvedConfig, section: str, *, docs: bool) -> Table:
    table = Table(title=escape(f"[{section}]"), title_justify="left", expand=out.is_terminal)
    table.add_column("key", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold", ratio=2)
    table.add_column("source", style="dim", ratio=1)
    if docs:
        table.add_column("meaning", style="italic", ratio=3)
    model = getattr(r.config, section)
    launch_root = _launch_time_run_root(r)
    for name, info in type(model).model_fields.items():
        source = r.source(f"{section}.{name}")
        value = _jsonable(getattr(model, name))
        shown = json.dumps(value) if isinstance(value, dict | list) else str(value)
        if launch_root and section == "paths" and isinstance(value, str):
            shown = shown.replace(*launch_root)
        style = "" if source.kind == "default" else "green"
        # Values, sources and docs are data, not markup: a value "[bold]x" must print as written.
        row = [Text(name), Text(shown, style=style), Text(str(source))]
        if docs:
            row.append(Text(" ".join((info.description or "").split())))
        table.add_row(*row)
    return table


def _launch_time_run_root(r: ResolvedConfig) -> tuple[str, str] | None:
    """(this resolution's run root, how the job will name its own) when the run root is derived from the clock.

    A derived run root carries the time of resolution; the job resolves again when it starts and gets a later
    one. Printing this run's stamp would name a folder the job never writes, so the table says what it will be.
    """
    source = r.source("paths.run_root")
    if source.kind != "derived" or r.config.paths.run_root is None:
        return None
    concrete = r.config.paths.run_root
    return concrete, str(Path(concrete).parent / "run-<timestamp when the job starts>")


def _harness_tables(r: ResolvedConfig) -> list[Table]:
    """One table per ``[harness.<name>]`` that sets anything: its options are the plugin's, validated by it
    (a refused one is a finding above), so they are shown as set, with their sources."""
    tables = []
    for name, options in sorted(r.config.harness.items()):
        table = Table(title=escape(f"[harness.{name}]"), title_justify="left", expand=out.is_terminal)
        table.add_column("key", style="bold", no_wrap=True)
        table.add_column("value", overflow="fold", ratio=2)
        table.add_column("source", style="dim", ratio=1)
        for key, value in options.items():
            shown = json.dumps(value) if isinstance(value, dict | list) else str(value)
            table.add_row(Text(key), Text(shown, style="green"), Text(str(r.source(f"harness.{name}.{key}"))))
        tables.append(table)
    return tables


def _print_config(r: ResolvedConfig, *, docs: bool) -> None:
    for section in SECTIONS:
        out.print(_section_table(r, section, docs=docs))
    for table in _harness_tables(r):
        out.print(table)


def _resolve_or_exit(config: Any, overrides: list[str] | None, as_json: bool) -> ResolvedConfig:
    try:
        return load(config, overrides)
    except ConfigError as exc:
        if as_json:
            out.print_json(json.dumps({"ok": False, "error": str(exc), "parameter": exc.parameter}))
        else:
            fail(exc, label="config error")
        raise typer.Exit(EXIT_USAGE) from None


def validate(
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    as_json: JsonOpt = False,
    remote: Annotated[bool, typer.Option("--remote", help="Also check what must exist before a launch: SSH to "
                                         "the sandbox nodes of cluster.json, the health of configured vLLM "
                                         "servers, and the Ray cluster's resources against the placement "
                                         "cluster.* needs (network; each bounded by --timeout).")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds per network check with --remote.")] = 5.0,
    docs: Annotated[bool, typer.Option("--docs", help="Show what each key means.")] = False,
) -> None:
    """Resolve lego.toml + environment + --set and run every cross-parameter check.

    Prints failed checks first, then every resolved value with its source (default, file:line, env var,
    --set, derived). Exit 0: nothing failed (warnings allowed). Exit 1: a check failed. Exit 2: the
    configuration could not be read.
    """
    r = _resolve_or_exit(config, overrides, as_json)
    from lego_rl.compose.engine_checks import ENGINE_CHECKS
    from lego_rl.compose.harnesses import harness_inventory

    findings = run_checks(r, harnesses=harness_inventory(r), extra=ENGINE_CHECKS)
    if remote:
        from lego_rl.config.remote import remote_findings

        findings += asyncio.run(remote_findings(r, timeout=timeout))
    errors = sum(f.severity == "error" for f in findings)
    warnings = len(findings) - errors
    if as_json:
        out.print_json(json.dumps({
            "ok": errors == 0, "errors": errors, "warnings": warnings,
            "config_file": str(r.config_path) if r.config_path else None,
            "findings": [f.to_json() for f in findings], "config": config_json(r),
        }))
    else:
        if findings:
            out.print(_findings_table(findings))
        _print_config(r, docs=docs)
        verdict = "[bold green]OK[/]" if errors == 0 else f"[bold red]{errors} check(s) failed[/]"
        shown = escape(str(r.config_path or "built-in defaults"))
        out.print(f"{verdict}, {warnings} warning(s); config: {shown}")
    raise typer.Exit(EXIT_OK if errors == 0 else EXIT_FAILED)


@config_app.command("show")
def show(config: ConfigOpt = None, overrides: SetOpt = None, as_json: JsonOpt = False,
         docs: Annotated[bool, typer.Option("--docs", help="Show what each key means.")] = False) -> None:
    """Print the resolved configuration (no checks). `--json` dumps it with each value's source."""
    r = _resolve_or_exit(config, overrides, as_json)
    if as_json:
        out.print_json(json.dumps(config_json(r)))
        return
    _print_config(r, docs=docs)


@config_app.command("env")
def env_table(as_json: JsonOpt = False) -> None:
    """List every environment variable lego reads, the key it sets and that key's default."""
    from lego_rl.config.envmap import ENV_VARS

    if as_json:
        out.print_json(json.dumps([{"name": v.name, "aliases": list(v.aliases), "key": v.key, "keys": list(v.keys),
                                    "meaning": v.meaning} for v in ENV_VARS]))
        return
    # One variable may set several keys (the Node tarball of two harnesses): show them all.
    rows = [(v.name, ", ".join(v.aliases), ", ".join(v.keys), v.meaning) for v in ENV_VARS]
    table = Table(title="Environment variables (also: LEGO_<SECTION>_<KEY> for every key)", expand=out.is_terminal)
    for col in ("variable", "alias", "key", "meaning"):
        table.add_column(col)
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    out.print(table)


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)
    app.add_typer(config_app, name="config")
