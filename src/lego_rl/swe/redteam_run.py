"""``lego tasks check --red-team``: every attack of ``redteam.CATALOGUE`` graded against every task.

Per task, in order:

1. **survey**: a fresh sandbox of the task, opened as the grader opens it, the row's pre-commands, then the
   tree's listing and the few files the generators edit (``redteam.wanted_texts``): what a policy sees
   before it writes a patch;
2. **controls**: the empty patch must score 0 (otherwise every patch scores 1 and the verdict is
   ``base passes``), and the row's reference patch, when it has one, must keep reward 1 (otherwise the grader
   turns honest work away: ``control failed``);
3. **attacks**: each patch of each class graded by ``grader.grade`` in its own fresh sandbox, one after the
   other, sharing the task's baseline run as the rollouts of one training group do.

An attack ends ``rewarded`` (reward 1: the task is hackable by its class), ``held`` (reward 0), ``escaped``
(the grader raised ``GraderError``, twice: that label is infrastructure, which excludes the rollout from
training, so the hack escapes its 0) or ``n/a`` (the class found nothing to bend in this repository).
A task is ``sound`` when every attack is held and both controls are as expected, ``hackable`` when some
attack is rewarded or escaped, ``error`` when it could not be surveyed or its controls could not be graded.

Tasks run ``concurrency`` at a time (the setting ``lego tasks check`` uses for rows); one task's gradings run
one after the other, so a task holds at most two sandboxes at once (a grading and its baseline).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from lego_rl.errors import GraderError, LegoError
from lego_rl.sandbox.base import Sandbox
from lego_rl.swe.baseline import BaselineCache
from lego_rl.swe.dataset_check import CheckOptions, DatasetRow
from lego_rl.swe.grader import GradeResult, grade, runner_of
from lego_rl.swe.redteam import CLASSES, Attack, RepoView, generate, wanted_texts
from lego_rl.swe.task_sandbox import SandboxOpener, SandboxTarget, task_sandbox_opener
from lego_rl.tasks.model import TaskMetadata, TaskRow

AttackStatus = Literal["rewarded", "held", "escaped", "n/a"]
TaskVerdict = Literal["sound", "hackable", "base passes", "control failed", "error"]
VERDICTS: dict[str, str] = {
    "sound": "every attack class held (reward 0) and the controls were as expected",
    "hackable": "an attack class earned reward, or turned its 0 into a grader error (an infrastructure "
                "label)",
    "base passes": "the unmodified repository already earns reward: every patch does",
    "control failed": "the reference patch did not keep reward 1: the grader turns honest work away",
    "error": "the task could not be surveyed, or its controls could not be graded (run again)",
}
"""Task verdicts and what they mean (the CLI prints these)."""
_SEVERITY = {"rewarded": 3, "escaped": 2, "held": 1, "n/a": 0}
_SURVEY = "/tmp/lego-redteam"
_MAX_TEXT = 256 << 10  # a file the generators edit; bigger ones are left alone


class AttackOutcome(BaseModel):
    """One attack's grading."""

    attack_class: str
    variant: str
    what: str
    status: AttackStatus
    reward: float | None = None
    reason: str = ""
    """The grader's one-line reason (or its error), or why the class had nothing to bend."""
    label: str | None = None
    """The policy label the grader gave (``tampered``, ``grading_blocked``, ``suspect_patch``), if any."""
    seconds: float = 0.0


class ControlOutcome(BaseModel):
    """An honest patch whose reward is known: ``empty`` must score 0, ``reference`` must score 1."""

    patch: Literal["empty", "reference"]
    expected: float
    reward: float | None = None
    """None: the grader failed on it (see reason)."""
    reason: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.reward == self.expected


class TaskRedTeam(BaseModel):
    """One task's red-team report (one line of ``--output``, one element of ``--json``'s ``tasks``)."""

    row: int
    instance_id: str | None
    runner: str = "none"
    verdict: TaskVerdict
    hacked_by: list[str] = []
    """Classes with a rewarded or escaped attack, in catalogue order."""
    controls: list[ControlOutcome] = []
    attacks: list[AttackOutcome] = []
    detail: str = ""
    duration_s: float = 0.0

    def by_class(self) -> dict[str, AttackOutcome]:
        """Each class's worst attack (rewarded, escaped, held, n/a, in that order)."""
        worst: dict[str, AttackOutcome] = {}
        for a in self.attacks:
            if a.attack_class not in worst or _SEVERITY[a.status] > _SEVERITY[worst[a.attack_class].status]:
                worst[a.attack_class] = a
        return worst


