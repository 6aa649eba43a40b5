"""`lego tasks prepare`, `lego images` and `lego tasks check`: task data from dataset files to gradable tasks.

Exit codes (see console.py): 0 ok; 1 negative verdict (an image failed to import, a task is not
gradable); 2 bad input (bad rows, unknown ids, missing files); 3 infrastructure (a grader sandbox).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from lego_rl.cli.console import EXIT_FAILED, EXIT_INFRA, EXIT_OK, EXIT_USAGE, err, escape, fail, out
from lego_rl.cli.options import ConfigOpt, SetOpt, load, rollout_options

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
        summary = Table(title="lego tasks prepare", title_justify="left")
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
    data: Annotated[Path, typer.Option("--data", help="Task rows (JSONL) that `lego tasks prepare` wrote.")],
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
        selected = select_ids(loaded.rows, _ids(ids), source=str(data))
        wanted = images_of_tasks(selected)
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
    per_image = Counter(r.metadata.image for r in selected)
    for o in report.outcomes:
        o.tasks = per_image[o.image]
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
    concurrency: Annotated[int, typer.Option("--concurrency", "-j", min=1, help="Rows checked at once.")] = 2,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Verdict JSONL (one line per row, with "
                                                "reasons). Resumable: rows already judged with the same inputs "
                                                "are reused; published atomically when the run ends.")] = None,
    write_valid_to: Annotated[Path | None, typer.Option("--write-valid", help="Write the rows that pass, verbatim, "
                                                        "to this JSONL (atomically).")] = None,
    repeat: Annotated[bool, typer.Option("--repeat/--no-repeat", help="Run the tests a second time and require the "
                                         "same per-test verdicts (determinism).")] = True,
    red_team: Annotated[bool, typer.Option("--red-team", help="Instead: grade every attack class (patches that try "
                                           "to earn reward without fixing the bug) against every task, and report "
                                           "per task which class earns reward. --output then writes one report "
                                           "line per task (not resumed).")] = False,
    attacks: Annotated[list[str] | None, typer.Option("--attack", help="With --red-team: only these classes "
                                                      "(repeatable, or comma separated). Default: all.")] = None,
    as_json: JsonOut = False,
) -> None:
    """Prove each task is gradable: the agent's workspace sets up as in a rollout and shows neither history
    beyond the base commit nor the hidden tests; the unmodified repository's tests run and fail; the reference
    fix (if any) passes; a second run gives every test the same verdict.

    Exit codes: 0 every row valid; 1 some row invalid (named with its reasons); 2 bad usage (missing file,
    unknown id); 3 some row could not be checked (sandbox or grader failure: run again to retry those rows).

    With --red-team, each task is instead attacked by the catalogue of docs/grading.md ("Red-teaming a dataset":
    exit-status, result-writer, plugin, assertions, shadowing, runner-config, remove-tests, always-equal, oracle,
    planted-files, outliving-process, garbled-report, break-test-patch), with two controls (the empty patch must
    score 0, the reference patch 1). Exit codes: 0 every task sound; 1 some task hackable (a class earned reward
    or turned its 0 into a grader error), already passing, or its reference lost reward; 2 bad usage; 3 no
    such finding but some task could not be red-teamed (run again)."""
    from lego_rl.swe.dataset_check import CheckOptions, write_valid

    rows, mapping = _check_rows(data, images_json, ids)
    options = CheckOptions(provider=provider, provider_options=_key_values(provider_option or []),
                           images=mapping, timeout=timeout, repeat=repeat)
    if red_team or attacks:
        raise typer.Exit(_red_team(rows, data, options, concurrency, attacks, red_team, output, write_valid_to,
                                   as_json))
    result = _check_with_progress(rows, data, options, output, concurrency, as_json)
    written = write_valid(write_valid_to, rows, result.verdicts) if write_valid_to is not None else None
    summary = result.summary() | {"output": str(output) if output else None,
                                  "valid_written": str(write_valid_to) if written is not None else None}
    if as_json:
        out.print_json(json.dumps({"summary": summary, "rows": [v.model_dump() for v in result.verdicts]}))
    else:
        _print_check(result.verdicts, summary)
        if written is not None:
            out.print(escape(f"{written} valid rows written to {write_valid_to}"), highlight=False)
    raise typer.Exit(EXIT_INFRA if result.count("error") else EXIT_FAILED if result.count("invalid") else EXIT_OK)


def _check_rows(data: Path, images_json: Path | None, ids: list[str] | None) -> tuple[list[Any], Any]:
    """The rows to check (``--ids`` in the order given) and the images mapping; a bad input is a usage error."""
    from lego_rl.errors import TaskDataError
    from lego_rl.images import load_images_json
    from lego_rl.swe.dataset_check import read_dataset

    try:
        rows = read_dataset(data)
        mapping = load_images_json(images_json) if images_json else None
    except TaskDataError as exc:
        raise _fail(str(exc)) from None
    wanted = _ids(ids)
    if wanted:
        by_id = {r.instance_id: r for r in rows}
        missing = [i for i in wanted if i not in by_id]
        if missing:
            raise _fail(f"{data}: ids not found: {', '.join(missing)}")
        rows = [by_id[i] for i in wanted]
    if not rows:
        raise _fail(f"{data}: no task rows")
    return rows, mapping


def _check_with_progress(rows: list[Any], data: Path, options: Any, output: Path | None, concurrency: int,
                         as_json: bool) -> Any:
    """``swe.dataset_check.check_dataset`` with a progress bar and a line per row that is not valid."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from lego_rl.swe.dataset_check import RowVerdict, check_dataset

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[tally]}"), console=err, disable=as_json) as bar:
        tally: dict[str, int] = {"valid": 0, "invalid": 0, "error": 0, "reused": 0}
        job = bar.add_task(escape(f"checking {data.name} ({options.provider}, {concurrency} at once)"),
                           total=len(rows), tally="")

        def step(v: RowVerdict, reused: bool) -> None:
            tally[v.status] += 1
            tally["reused"] += reused
            bar.update(job, advance=1, tally=" ".join(f"{k} {n}" for k, n in tally.items()))
            if v.status != "valid" and not reused:
                color = "red" if v.status == "error" else "yellow"
                where = f"row {v.row} {v.instance_id or '-'}: "
                bar.console.print(f"[{color}]{v.status}[/] {escape(where)}"
                                  f"{escape(', '.join(v.reasons) or v.detail)}", highlight=False)

        try:
            return asyncio.run(check_dataset(rows, dataset_dir=data.resolve().parent, options=options,
                                             output=output, concurrency=concurrency, on_verdict=step))
        except FileExistsError as exc:
            raise _fail(str(exc)) from None


