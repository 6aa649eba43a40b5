"""`lego harnesses` (what is installed) and `lego toolchain fetch` (pinned CLI artifacts, verified)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import typer

from lego_rl.cli.console import EXIT_INFRA, EXIT_USAGE, err, escape, fail, out
from lego_rl.cli.options import ConfigOpt, SetOpt, load

toolchain_app = typer.Typer(
    help="Host-side CLI artifacts that harness installs use offline.", no_args_is_help=True
)


def _fail(exc: Exception, code: int) -> typer.Exit:
    fail(exc)
    return typer.Exit(code)


def harnesses(
    as_json: bool = typer.Option(False, "--json", help="Print machine-readable JSON on stdout."),
) -> None:
    """List installed harness plugins: name, CLI version, adapter protocol, providing package."""
    from rich.table import Table

    from lego_rl.errors import HarnessError
    from lego_rl.harness.plugins import describe_all, get_plugin_manager

    try:
        infos = describe_all(get_plugin_manager())
    except HarnessError as exc:
        raise _fail(exc, EXIT_INFRA) from None
    if as_json:
        rows = [
            {**i.harness.model_dump(mode="json"), "plugin": i.plugin, "package": i.package,
             "package_version": i.package_version, "hooks": list(i.hooks)}
            for i in infos
        ]  # fmt: skip
        typer.echo(json.dumps(rows, indent=2))
        return
    if not infos:
        err.print("no harness plugins installed (scripts/install_plugins.sh installs the four shipped ones)")
        return
    table = Table(title="Harness plugins")
    for col in ("name", "version", "protocol", "cli package", "package"):
        table.add_column(col)
    for i in infos:
        h = i.harness
        # Plugin metadata comes from third-party packages: shown literally, never read as markup.
        table.add_row(*(escape(cell) for cell in (h.name, h.version, h.protocol, h.cli_package,
                                                   f"{i.package} {i.package_version}")))
    out.print(table)


@toolchain_app.command("fetch")
def toolchain_fetch(
    harness: list[str] | None = typer.Option(
        None, "--harness", "-H", help="Only these harnesses (repeatable)."
    ),
    folder: Path | None = typer.Option(
        None, "--dir", help="Toolchain folder (default $LEGO_TOOLCHAIN_DIR, else ./.lego/toolchain)."
    ),
    force: bool = typer.Option(
        False, "--force", help="Download again even when the lockfile says up to date."
    ),
    python: str | None = typer.Option(
        None, "--python", help="Host interpreter that builds Python site trees."
    ),
    option: list[str] | None = typer.Option(
        None,
        "--option",
        "-o",
        help="Harness option HARNESS.KEY=VALUE (JSON or text), e.g. codex.install_from=npm.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the fetched lockfile entries as JSON."),
    config: ConfigOpt = None,
    overrides: SetOpt = None,
) -> None:
    """Download every pinned npm tarball / platform archive / site tree and check it against the registry.

    The pins come from each harness's options as the run will see them: its `[harness.<name>]` table in
    lego.toml, LEGO_AGENT_* variables, `--set harness.<name>.<key>=...`, then `--option` on top.
    Keeps going past a failed artifact, then names every failure and exits 3."""
    from lego_rl.errors import ConfigError, HarnessError
    from lego_rl.harness.fetch import fetch_toolchain
    from lego_rl.harness.models import ToolchainPin
    from lego_rl.harness.plugins import describe_all, get_plugin_manager
    from lego_rl.harness.toolchain import default_toolchain_dir
    from lego_rl.compose.harnesses import harness_factory

    target = folder or default_toolchain_dir()
    unpinned: list[str] = []
    try:
        r = load(config, overrides, typed=_parse_options(option or []))
        pm = get_plugin_manager()
        names = harness or [i.harness.name for i in describe_all(pm)]
        lookup = harness_factory(r, pm=pm)
        pins: list[ToolchainPin] = []
        for name in names:
            try:
                pins.extend(lookup(name).toolchain_pins())
            except NotImplementedError:
                # HarnessPlugin's default toolchain(): one unfinished plugin must not stop the others' fetch.
                unpinned.append(name)
        failures: list[tuple[ToolchainPin, Exception]] = []
        results = asyncio.run(fetch_toolchain(pins, target, force=force, python=python, failures=failures))
    except ConfigError as exc:
        raise _fail(exc, EXIT_USAGE) from None
    except HarnessError as exc:
        raise _fail(exc, EXIT_INFRA) from None
    if as_json:
        typer.echo(json.dumps([e.model_dump(mode="json") | {"downloaded": d} for e, d in results], indent=2))
    else:
        for entry, downloaded in results:
            state = "fetched" if downloaded else "up to date"
            size = f"{entry.size / 1e6:.1f} MB"
            out.print(f"{state:>10}  {entry.name}@{entry.version}  {size}  {entry.file}", markup=False,
                      highlight=False)
        out.print(f"toolchain: {target}", markup=False, highlight=False)
    for pin, problem in failures:
        fail(f"{getattr(pin, 'key', str(pin))}: {problem}", label="failed")
    for name in unpinned:
        fail(f"harness {name!r} implements no toolchain hook (its plugin's toolchain() raises "
             "NotImplementedError): pin the CLI's files there, or return [] if it installs nothing", label="failed")
    if failures or unpinned:
        raise typer.Exit(EXIT_INFRA)


def _parse_options(items: list[str]) -> dict[str, tuple[object, str]]:
    """``--option codex.install_from=npm`` as a typed override of ``harness.codex.install_from`` (JSON, else
    text), recorded with the option as its source."""
    from lego_rl.errors import ConfigError

    parsed: dict[str, tuple[object, str]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        harness, dot, field = key.partition(".")
        if not sep or not dot or not harness or not field:
            raise ConfigError(f"expected HARNESS.KEY=VALUE, got {item!r}", where="--option")
        try:
            value: object = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        parsed[f"harness.{key}"] = (value, f"--option {item}")
    return parsed


def register(app: typer.Typer) -> None:
    """Add `lego harnesses` and `lego toolchain ...` to the `lego` app."""
    app.command("harnesses")(harnesses)
    app.add_typer(toolchain_app, name="toolchain")
