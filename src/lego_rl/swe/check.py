"""Task validation (``lego tasks check``): a task is gradable when the unmodified image's official tests
*run and fail*, and the reference solution, when the row has one, passes them.

A non-zero exit of the test command is not enough: a command that does not exist (exit 127), a test
module that is not there or tests that hang also exit non-zero, and training on such a task rewards
nothing the policy can do. The baseline is classified from the grader's result and the eval step's
output (``classify_baseline``):

* ``tests failed``: the tests ran and at least one failed. Gradable.
* ``command not found``: exit 126/127, or the runner itself is missing (``No module named pytest``).
* ``collection error``: the runner found nothing to run or could not load the test files (pytest exit
  4/5, ``ERROR collecting``, ``can't open file``, unittest's ``Failed to import test module``, a SWE-bench
  Pro parser that reported no test). Gradable only when the reference patch passes: then what failed to
  load is what the fix adds (a new module, a new name); without a reference a missing test module and a
  missing name cannot be told apart.
* ``timeout``: the tests ran past the grader timeout.
* ``infrastructure``: the grader itself failed (sandbox, setup, test patch that does not apply).

Before grading, the agent's side of a rollout is set up exactly as ``generate()`` does it (a seeded
sandbox of the image, ``prepare_workspace``, ``take_snapshot``, and a capture that must come back
empty): an image on which that fails (ACLs that cannot be copied, a workdir that is not there, a
pre-command that fails) would fail every rollout at ``sandbox_setup``, so it is a ``setup error`` here.

In that same prepared workspace a probe (``_PROBE``) looks for what the agent could read but must not:

* **future history**: a commit object that is not an ancestor of HEAD (``strip_future_history`` prunes
  them, but a pack kept by a ``.keep`` file or an alternates object store survives ``git gc``), or the
  reference fix's file contents already in the object store or on disk;
* **hidden tests reachable**: the contents the row's ``test_patch`` gives a file, found in the object store
  or in any file of the workdir (the tests the agent is graded by are meant to be seen only by the grader).

Both are found by content: the probe computes the blob ids the patches would produce (in a throw-away
index and object directory, so the real store is never written) and looks for them.

Last, the **determinism** check grades one more time (the reference patch when there is one, else the
empty patch) and compares the per-test verdicts of the two runs: a test whose status differs is flaky,
and a flaky test rewards noise.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from lego_rl.errors import GraderError, LegoError, SandboxError
from lego_rl.sandbox.base import ImageSpec, Sandbox
from lego_rl.swe.baseline import BaselineCache
from lego_rl.swe.grader import GradeResult, grade
from lego_rl.swe.patch import capture_patch, take_snapshot
from lego_rl.swe.shell import GIT
from lego_rl.swe.task_sandbox import SandboxOpener, SandboxTarget, task_sandbox_opener
from lego_rl.swe.workspace import prepare_workspace
from lego_rl.tasks.model import TaskRow

Verdict = Literal["gradable", "not gradable", "grader error", "setup error"]
REASONS = {
    "base passes": "the unmodified repository already passes the official tests",
    "base not runnable": "the official tests do not run on the unmodified repository (command, collection, timeout)",
    "reference fails": "the reference fix does not pass the official tests",
    "flaky": "two runs of the same tree gave some test different verdicts",
    "hidden tests reachable": "the official tests' contents can be read from the agent's workspace",
    "future history": "the agent's workspace holds history beyond the task's base commit",
    "setup error": "the agent's workspace cannot be set up as a rollout sets it up",
    "grader error": "the grader itself failed (sandbox, test patch that does not apply)",
}
"""Reason codes of a task that is not gradable, each with what it means (a task may have several)."""
BaselineKind = Literal["passes", "tests failed", "command not found", "collection error", "timeout", "infrastructure"]

_NOT_FOUND = re.compile(
    r"command not found|No module named '?(pytest|nose|tox)'?(?![\w.])|can't find '__main__' module", re.IGNORECASE)
_COLLECTION = re.compile(
    r"ERROR: file or directory not found|ERROR: not found:|ERROR collecting|errors? during collection|"
    r"no tests ran|collected 0 items|can't open file|Failed to import test module|Ran 0 tests|"
    r"ERROR: usage:|NO TESTS RAN|No tests found")
_PYTEST_COLLECTION_EXITS = (4, 5)  # usage error (e.g. file not found), no tests collected
_EMPTY_BLOB = "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"  # an empty file's contents say nothing about the tests

# Run as root in the agent's prepared workspace (after the capture, so nothing it writes is seen by the
# capture). Prints one finding per line: ALTERNATES <paths>, FUTURE <commit>, LEAK <test|reference>
# <path> <where>, NOAPPLY <test|reference>. The patches' blob ids come from a temp index and a temp object
# directory (the real store as an alternate): git writes the new blobs there, never into the repository.
_PROBE = f"""
g() {{ {GIT} "$@"; }}
g rev-parse --verify -q HEAD >/dev/null || exit 0
P=/tmp/.lego-probe; rm -rf $P; mkdir -p $P/obj  # the patches are $P-test.patch, $P-reference.patch
objdir="$(cd "$(g rev-parse --git-path objects)" && pwd)"
[ -s "$objdir/info/alternates" ] && echo "ALTERNATES $(tr '\\n' ' ' < "$objdir/info/alternates")"
g cat-file --batch-all-objects --batch-check='%(objecttype) %(objectname)' > $P/objects
g rev-list HEAD | sort > $P/ancestors
awk '$1=="commit"{{print $2}}' $P/objects | sort | comm -23 - $P/ancestors | head -20 | sed 's/^/FUTURE /'
awk '$1=="blob"{{print $2" (object store)"}}' $P/objects > $P/have
find . -path ./.git -prune -o -type f -size -1024k -print | sed 's|^\\./||' > $P/files
g hash-object --no-filters --stdin-paths < $P/files | paste -d' ' - $P/files >> $P/have
for which in test reference; do
  [ -s $P-$which.patch ] || continue
  rm -f $P/index
  if ! GIT_INDEX_FILE=$P/index g read-tree HEAD || ! GIT_INDEX_FILE=$P/index GIT_OBJECT_DIRECTORY=$P/obj \\
      GIT_ALTERNATE_OBJECT_DIRECTORIES="$objdir" g apply --cached $P-$which.patch 2>/dev/null; then
    echo "NOAPPLY $which"; continue
  fi
  GIT_INDEX_FILE=$P/index GIT_OBJECT_DIRECTORY=$P/obj GIT_ALTERNATE_OBJECT_DIRECTORIES="$objdir" \\
    g diff --cached --raw --no-renames --abbrev=40 HEAD | while read -r _ _ _ new _ path; do
    case "$new" in 0000000000000000000000000000000000000000|{_EMPTY_BLOB}) continue;; esac
    where="$(awk -v h="$new" '$1==h {{sub(/^[^ ]+ /, ""); print; exit}}' $P/have)"
    [ -n "$where" ] && echo "LEAK $which $path $where"
  done