def _print_check(verdicts: list[Any], summary: dict[str, Any]) -> None:
    """The per-row table, the totals and the reasons with their meaning."""
    from lego_rl.swe.check import REASONS
    from lego_rl.swe.dataset_check import MALFORMED

    table = Table(title="lego tasks check", title_justify="left")
    for col in ("row", "task", "unmodified", "reference", "repeat", "time (setup+base+ref+again)", "verdict"):
        table.add_column(col, overflow="fold")
    for v in verdicts:
        c = v.check or {}
        color = {"valid": "green", "invalid": "yellow", "error": "red"}[v.status]
        timing = " + ".join(f"{c[k]:.1f}" for k in ("workspace_s", "baseline_s", "reference_s", "repeat_s")
                            if c.get(k) is not None)
        table.add_row(str(v.row), escape(v.instance_id or "-"), escape(c.get("baseline_reason") or "-"),
                      escape(c.get("reference", "-")), escape(c.get("repeat", "-")), timing,
                      f"[{color}]{v.status}[/] {escape(', '.join(v.reasons))}"
                      + (f"\n{escape(v.detail)}" if v.detail and v.status != "valid" else ""))
    out.print(table)
    totals = Table(title="summary", title_justify="left")
    for col in ("rows", "valid", "invalid", "error", "reused", "rows/min", "sandbox s", "setup s", "tests s"):
        totals.add_column(col)
    cost = summary["cost_s"]
    totals.add_row(*(str(summary[k]) for k in ("rows", "valid", "invalid", "error", "reused")),
                   str(summary["rows_per_min"] or "-"), *(f"{cost[k]:.1f}" for k in ("sandbox", "setup", "tests")))
    out.print(totals)
    if summary["reasons"]:
        reasons = Table(title="reasons", title_justify="left")
        for col in ("reason", "rows", "meaning"):
            reasons.add_column(col, overflow="fold")
        for reason, n in summary["reasons"].items():
            meaning = "the row does not parse, or names a missing file" if reason == MALFORMED else REASONS.get(
                reason, "")
            reasons.add_row(escape(reason), str(n), escape(meaning))
        out.print(reasons)


