"""`lego monitor` (a live terminal view of a run) and `lego report` (its views as one offline HTML file)."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from lego_rl.cli.console import EXIT_USAGE, fail, out
from lego_rl.cli.options import ConfigOpt, JsonOpt, SetOpt, load
from lego_rl.config.schema import MonitorConfig
from lego_rl.errors import ConfigError

RunArg = Annotated[
    Path, typer.Argument(help="The run directory (paths.run_root of the run).", show_default=False)
]
CompareOpt = Annotated[
    Path | None,
    typer.Option("--compare", help="A second run to compare with (the Compare view).", show_default=False),
]
RolloutOpt = Annotated[
    str | None,
    typer.Option(
        "--rollout", help="Also open this rollout (drill-down) in --once / --json.", show_default=False
    ),
]
SearchOpt = Annotated[
    str | None,
    typer.Option(
        "--search",
        help="Rollouts matching e.g. 'reason:engine_error harness:codex tool:Bash'.",
        show_default=False,
    ),
]


def _check_dir(path: Path, what: str) -> None:
    if not path.is_dir():
        fail(f"{what} {path} is not a directory (give the run's paths.run_root)")
        raise typer.Exit(EXIT_USAGE)


def _monitor_config(config: Path | None, overrides: list[str] | None) -> MonitorConfig:
    try:
        resolved = load(config, overrides)
    except ConfigError as exc:
        fail(exc)
        raise typer.Exit(EXIT_USAGE) from None
    return resolved.config.monitor


def monitor(
    run_dir: RunArg,
    once: Annotated[bool, typer.Option("--once", help="Print one snapshot of every view and exit.")] = False,
    json_out: JsonOpt = False,
    compare_with: CompareOpt = None,
    rollout: RolloutOpt = None,
    search: SearchOpt = None,
    config: ConfigOpt = None,
    overrides: SetOpt = None,
) -> None:
    """Follow a run live: overview, terminations, stage timing, task grid, consistency, rollouts, behaviour,
    pipeline, compare. Keys switch views (1-9 or the underlined letter), / searches, q quits.

    Works on a running, finished or crashed run: broken or missing files are shown as notes. Refreshes every
    monitor.refresh_s; consistency rows above monitor.kl_warn are highlighted.
    """
    from lego_rl.monitor.app import Monitor, render_once, run_live, snapshot_json

    _check_dir(run_dir, "RUN_DIR")
    if compare_with is not None:
        _check_dir(compare_with, "--compare")
    cfg: MonitorConfig = _monitor_config(config, overrides)
    mon = Monitor(run_dir, kl_warn=cfg.kl_warn, other=compare_with)
    mon.query = search
    if not (json_out or once) and out.is_terminal:
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is a way to quit, like q
            run_live(mon, out, cfg.refresh_s)
        return
    if json_out:
        text = snapshot_json(mon, rollout) + "\n"
    else:  # rendered whole first: rich's own writer turns a closed pipe into exit 1
        with out.capture() as captured:
            render_once(mon, out, rollout)
        text = captured.get()
    try:  # piped (CI logs, `| head`), or asked for: one snapshot
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:  # `lego monitor --once | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush


def report(
    run_dir: RunArg,
    html: Annotated[
        Path,
        typer.Option(
            "--html", help="Where to write the report (one self-contained file).", show_default=False
        ),
    ],
    compare_with: CompareOpt = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace the --html file when it exists (else: refused, exit 2).")
    ] = False,
    config: ConfigOpt = None,
    overrides: SetOpt = None,
) -> None:
    """Write the run's views as one offline HTML file: reward, training and consistency curves, termination
    mix and stage timing over steps, the task grid, policy lag, rollouts opened up. RUN_DIR may also be a
    multi-stage parent (the main job's runs/main-*/ with demos/, sft/, grpo/): one part per stage. No network
    is needed to open it."""
    from lego_rl.monitor.report import NoRun, write_report

    _check_dir(run_dir, "RUN_DIR")
    if compare_with is not None:
        _check_dir(compare_with, "--compare")
    cfg: MonitorConfig = _monitor_config(config, overrides)
    try:
        path = write_report(run_dir, html, kl_warn=cfg.kl_warn, other=compare_with, force=force)
    except NoRun as exc:
        fail(f"RUN_DIR: {exc}")
        raise typer.Exit(EXIT_USAGE) from None
    except OSError as exc:  # an existing report without --force, a folder that cannot be written
        fail(f"--html {html}: {exc}")
        raise typer.Exit(EXIT_USAGE) from None
    out.print(f"wrote {path} ({path.stat().st_size:,} bytes)")


def register(app: typer.Typer) -> None:
    app.command("monitor")(monitor)
    app.command("report")(report)