done
rm -rf $P $P-*.patch
"""


@dataclass
class TaskCheck:
    instance_id: str
    baseline: str
    """``fails`` (the tests ran and failed: good), ``passes`` (already solved: useless), ``error``
    (the tests did not run; ``baseline_reason`` says why)."""
    reference: str
    """``passes``, ``fails``, ``none`` (no reference in the row) or ``error``."""
    verdict: Verdict
    detail: str = ""
    baseline_reason: BaselineKind | str = ""
    """``tests failed``, ``passes``, ``command not found``, ``collection error``, ``timeout``, ``infrastructure``."""
    baseline_s: float = 0.0
    """Wall time of the baseline grading (sandbox included), seconds."""
    reference_s: float | None = None
    """Wall time of the reference grading, seconds (None when it did not run)."""
    workspace: str = "ok"
    """The agent's workspace as a rollout sets it up: ``ok``, ``error`` (see detail) or ``skipped``."""
    workspace_s: float | None = None
    """Wall time of that setup (sandbox, prepare, snapshot, empty capture, probe), seconds."""
    history: str = "skipped"
    """``clean``, ``skipped`` (no workspace check) or what the agent could read of the future (commits
    beyond HEAD, an alternates store, the reference fix's contents)."""
    hidden_tests: str = "skipped"
    """``clean``, ``skipped`` or where the contents of the row's test files are reachable from the workspace."""
    repeat: str = "skipped"
    """``same`` (a second run gave every test the same verdict), ``skipped``, or which tests differed."""
    repeat_s: float | None = None
    """Wall time of the second run, seconds."""
    reasons: list[str] = field(default_factory=list)
    """Why the task is not gradable, as stable codes (see ``REASONS``); empty for a gradable task."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _eval_section(output: str) -> str:
    """The test run's part of a grader log (from its last ``===== eval``/``run_script`` section)."""
    marks = [m.start() for m in re.finditer(r"^===== (eval as|run_script|parser)", output, re.MULTILINE)]
    return output[marks[0]:] if marks else output