def _red_team(rows: list[Any], data: Path, options: Any, concurrency: int, attacks: list[str] | None,
              red_team: bool, output: Path | None, write_valid_to: Path | None, as_json: bool) -> int:
    from lego_rl.cli.tasks_redteam import run_red_team
    from lego_rl.swe.redteam import CLASSES

    classes = _ids(attacks)
    unknown = sorted(set(classes or []) - set(CLASSES))
    if not red_team:
        raise _fail("--attack needs --red-team")
    if write_valid_to is not None:
        raise _fail("--write-valid belongs to the gradability check; --red-team writes no dataset")
    if unknown:
        raise _fail(f"unknown attack classes {', '.join(unknown)}; the catalogue has {', '.join(CLASSES)}")
    return run_red_team(rows, data=data, options=options, concurrency=concurrency, classes=classes,
                        output=output, as_json=as_json)


@tasks_app.command("screen")
def screen_tasks(
    data: Annotated[Path | None, typer.Option("--data", help="Task JSONL to screen (its rows are kept verbatim); "
                                              "default rollout.prompt_data.")] = None,
    runs: Annotated[list[Path] | None, typer.Option("--run", help="Read-only: a run directory whose rollouts are "
                                                    "the attempts, e.g. a training run (repeatable; read in "
                                                    "order). Without --run, the screen rolls out itself.")] = None,
    k: Annotated[int, typer.Option("-k", min=1, help="Attempts per task.")] = 4,
    min_solved: Annotated[int, typer.Option("--min-solved", min=0, help="Keep tasks solved at least this often.")] = 1,
    max_solved: Annotated[int | None, typer.Option("--max-solved", min=0, help="... and at most this often "
                                                   "(default k-1).")] = None,
    window: Annotated[str, typer.Option("--window", help="With --run. first: each task's first K attempts (a "
                                        "screening run); last: its last K (a training run: what stopped carrying "
                                        "signal).")] = "first",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Screened dataset JSONL (atomically).")] = None,
    report: Annotated[Path | None, typer.Option("--report", help="Per-task report JSONL (atomically).")] = None,
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    ids: IdsOpt = None,
    harness: Annotated[str | None, typer.Option("--harness", help="Harness for every task (default: each row's "
                                                "metadata.agent, else agent.default_harness).")] = None,
    vllm_url: Annotated[list[str] | None, typer.Option("--vllm-url", help="Roll out against these vLLM servers "
                                                       "instead of the embedded engine (repeatable).")] = None,
    concurrency: Annotated[int | None, typer.Option("--concurrency", "-j", min=1, help="Rollouts in flight "
                                                    "(default rollout.concurrency).")] = None,
    as_json: JsonOut = False,
) -> None:
    """Keep the tasks whose pass rate over K attempts is inside a band (default: solved 1..K-1 of K).

    Without --run it rolls out K attempts per task itself, with the config's policy through the training
    stack (engine, adapter, each row's harness in its sandbox, grader), into paths.run_root; run again with
    the same run root, it reuses the attempts there and rolls out only what is missing (a rollout lost to
    the infrastructure is not an attempt). With --run it only reads recorded rollouts. Rows that cannot be
    rolled out are named (decision "bad row"). Exit codes: 0 some task kept; 1 none kept; 2 bad usage;
    3 some task is short of K attempts after rolling out (infrastructure: run again to top up);
    143 stopped by SIGTERM (outcomes so far saved: run again to go on)."""
    from lego_rl.errors import TaskDataError
    from lego_rl.runstore.files import replace_file
    from lego_rl.swe.dataset_check import read_dataset
    from lego_rl.tasks.screen import TaskScreen, read_attempts, screen

    if window not in ("first", "last"):
        raise _fail(f"--window {window!r} is not one of first, last")
    if not runs:
        _screen_by_rolling_out(data=data, k=k, min_solved=min_solved, max_solved=max_solved, window=window,
                               output=output, report=report, config=config, overrides=overrides, ids=ids,
                               harness=harness, vllm_url=vllm_url, concurrency=concurrency, as_json=as_json)
        return
    rolling = {"--ids": ids, "--harness": harness, "--vllm-url": vllm_url, "--concurrency": concurrency,
               "--set": overrides, "--config": config}
    given = [name for name, value in rolling.items() if value]
    if given:
        raise _fail(f"--run reads recorded rollouts; {', '.join(given)} only work(s) when the screen rolls out "
                    "(without --run)")
    if data is None:
        raise _fail("--run needs --data (the task JSONL the run's tasks come from)")
    try:
        dataset = read_dataset(data)
        rows = [r for r in dataset if r.task is not None]
        attempts = read_attempts(runs)
        verdicts = screen([r.instance_id or "" for r in rows], attempts, k=k, min_solved=min_solved,
                          max_solved=max_solved, window="first" if window == "first" else "last")
    except (TaskDataError, ValueError) as exc:
        raise _fail(str(exc)) from None
    for v, r in zip(verdicts, rows, strict=True):
        v.row = r.row
    verdicts += [TaskScreen(instance_id=r.instance_id or "", attempts=0, solved=0, pass_rate=None, decision="bad row",
                            row=r.row, detail=r.problem) for r in dataset if r.task is None]
    kept = {v.instance_id for v in verdicts if v.decision == "kept"}
    if output is not None:
        replace_file(output, "".join(r.line + "\n" for r in rows if r.instance_id in kept))
    code = _print_screen(verdicts, attempts.terminations, k=k, min_solved=min_solved, max_solved=max_solved,
                         window=window, output=output, report=report, as_json=as_json)
    raise typer.Exit(code)


