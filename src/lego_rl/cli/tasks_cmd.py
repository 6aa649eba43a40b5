"""`lego tasks prepare`, `lego images` and `lego tasks check`: task data from dataset files to gradable tasks.

Exit codes (see console.py): 0 ok; 1 negative verdict (an image failed to import, a task is not
gradable); 2 bad input (bad rows, unknown ids, missing files); 3 infrastructure (a grader sandbox).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from lego_rl.cli.console import EXIT_FAILED, EXIT_INFRA, EXIT_OK, EXIT_USAGE, err, escape, fail, out

tasks_app = typer.Typer(help="Task rows: convert a dataset into them, prove each is gradable.", no_args_is_help=True)
JsonOut = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]
IdsOpt = Annotated[
    list[str] | None,
    typer.Option("--ids", help="Task ids to keep, in order (repeatable, or comma/space separated). Default: all."),
]


def _ids(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [i for v in values for i in v.replace(",", " ").split()]


def _fail(message: str, code: int = EXIT_USAGE) -> typer.Exit:
    fail(message)
    return typer.Exit(code)


def _issues_table(issues: list[Any], title: str) -> Table:
    table = Table(title=escape(title), title_justify="left")
    table.add_column("row", justify="right")
    table.add_column("instance_id")
    table.add_column("reason", overflow="fold")
    for i in issues:
        table.add_row(str(i.row), escape(i.instance_id or "-"), escape(i.reason))
    return table


def prepare(
    data: Annotated[Path, typer.Option("--data", help="MiMo: the dir with code.parquet + image-mapping.jsonl; "
                                       "swepro: the dataset parquet/JSONL; rows: a JSONL of rows.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="JSONL to write (atomically).")],
    fmt: Annotated[str, typer.Option("--format", help="mimo | swepro | rows (f2p_script or existing rows).")] = "mimo",
    ids: IdsOpt = None,
    scripts: Annotated[Path | None, typer.Option("--scripts", help="swepro: dir of <id>/run_script.sh, parser.py.")] = None,
    skip_bad: Annotated[bool, typer.Option("--skip-bad", help="Write the good rows even when some rows are bad.")] = False,
    reference: Annotated[Path | None, typer.Option("--reference", help="JSONL of {\"instance_id\", \"patch\"}: "
                                                   "reference patches to attach (replacing a row's own).")] = None,
    as_json: JsonOut = False,
) -> None:
    """Convert a dataset into task rows (prompt = problem statement only; grading data in metadata)."""
    from lego_rl.errors import TaskDataError
    from lego_rl.tasks import convert_mimo, convert_swepro, load_tasks, select_ids, write_tasks
    from lego_rl.tasks.references import attach_references, load_references

    try:
        if fmt == "mimo":
            result = convert_mimo(data, _ids(ids))
        elif fmt == "swepro":
            if scripts is None:
                raise _fail("--format swepro needs --scripts DIR (the instances' run_script.sh and parser.py)")
            result = convert_swepro(data, scripts, _ids(ids))
        elif fmt == "rows":
            result = load_tasks(data)
            result.rows = select_ids(result.rows, _ids(ids), source=str(data))
        else:
            raise _fail(f"--format {fmt!r} is not one of mimo, swepro, rows")
        references = 0
        if reference is not None:
            references = attach_references(result, load_references(reference), selected=bool(_ids(ids)),
                                           source=str(reference))
    except TaskDataError as exc:
        raise _fail(str(exc)) from None
    written = 0
    if result.rows and (skip_bad or not result.issues):
        written = write_tasks(output, result.rows)
    images = len({r.metadata.image for r in result.rows})
    if as_json:
        out.print_json(json.dumps({"output": str(output) if written else None, "tasks": written, "images": images,
                                   "references": references, "bad_rows": [vars(i) for i in result.issues]}))
    else:
        if result.issues:
            err.print(_issues_table(result.issues, f"{len(result.issues)} bad rows in {data}"))
        summary = Table(title="lego prepare", title_justify="left")
        for col in ("output", "tasks", "images", "references", "bad rows"):
            summary.add_column(col)
        summary.add_row(escape(str(output)) if written else "(not written)", str(written), str(images),
                        str(references), str(len(result.issues)))
        out.print(summary)
    if result.issues and not skip_bad:
        raise _fail(f"{len(result.issues)} bad rows; nothing written (fix them, or pass --skip-bad)")
    if not written:
        raise _fail("no task rows to write")


def images(
    data: Annotated[Path, typer.Option("--data", help="Prepared task JSONL (lego prepare).")],
    root: Annotated[Path, typer.Option("--root", help="Directory for rootfs bundles (same path on every node).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="images.json to write (kept entries are merged).")],
    source: Annotated[list[Path], typer.Option("--source", help="Directory of OCI layouts / docker-archive tars "
                                               "(repeatable). Names tried: full ref, repo_tag, tag, each +.tar.")],
    ids: IdsOpt = None,
    fix_root_path: Annotated[bool, typer.Option("--fix-root-path", help="Let the agent user run toolchains under "
                                                "/root (pyenv): PATH, PYENV_ROOT and traverse permissions.")] = False,
    as_json: JsonOut = False,
) -> None:
    """Import each task's image into a rootfs bundle and write images.json (rootfs, workdir, env)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from lego_rl.errors import TaskDataError
    from lego_rl.images import images_of_tasks, import_images
    from lego_rl.tasks import load_tasks, select_ids

    missing = [tool for tool in ("skopeo", "umoci") if shutil.which(tool) is None]
    if missing:
        raise _fail(f"{' and '.join(missing)} not installed (apt-get install skopeo umoci)", EXIT_INFRA)
    try:
        loaded = load_tasks(data)
        loaded.raise_on_issues(str(data))
        wanted = images_of_tasks(select_ids(loaded.rows, _ids(ids), source=str(data)))
    except TaskDataError as exc:
        raise _fail(str(exc)) from None
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, disable=as_json) as bar:
        job = bar.add_task("importing images", total=len(wanted))

        def step(o: Any) -> None:
            bar.advance(job)
            if o.status == "failed":
                bar.console.print(f"[red]failed[/] {escape(f'{o.image}: {o.error}')}", highlight=False)

        report = asyncio.run(import_images(wanted, root=root, output=output, search_dirs=source,
                                           fix_path=fix_root_path, on_progress=step))
    failed = [o for o in report.outcomes if o.status == "failed"]
    if as_json:
        out.print_json(json.dumps({"output": str(output), "outcomes": [vars(o) for o in report.outcomes]}))
    else:
        table = Table(title=escape(f"lego images -> {output}"), title_justify="left")
        for col in ("imported", "reused", "failed", "images.json entries"):
            table.add_column(col)
        table.add_row(*(str(report.count(s)) for s in ("imported", "reused", "failed")), str(len(report.mapping)))
        out.print(table)
    if failed:
        raise typer.Exit(EXIT_FAILED)