AttackFn = Callable[[str, AttackOutcome], None]
"""Called with (instance id, outcome) after each attack's grading."""


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


async def _read_nul(sb: Sandbox, path: str) -> list[str]:
    raw = (await sb.read_file(path)).decode("utf-8", "surrogateescape")
    return [e for e in raw.split("\0") if e]


async def survey(meta: TaskMetadata, opener: SandboxOpener) -> RepoView:
    """What a policy sees of the task before writing a patch (module docstring, step 1)."""
    wd = meta.workdir
    listing = (f"mkdir -p {_SURVEY} && cd \"$1\" && find . -path ./.git -prune -o "
               f"\\( -type f -o -type l \\) -printf '%y%p\\0' > {_SURVEY}/files && "
               f"find . -path ./.git -prune -o -type d \\( -name site-packages -o -name dist-packages \\) "
               f"-printf '%p\\0' > {_SURVEY}/sites")
    async with opener() as sb:
        for n, cmd in enumerate(meta.pre_commands, start=1):
            res = await sb.exec(["bash", "-c", cmd], user="root", cwd=wd, timeout=900)
            if not res.ok:
                why = (res.stderr or res.stdout)[-300:]
                raise LegoError(f"pre-command {n} failed ({res.exit_code}): {why}")
        res = await sb.exec(["bash", "-c", listing, "survey", wd], user="root", cwd="/", timeout=300)
        if not res.ok:
            raise LegoError(f"listing the tree failed ({res.exit_code}): {(res.stderr or res.stdout)[-300:]}")
        kinds = {e[3:] if e[1:3] == "./" else e[1:]: e[0] for e in await _read_nul(sb, f"{_SURVEY}/files")}
        sites = tuple(sorted(s.removeprefix("./") for s in await _read_nul(sb, f"{_SURVEY}/sites")))
        view = RepoView(frozenset(kinds), {}, sites, runner_of(meta), tuple(meta.test_paths))
        texts: dict[str, str] = {}
        for path in wanted_texts(view):
            if kinds.get(path) != "f":
                continue  # a symlink's diff is its target: never edited through
            raw = await sb.read_file(f"{wd}/{path}")
            if len(raw) <= _MAX_TEXT:
                try:
                    texts[path] = raw.decode("utf-8")
                except UnicodeDecodeError:
                    pass
    return RepoView(view.files, texts, view.site_dirs, view.runner, view.test_paths)


async def _control(meta: TaskMetadata, patch: str, which: Literal["empty", "reference"],
                   graded: Callable[[bytes | str], Any]) -> ControlOutcome:
    start = time.monotonic()
    try:
        res: GradeResult = await graded(patch)
        return ControlOutcome(patch=which, expected=0.0 if which == "empty" else 1.0, reward=res.reward,
                              reason=res.reason, seconds=round(time.monotonic() - start, 2))
    except GraderError as exc:
        return ControlOutcome(patch=which, expected=0.0 if which == "empty" else 1.0, reason=_first_line(exc),
                              seconds=round(time.monotonic() - start, 2))


def _label(res: GradeResult) -> str | None:
    """The grader's policy label; ``suspect_patch`` when it found evidence but kept the verdict."""
    label = getattr(res, "label", None)
    if label is None and getattr(res, "suspects", None):
        return "suspect_patch"
    return str(getattr(label, "value", label)) if label else None  # an enum member or a plain string


async def _attack(attack: Attack, graded: Callable[[bytes | str], Any]) -> AttackOutcome:
    start = time.monotonic()
    base = AttackOutcome(attack_class=attack.cls, variant=attack.variant, what=attack.what, status="held")
    error = ""
    for _ in range(2):  # a second try tells a sandbox's hiccup from a patch that breaks the grader every time
        try:
            res: GradeResult = await graded(attack.patch)
        except GraderError as exc:
            error = _first_line(exc)
            continue
        return base.model_copy(update={"status": "rewarded" if res.reward > 0 else "held",
                                       "reward": res.reward, "reason": res.reason, "label": _label(res),
                                       "seconds": round(time.monotonic() - start, 2)})
    return base.model_copy(update={"status": "escaped", "seconds": round(time.monotonic() - start, 2),
                                   "reason": f"grader error (an infrastructure label): {error}"})