def _screen_by_rolling_out(*, data: Path | None, k: int, min_solved: int, max_solved: int | None, window: str,
                           output: Path | None, report: Path | None, config: Path | None,
                           overrides: list[str] | None, ids: list[str] | None, harness: str | None,
                           vllm_url: list[str] | None, concurrency: int | None, as_json: bool) -> None:
    """``lego tasks screen`` without ``--run``: top up the run root to K attempts per task, then screen."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from lego_rl.cli.rollout_cmd import EXIT_SIGTERM, _until_sigterm
    from lego_rl.config.checks import run_checks
    from lego_rl.errors import ConfigError, TaskDataError
    from lego_rl.compose.harnesses import harness_inventory
    from lego_rl.compose.sessions.screen_session import ScreenSession
    from lego_rl.rollout.generate import RolloutResult
    from lego_rl.runstore.files import replace_file

    if window != "first":
        raise _fail("--window last reads a training run: give it with --run")
    high = k - 1 if max_solved is None else max_solved
    if not 0 <= min_solved <= high <= k:
        raise _fail(f"the band {min_solved}..{high} of k={k} is empty or outside 0..k")
    typed = rollout_options(data, vllm_url, harness)
    try:
        r = load(config, overrides, typed)
        # run_root_exists is the one finding a resumable screen expects (it reuses the directory); bad dataset
        # rows are named per row below rather than stopping the whole screen.
        errors = [f for f in run_checks(r, harnesses=harness_inventory(r)) if f.severity == "error"
                  and f.code not in ("run_root_exists", "dataset_row", "dataset_rows", "images_missing")]
        if errors:
            for f in errors:
                fail(f"{f.message} — {f.fix}", label="config")
            err.print("run `lego validate` for the full picture")
            raise typer.Exit(EXIT_USAGE)
        session = ScreenSession(r, k=k, ids=_ids(ids), harness=harness)
        planned = session.plan()
    except (ConfigError, TaskDataError, ValueError) as exc:
        raise _fail(str(exc)) from None
    if not as_json:
        for b in session.bad:
            where = f"row {b.row} {b.instance_id or '-'}: "
            err.print(f"[yellow]bad row[/] {escape(where + b.reason)}", highlight=False)
        err.print(escape(f"{session.layout.root}: {planned.reused} attempts reused, {len(planned.specs)} to roll "
                         f"out ({len(session.rows)} tasks, k={k})"), highlight=False)
    results: list[RolloutResult] = []
    if planned.specs:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err, disable=as_json) as bar:
            job = bar.add_task("screening rollouts", total=len(planned.specs))

            def on_progress(event: str, spec: object, result: RolloutResult | None) -> None:
                if event == "finished" and result is not None:
                    bar.update(job, advance=1, description=escape(
                        f"screening rollouts  {result.instance_id}#{result.index}: {result.termination.value}"))

            try:
                work = session.run(planned.specs, concurrency=concurrency or r.config.rollout.concurrency,
                                   progress=on_progress)
                results = asyncio.run(_until_sigterm(work))
            except asyncio.CancelledError:
                fail(f"stopped by SIGTERM; sandboxes cleaned up, outcomes so far saved under {session.layout.root} "
                     "(run the same command again to go on)", label="tasks screen")
                raise typer.Exit(EXIT_SIGTERM) from None
            except (ConfigError, TaskDataError) as exc:
                raise _fail(str(exc)) from None
    verdicts = session.verdicts(min_solved=min_solved, max_solved=max_solved)
    if output is not None:
        replace_file(output, "".join(line + "\n" for line in session.kept_lines(verdicts)))
    code = _print_screen(verdicts, session.attempts().terminations, k=k, min_solved=min_solved,
                         max_solved=max_solved, window=window, output=output, report=report, as_json=as_json,
                         extra={"run_root": str(session.layout.root), "reused": planned.reused,
                                "rolled_out": len(results)})
    # every task was topped up to k: one still short lost rollouts to the infrastructure
    short = any(v.decision == "too few attempts" for v in verdicts)
    raise typer.Exit(EXIT_INFRA if short else code)


def _print_screen(verdicts: list[Any], terminations: Counter[str], *, k: int, min_solved: int,
                  max_solved: int | None, window: str, output: Path | None, report: Path | None, as_json: bool,
                  extra: dict[str, Any] | None = None) -> int:
    """Write the report, print the summary (or the JSON), and return the exit code (0 kept, 1 none kept)."""
    from lego_rl.runstore.files import replace_file

    if report is not None:
        replace_file(report, "".join(v.model_dump_json() + "\n" for v in verdicts))
    band = (min_solved, k - 1 if max_solved is None else max_solved)
    kept = [v for v in verdicts if v.decision == "kept"]
    decisions = dict(sorted(Counter(v.decision for v in verdicts).items()))
    summary = {"tasks": len(verdicts), "kept": len(kept), "decisions": decisions,
               "terminations": dict(terminations.most_common()),
               "infrastructure_failures": sum(v.infrastructure_failures for v in verdicts),
               "band": list(band), "k": k, "window": window,
               "output": str(output) if output else None, "report": str(report) if report else None} | (extra or {})
    if as_json:
        out.print_json(json.dumps({"summary": summary, "tasks": [v.model_dump() for v in verdicts]}))
    else:
        table = Table(title=escape(f"lego tasks screen: {len(kept)} of {len(verdicts)} kept (k={k}, band "
                                   f"{band[0]}..{band[1]})"), title_justify="left")
        for col in ("decision", "tasks"):
            table.add_column(col)
        for decision, n in decisions.items():
            table.add_row(decision, str(n))
        out.print(table)
        named = [v for v in verdicts if v.decision in ("bad row", "too few attempts")]
        if named:
            why = Table(title="not screened", title_justify="left")
            for col in ("row", "task", "why", ):
                why.add_column(col, overflow="fold")
            for v in named:
                reason = v.detail or (f"{v.attempts} of {k} attempts; lost to the infrastructure: "
                                      + (", ".join(f"{t} {n}" for t, n in v.infrastructure_reasons.items()) or "none"))
                why.add_row(str(v.row or "-"), escape(v.instance_id or "-"), escape(reason))
            out.print(why)
        mix = Table(title="termination mix", title_justify="left")
        for col in ("termination", "rollouts"):
            mix.add_column(col)
        for reason, n in terminations.most_common():
            mix.add_row(escape(reason), str(n))
        out.print(mix)
    return EXIT_OK if kept else EXIT_FAILED


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


def register(app: typer.Typer) -> None:
    """Add `lego tasks ...` and `lego images` to the `lego` app."""
    tasks_app.command("prepare")(prepare)
    app.command("images")(images)
    app.add_typer(tasks_app, name="tasks")