@tasks_app.command("check")
def check(
    data: Annotated[Path, typer.Option("--data", help="Prepared task JSONL.")],
    images_json: Annotated[Path | None, typer.Option("--images", help="images.json from `lego images`.")] = None,
    provider: Annotated[str, typer.Option("--provider", help="Sandbox provider for the grader.")] = "bwrap",
    ids: IdsOpt = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Grader timeout per run, seconds.")] = 180.0,
    provider_option: Annotated[list[str] | None, typer.Option(
        "--provider-option", help="KEY=VALUE for the provider's constructor, e.g. state_dir=/var/lib/sunabako "
        "(repeatable; VALUE is JSON when it parses, else a string).")] = None,
    as_json: JsonOut = False,
) -> None:
    """Prove each task is gradable: the agent's workspace sets up as in a rollout, the unmodified image's tests
    run and fail, the reference solution (if any) passes."""
    from lego_rl.errors import TaskDataError
    from lego_rl.images import load_images_json
    from lego_rl.swe.check import check_tasks
    from lego_rl.tasks import load_tasks, select_ids

    try:
        loaded = load_tasks(data)
        loaded.raise_on_issues(str(data))
        rows = select_ids(loaded.rows, _ids(ids), source=str(data))
        mapping = load_images_json(images_json) if images_json else None
    except TaskDataError as exc:
        raise _fail(str(exc)) from None
    options = _key_values(provider_option or [])
    with err.status(escape(f"checking {len(rows)} tasks with {provider}"), spinner="dots") if not as_json else _null():
        checks = asyncio.run(check_tasks(rows, provider=provider, images=mapping, timeout=timeout,
                                         provider_options=options, dataset_dir=data.resolve().parent))
    if as_json:
        out.print_json(json.dumps([c.as_dict() for c in checks]))
    else:
        table = Table(title="lego tasks check", title_justify="left")
        for col in ("task", "unmodified image", "reference", "time (setup+base+ref)", "verdict"):
            table.add_column(col, overflow="fold")
        for c in checks:
            color = {"gradable": "green", "not gradable": "yellow", "grader error": "red", "setup error": "red"}[c.verdict]
            timing = " + ".join(f"{t:.1f} s" for t in (c.workspace_s, c.baseline_s, c.reference_s) if t is not None)
            table.add_row(escape(c.instance_id), escape(c.baseline_reason or c.baseline), escape(c.reference),
                          timing, f"[{color}]{c.verdict}[/] {escape(c.detail)}")
        out.print(table)
    verdicts = {c.verdict for c in checks}
    infra = {"grader error", "setup error"} & verdicts
    raise typer.Exit(EXIT_INFRA if infra else EXIT_FAILED if "not gradable" in verdicts else EXIT_OK)


def _key_values(items: list[str]) -> dict[str, Any]:
    parsed: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise _fail(f"--provider-option {item!r} is not KEY=VALUE")
        try:
            parsed[key] = json.loads(raw)
        except json.JSONDecodeError:
            parsed[key] = raw
    return parsed


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def register(app: typer.Typer) -> None:
    """Add `lego tasks ...` and `lego images` to the `lego` app."""
    tasks_app.command("prepare")(prepare)
    app.command("images")(images)
    app.add_typer(tasks_app, name="tasks")