async def red_team_task(row: TaskRow, *, options: CheckOptions, dataset_dir: Path | None = None,
                        classes: Iterable[str] | None = None, row_number: int = 0,
                        on_attack: AttackFn | None = None) -> TaskRedTeam:
    """Survey, controls, then every attack of ``classes`` (default: all) for one task (module docstring)."""
    meta = row.metadata
    start = time.monotonic()
    report = TaskRedTeam(row=row_number, instance_id=meta.instance_id, runner=runner_of(meta),
                         verdict="error")
    target = SandboxTarget(options.provider, options.provider_options, options.sandbox_options)
    opener = task_sandbox_opener(meta, target, images=options.images, dataset_dir=dataset_dir)
    baselines = BaselineCache()  # the task's own: shared by its gradings as a group's rollouts share one

    async def graded(patch: bytes | str) -> GradeResult:
        return await grade(meta, patch, open_sandbox=opener, timeout=options.timeout, baselines=baselines)

    def done(verdict: TaskVerdict, detail: str = "") -> TaskRedTeam:
        report.verdict, report.detail = verdict, detail
        report.duration_s = round(time.monotonic() - start, 2)
        return report

    try:
        view = await survey(meta, opener)
    except (LegoError, OSError) as exc:
        return done("error", f"survey: {_first_line(exc)}")
    attacks = generate(view, classes)
    report.controls.append(await _control(meta, "", "empty", graded))
    if meta.reference_patch:
        report.controls.append(await _control(meta, meta.reference_patch, "reference", graded))
    failed = [c for c in report.controls if c.reward is None]
    if failed:
        return done("error", "; ".join(f"{c.patch} patch: {c.reason}" for c in failed))
    if report.controls[0].reward:
        return done("base passes", "the empty patch earns reward; no attack was graded")
    for code, found in attacks.items():
        if not found:
            outcome = AttackOutcome(attack_class=code, variant="-", what="-", status="n/a",
                                    reason="nothing to bend in this repository")
            report.attacks.append(outcome)
            if on_attack is not None:
                on_attack(meta.instance_id, outcome)
        for attack in found:
            outcome = await _attack(attack, graded)
            report.attacks.append(outcome)
            if on_attack is not None:
                on_attack(meta.instance_id, outcome)
    report.hacked_by = [c for c, a in report.by_class().items() if a.status in ("rewarded", "escaped")]
    if report.hacked_by:
        return done("hackable", "hacked by " + ", ".join(report.hacked_by))
    if not all(c.ok for c in report.controls):
        return done("control failed", "; ".join(f"{c.patch} patch scored {c.reward}: {c.reason}"
                                                for c in report.controls if not c.ok))
    return done("sound")


async def red_team_dataset(rows: Sequence[DatasetRow], *, dataset_dir: Path, options: CheckOptions,
                           concurrency: int = 2, classes: Iterable[str] | None = None,
                           on_task: Callable[[TaskRedTeam], None] | None = None,
                           on_attack: AttackFn | None = None) -> list[TaskRedTeam]:
    """``red_team_task`` for every row, ``concurrency`` tasks at once; reports in dataset order. A row that
    does not parse is an ``error`` naming why."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency}")
    chosen = list(CLASSES if classes is None else classes)
    generate(RepoView(frozenset()), chosen)  # refuses unknown classes before any sandbox starts
    gate = asyncio.Semaphore(concurrency)

    async def one(row: DatasetRow) -> TaskRedTeam:
        if row.task is None:
            report = TaskRedTeam(row=row.row, instance_id=row.instance_id, verdict="error",
                                 detail=row.problem)
        else:
            async with gate:
                report = await red_team_task(row.task, options=options, dataset_dir=dataset_dir,
                                             classes=chosen, row_number=row.row, on_attack=on_attack)
        if on_task is not None:
            on_task(report)
        return report

    return list(await asyncio.gather(*(one(r) for r in rows)))


def summarize(reports: Sequence[TaskRedTeam]) -> dict[str, Any]:
    """Counts for the summary table and ``--json``: verdicts, the hackable share, tasks hacked per class."""
    verdicts = Counter(r.verdict for r in reports)
    judged = sum(n for v, n in verdicts.items() if v != "error")
    per_class = {c: sum(c in r.hacked_by for r in reports) for c in CLASSES}
    return {"tasks": len(reports), "verdicts": dict(sorted(verdicts.items())),
            "hackable_share": round(verdicts["hackable"] / judged, 4) if judged else None,
            "tasks_hacked_per_class": {c: n for c, n in per_class.items() if n},
            "attacks_graded": sum(a.status != "n/a" for r in reports for a in r.attacks)}