def classify_baseline(result: GradeResult, *, per_test: bool = False) -> tuple[BaselineKind, str]:
    """Why the unmodified image's grading ended as it did, and the text that shows it. ``per_test``: the
    verdict came from a per-test report (SWE-bench Pro's parser), whose ``result.tests`` is the evidence."""
    if result.solved:
        return "passes", result.reason
    if result.timed_out:
        return "timeout", result.reason
    text = _eval_section(result.output)
    code = result.eval_exit_code
    missing = _NOT_FOUND.search(text)
    if code in (126, 127) or missing:
        return "command not found", f"exit {code}" + (f": {missing.group(0)}" if missing else "")
    if per_test or result.tests:
        # The per-test report is the evidence; an empty one means nothing ran.
        return ("tests failed", result.reason) if result.tests else ("collection error", "no test was reported")
    signs = list(dict.fromkeys(m.group(0) for m in _COLLECTION.finditer(text)))
    if signs or (code in _PYTEST_COLLECTION_EXITS and "pytest" in text):
        return "collection error", f"exit {code}" + (f": {'; '.join(signs[:3])}" if signs else "")
    return "tests failed", result.reason


@dataclass
class Probe:
    """What the agent's prepared workspace gives away (``_PROBE``'s findings, sorted)."""

    future: list[str] = field(default_factory=list)
    hidden_tests: list[str] = field(default_factory=list)
    not_applied: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, output: str) -> Probe:
        probe = cls()
        for line in output.splitlines():
            kind, _, rest = line.partition(" ")
            if kind == "ALTERNATES":
                probe.future.append(f"an alternates object store: {rest.strip()}")
            elif kind == "FUTURE":
                probe.future.append(f"commit {rest.strip()[:12]} is not an ancestor of HEAD")
            elif kind == "LEAK":
                which, _, found = rest.partition(" ")
                path, _, where = found.partition(" ")
                if which == "test":
                    probe.hidden_tests.append(f"{path} as in test_patch: {where}")
                else:
                    probe.future.append(f"the reference fix's {path}: {where}")
            elif kind == "NOAPPLY":
                probe.not_applied.append(rest.strip())
        return probe


async def check_workspace(meta: Any, opener: SandboxOpener, *, agent_user: str = "agent") -> Probe:
    """Set up the agent's side as a rollout does and probe it for future history and the hidden tests;
    raise ``LegoError`` naming the step that failed."""
    async with opener() as sb:
        await prepare_workspace(sb, workdir=meta.workdir, problem_statement=meta.problem_statement,
                                pre_commands=meta.pre_commands, agent_user=agent_user)
        snapshot = await take_snapshot(sb, meta.workdir)
        patch = await capture_patch(sb, snapshot)
        if not patch.strip():
            for which, text in (("test", meta.test_patch), ("reference", meta.reference_patch)):
                if text:
                    await sb.write_file(f"/tmp/.lego-probe-{which}.patch", text)
            res = await sb.exec(["bash", "-c", _PROBE], cwd=meta.workdir, timeout=600)
            if res.exit_code != 0:
                raise SandboxError(f"the workspace probe of {meta.instance_id} exited {res.exit_code}: "
                                   f"{(res.stderr or res.stdout).strip()[-300:]}")
    if patch.strip():
        raise SandboxError(f"the untouched workspace of {meta.instance_id} captured a {len(patch)}-byte patch: "
                           "the snapshot does not see the workspace as the grader's base")
    return Probe.parse(res.stdout)


