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
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from lego_rl.errors import GraderError, LegoError, SandboxError
from lego_rl.sandbox.base import ImageSpec
from lego_rl.swe.grader import GradeResult, grade
from lego_rl.swe.patch import capture_patch, take_snapshot
from lego_rl.swe.task_sandbox import SandboxOpener, SandboxTarget, task_sandbox_opener
from lego_rl.swe.workspace import prepare_workspace
from lego_rl.tasks.model import TaskRow

Verdict = Literal["gradable", "not gradable", "grader error", "setup error"]
BaselineKind = Literal["passes", "tests failed", "command not found", "collection error", "timeout", "infrastructure"]

_NOT_FOUND = re.compile(
    r"command not found|No module named '?(pytest|nose|tox)'?(?![\w.])|can't find '__main__' module", re.IGNORECASE)
_COLLECTION = re.compile(
    r"ERROR: file or directory not found|ERROR: not found:|ERROR collecting|errors? during collection|"
    r"no tests ran|collected 0 items|can't open file|Failed to import test module|Ran 0 tests|"
    r"ERROR: usage:|NO TESTS RAN|No tests found")
_PYTEST_COLLECTION_EXITS = (4, 5)  # usage error (e.g. file not found), no tests collected


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
    """Wall time of that setup (sandbox, prepare, snapshot, empty capture), seconds."""

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


async def check_workspace(meta: Any, opener: SandboxOpener, *, agent_user: str = "agent") -> None:
    """Set up the agent's side as a rollout does; raise ``LegoError`` naming the step that failed."""
    async with opener() as sb:
        await prepare_workspace(sb, workdir=meta.workdir, problem_statement=meta.problem_statement,
                                pre_commands=meta.pre_commands, agent_user=agent_user)
        snapshot = await take_snapshot(sb, meta.workdir)
        patch = await capture_patch(sb, snapshot)
    if patch.strip():
        raise SandboxError(f"the untouched workspace of {meta.instance_id} captured a {len(patch)}-byte patch: "
                           "the snapshot does not see the workspace as the grader's base")


async def check_task(row: TaskRow, *, provider: str = "bwrap", images: Mapping[str, ImageSpec] | None = None,
                     provider_options: Mapping[str, Any] | None = None, timeout: float = 180.0,
                     dataset_dir: Path | None = None,
                     sandbox_options: Mapping[str, Any] | None = None, workspace: bool = True) -> TaskCheck:
    """``dataset_dir`` resolves a row's relative ``repo_archive`` (tasks whose repository ships beside them);
    ``sandbox_options`` (memory_mb, network) should be the ones the rollouts use, so a task checked here
    is graded the same way in training. ``workspace=False`` skips the agent-side setup check."""
    meta = row.metadata
    target = SandboxTarget(provider, provider_options or {}, sandbox_options or {})
    opener = task_sandbox_opener(meta, target, images=images, dataset_dir=dataset_dir)

    iid = meta.instance_id
    ws, ws_s = "skipped", None
    if workspace:
        start = time.monotonic()
        try:
            await check_workspace(meta, opener)
            ws = "ok"
        except (LegoError, OSError) as exc:
            return TaskCheck(iid, "-", "-", "setup error", f"agent workspace: {str(exc).splitlines()[0]}",
                             workspace="error", workspace_s=round(time.monotonic() - start, 2))
        ws_s = round(time.monotonic() - start, 2)
    start = time.monotonic()
    try:
        base = await grade(meta, b"", open_sandbox=opener, timeout=timeout)
    except GraderError as exc:
        # A per-test grader refuses a baseline without a report; when its log shows the runner itself is
        # missing (no pytest in the image), that is the task's problem, not the infrastructure's.
        if missing := _NOT_FOUND.search(_eval_section(exc.output) or exc.output):
            return TaskCheck(iid, "error", "-", "not gradable", f"baseline command not found: {missing.group(0)}",
                             baseline_reason="command not found", baseline_s=round(time.monotonic() - start, 2),
                             workspace=ws, workspace_s=ws_s)
        return TaskCheck(iid, "error", "-", "grader error", str(exc).splitlines()[0],
                         baseline_reason="infrastructure", baseline_s=round(time.monotonic() - start, 2),
                         workspace=ws, workspace_s=ws_s)
    kind, why = classify_baseline(base, per_test=meta.swepro is not None)
    baseline_s = round(time.monotonic() - start, 2)
    baseline = {"passes": "passes", "tests failed": "fails"}.get(kind, "error")

    def result(reference: str, verdict: Verdict, detail: str, reference_s: float | None = None) -> TaskCheck:
        return TaskCheck(iid, baseline, reference, verdict, detail, kind, baseline_s, reference_s, ws, ws_s)

    # Only a test run that failed says anything the reference could change; skip the second grading otherwise.
    if kind in ("command not found", "timeout"):
        return result("-", "not gradable", f"baseline {kind}: {why}")
    reference, detail, reference_s = "none", "", None
    if meta.reference_patch:
        start = time.monotonic()
        try:
            ref = await grade(meta, meta.reference_patch, open_sandbox=opener, timeout=timeout)
        except GraderError as exc:
            return result("error", "grader error", str(exc).splitlines()[0], round(time.monotonic() - start, 2))
        reference_s = round(time.monotonic() - start, 2)
        reference = "passes" if ref.solved else "fails"
        if not ref.solved:
            detail = f"reference: {ref.reason}"
    if base.solved:
        return result(reference, "not gradable", "the unmodified image already passes", reference_s)
    if kind == "collection error":
        if reference == "passes":
            return result(reference, "gradable", f"baseline collection error repaired by the reference: {why}",
                          reference_s)
        return result(reference, "not gradable", f"baseline {kind}: {why}" + (f"; {detail}" if detail else ""),
                      reference_s)
    if reference == "fails":
        return result(reference, "not gradable", detail, reference_s)
    return result(reference, "gradable", "" if reference == "passes" else "(no reference patch)", reference_s)


async def check_tasks(rows: Sequence[TaskRow], *, concurrency: int = 2, **kwargs: Any) -> list[TaskCheck]:
    """Check ``rows`` with at most ``concurrency`` tasks in flight; results in input order."""
    gate = asyncio.Semaphore(concurrency)

    async def one(row: TaskRow) -> TaskCheck:
        async with gate:
            return await check_task(row, **kwargs)

    return list(await asyncio.gather(*(one(r) for r in rows)))