@dataclass
class CheckCosts:
    """Where a task check's time went, seconds: ``sandbox`` (creating, seeding with the repository and
    destroying sandboxes), ``setup`` (the agent-side install: pre-commands, history stripping, snapshot,
    probe), ``tests`` (grading: test patch, runs of the official tests, verdicts)."""

    sandbox: float = 0.0
    setup: float = 0.0
    tests: float = 0.0

    def timed(self, opener: SandboxOpener) -> SandboxOpener:
        """``opener`` whose sandboxes' creation and teardown time is added to ``sandbox``."""

        @contextlib.asynccontextmanager
        async def open_timed() -> AsyncIterator[Sandbox]:
            start = time.monotonic()
            manager = opener()
            try:
                sb = await manager.__aenter__()
            finally:
                self.sandbox += time.monotonic() - start
            failure: BaseException | None = None
            try:
                yield sb
            except BaseException as exc:
                failure = exc
                raise
            finally:
                start = time.monotonic()
                try:
                    await manager.__aexit__(type(failure) if failure else None, failure,
                                            failure.__traceback__ if failure else None)
                finally:
                    self.sandbox += time.monotonic() - start

        return open_timed

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in asdict(self).items()}


def _differing(first: GradeResult, second: GradeResult) -> str:
    """``same``, or the tests whose verdicts two runs of one tree disagree on."""
    if not first.tests and not second.tests:
        return "same" if first.solved == second.solved else (
            f"exit-status verdict differs: {first.reason} / {second.reason}")
    names = sorted(set(first.tests) | set(second.tests))
    diff = [f"{n} ({first.tests.get(n, 'absent')} then {second.tests.get(n, 'absent')})"
            for n in names if first.tests.get(n) != second.tests.get(n)]
    if not diff:
        return "same"
    more = f" (+{len(diff) - 5} more)" if len(diff) > 5 else ""
    return f"{len(diff)} of {len(names)} tests differ: " + "; ".join(diff[:5]) + more


async def check_task(row: TaskRow, *, provider: str = "bwrap", images: Mapping[str, ImageSpec] | None = None,
                     provider_options: Mapping[str, Any] | None = None, timeout: float = 180.0,
                     dataset_dir: Path | None = None,
                     sandbox_options: Mapping[str, Any] | None = None, workspace: bool = True,
                     repeat: bool = True, costs: CheckCosts | None = None) -> TaskCheck:
    """``dataset_dir`` resolves a row's relative ``repo_archive`` (tasks whose repository ships beside them);
    ``sandbox_options`` (memory_mb, network) should be the ones the rollouts use, so a task checked here
    is graded the same way in training. ``workspace=False`` skips the agent-side setup check and its
    probe; ``repeat=False`` skips the determinism run. ``costs`` receives the time split."""
    meta = row.metadata
    costs = costs if costs is not None else CheckCosts()
    target = SandboxTarget(provider, provider_options or {}, sandbox_options or {})
    opener = costs.timed(task_sandbox_opener(meta, target, images=images, dataset_dir=dataset_dir))
    # Each check gets its own baseline cache: the process-wide one would hand the determinism run and a
    # re-check the first run's baseline instead of running the tests again.
    baselines = BaselineCache()

    async def graded(patch: bytes | str) -> tuple[GradeResult, float]:
        start, sandbox_before = time.monotonic(), costs.sandbox
        try:
            return await grade(meta, patch, open_sandbox=opener, timeout=timeout, baselines=baselines), round(
                time.monotonic() - start, 2)
        finally:
            costs.tests += time.monotonic() - start - (costs.sandbox - sandbox_before)

    iid = meta.instance_id
    ws, ws_s, probe = "skipped", None, None
    if workspace:
        start, sandbox_before = time.monotonic(), costs.sandbox
        try:
            probe = await check_workspace(meta, opener)
            ws = "ok"
        except (LegoError, OSError) as exc:
            ws_s = round(time.monotonic() - start, 2)
            costs.setup += max(0.0, ws_s - (costs.sandbox - sandbox_before))
            return TaskCheck(iid, "-", "-", "setup error", f"agent workspace: {str(exc).splitlines()[0]}",
                             workspace="error", workspace_s=ws_s, reasons=["setup error"])
        ws_s = round(time.monotonic() - start, 2)
        costs.setup += max(0.0, ws_s - (costs.sandbox - sandbox_before))
    history = ("; ".join(probe.future) or "clean") if probe else "skipped"
    hidden = ("; ".join(probe.hidden_tests) or "clean") if probe else "skipped"
    leaks = ([f"future history: {history}"] if probe and probe.future else []) + (
        [f"hidden tests reachable: {hidden}"] if probe and probe.hidden_tests else [])
    leak_codes = (["future history"] if probe and probe.future else []) + (
        ["hidden tests reachable"] if probe and probe.hidden_tests else [])
    try:
        base, baseline_s = await graded(b"")
    except GraderError as exc:
        # A per-test grader refuses a baseline without a report; when its log shows the runner itself is
        # missing (no pytest in the image), that is the task's problem, not the infrastructure's.
        if missing := _NOT_FOUND.search(_eval_section(exc.output) or exc.output):
            return TaskCheck(iid, "error", "-", "not gradable", f"baseline command not found: {missing.group(0)}",
                             baseline_reason="command not found", workspace=ws, workspace_s=ws_s,
                             history=history, hidden_tests=hidden, reasons=["base not runnable", *leak_codes])
        return TaskCheck(iid, "error", "-", "grader error", str(exc).splitlines()[0],
                         baseline_reason="infrastructure", workspace=ws, workspace_s=ws_s,
                         history=history, hidden_tests=hidden, reasons=["grader error"])
    kind, why = classify_baseline(base, per_test=meta.swepro is not None)
    baseline = {"passes": "passes", "tests failed": "fails"}.get(kind, "error")
    same, repeat_s = "skipped", None

    def result(reference: str, verdict: Verdict, detail: str, reasons: list[str],
               reference_s: float | None = None) -> TaskCheck:
        if verdict == "gradable" and (leak_codes or same not in ("same", "skipped")):
            verdict = "not gradable"
        if verdict != "grader error":
            reasons = reasons + leak_codes + (["flaky"] if same not in ("same", "skipped") else [])
            detail = "; ".join(d for d in [detail, *leaks, *([f"flaky: {same}"] if "flaky" in reasons else [])] if d)
        return TaskCheck(iid, baseline, reference, verdict, detail, kind, baseline_s, reference_s, ws, ws_s,
                         history, hidden, same, repeat_s, list(dict.fromkeys(reasons)))

    # Only a test run that failed says anything the reference could change; skip the second grading otherwise.
    if kind in ("command not found", "timeout"):
        return result("-", "not gradable", f"baseline {kind}: {why}", ["base not runnable"])
    reference, detail, reference_s, last = "none", "", None, base
    if meta.reference_patch:
        try:
            ref, reference_s = await graded(meta.reference_patch)
        except GraderError as exc:
            return result("error", "grader error", str(exc).splitlines()[0], ["grader error"])
        reference, last = ("passes" if ref.solved else "fails"), ref
        if not ref.solved:
            detail = f"reference: {ref.reason}"
    if repeat:
        # The tree that decides the reward (the fixed one when the row has a fix) is run again.
        try:
            again, repeat_s = await graded(meta.reference_patch or b"")
        except GraderError as exc:
            return result(reference, "grader error", f"second run: {str(exc).splitlines()[0]}", ["grader error"],
                          reference_s)
        same = _differing(last, again)
    if base.solved:
        return result(reference, "not gradable", "the unmodified image already passes",
                      ["base passes"] + (["reference fails"] if reference == "fails" else []), reference_s)
    if kind == "collection error":
        if reference == "passes":
            return result(reference, "gradable", f"baseline collection error repaired by the reference: {why}", [],
                          reference_s)
        return result(reference, "not gradable", f"baseline {kind}: {why}" + (f"; {detail}" if detail else ""),
                      ["base not runnable"] + (["reference fails"] if reference == "fails" else []), reference_s)
    if reference == "fails":
        return result(reference, "not gradable", detail, ["reference fails"], reference_s)
    return result(reference, "gradable", "" if reference == "passes" else "(no reference patch)", [], reference_s)


async def check_tasks(rows: Sequence[TaskRow], *, concurrency: int = 2, **kwargs: Any) -> list[TaskCheck]:
    """Check ``rows`` with at most ``concurrency`` tasks in flight; results in input order."""
    gate = asyncio.Semaphore(concurrency)

    async def one(row: TaskRow) -> TaskCheck:
        async with gate:
            return await check_task(row, **kwargs)

    return list(await asyncio.gather(*(one(r) for r in rows)))
