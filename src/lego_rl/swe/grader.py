"""The fresh-sandbox grader: the agent's patch against the official tests, in a new sandbox.

Order of steps, all as root unless noted, in a fresh sandbox of the task's image:

1. the row's pre-commands (the agent sandbox ran them too, so the patch has the same base);
2. the agent patch: ``git apply --3way``, then plain ``git apply``, then ``patch -p1``; the tree is
   restored between attempts, so a half-applied attempt never reaches the next one. A patch that
   applies in no way scores 0;
3. the official tests win: every path of the test patch is reset to HEAD (deleted when absent at
   HEAD), then the test patch is applied. This runs *after* the agent patch on purpose: an agent that
   rewrote or weakened an official test gets the official version back, and an agent that wrote its
   own file at an official test path does not make its (correct) patch unappliable. SWE-bench Pro
   rows use the last line of ``before_repo_set_cmd`` (which checks the official test files out) here;
4. the verdict command as ``eval_user`` with the grader timeout: ``eval_cmd`` (exit 0 = solved),
   the f2p script under pytest, or SWE-bench Pro's run script + parser (every fail-to-pass and
   pass-to-pass test PASSED).

Reward is 1 only on success. Anything the grader itself cannot do (create the sandbox, reset paths,
apply the *official* patch, run the parser) raises ``GraderError``: an infrastructure failure that
the rollout excludes from training, never a silent reward of 0. ``GradeResult.output`` keeps every
step's complete output.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from lego_rl.errors import GraderError, SandboxError, TaskDataError
from lego_rl.sandbox.base import ExecResult, Sandbox
from lego_rl.swe.shell import GIT, format_step, q
from lego_rl.swe.verdict import judge_tests, parse_parser_output
from lego_rl.tasks.model import TaskMetadata
from lego_rl.tasks.patchpaths import patch_paths

SandboxOpener = Callable[[], AbstractAsyncContextManager[Sandbox]]
ApplyMethod = Literal["empty", "git-apply-3way", "git-apply", "patch"]
GRADER_DIR = "/tmp/lego-grader"
F2P_PATH = f"{GRADER_DIR}/test_f2p.py"
F2P_DEFAULT_CMD = f'"$(command -v python || command -v python3)" -m pytest -q -p no:cacheprovider {F2P_PATH}'
_SETUP_TIMEOUT = 900


@dataclass
class GradeResult:
    reward: float
    solved: bool
    reason: str
    """One line: why the reward is what it is (``tests passed``, ``agent patch does not apply``...)."""
    output: str = ""
    apply_method: ApplyMethod | None = None
    eval_exit_code: int | None = None
    timed_out: bool = False
    tests: dict[str, str] = field(default_factory=dict)


class _Log:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def add(self, title: str, cmd: str, res: ExecResult) -> ExecResult:
        self.parts.append(format_step(title, cmd, res))
        return res

    @property
    def text(self) -> str:
        return "".join(self.parts)


async def _sh(sb: Sandbox, log: _Log, title: str, script: str, *, cwd: str, user: str = "root",
              timeout: float | None = _SETUP_TIMEOUT) -> ExecResult:
    return log.add(title, script, await sb.exec(["bash", "-c", script], user=user, cwd=cwd, timeout=timeout))


async def _must(sb: Sandbox, log: _Log, title: str, script: str, *, cwd: str) -> ExecResult:
    res = await _sh(sb, log, title, script, cwd=cwd)
    if not res.ok:
        raise GraderError(f"grader step '{title}' failed ({'timeout' if res.timed_out else res.exit_code}): "
                          f"{(res.stderr or res.stdout).strip()[-400:]}")
    return res


_SAVE = f"mkdir -p {GRADER_DIR}/pre && cd {{wd}} && for p in {{paths}}; do [ -e \"$p\" ] || [ -L \"$p\" ] && " \
        f"cp -a --parents \"$p\" {GRADER_DIR}/pre/ || true; done"
_RESTORE = f"cd {{wd}} && rm -rf -- {{paths}} && cp -a {GRADER_DIR}/pre/. ."


async def _apply_agent_patch(sb: Sandbox, log: _Log, patch: bytes, workdir: str) -> ApplyMethod | None:
    """Try the three methods in order; the touched paths are restored after a failed attempt."""
    pfile = f"{GRADER_DIR}/agent.patch"
    await sb.write_file(pfile, patch)
    try:
        paths = " ".join(q(p) for p in patch_paths(patch.decode("utf-8", errors="surrogateescape")))
    except TaskDataError:  # an agent patch with absolute or '..' paths: let the appliers refuse it
        paths = ""
    if paths:
        await _must(sb, log, "save paths the agent patch touches", _SAVE.format(wd=q(workdir), paths=paths), cwd="/")
    attempts: list[tuple[ApplyMethod, str]] = [
        ("git-apply-3way", f"{GIT} apply --3way --whitespace=nowarn {pfile}"),
        ("git-apply", f"{GIT} apply --whitespace=nowarn {pfile}"),
        ("patch", (f"patch -p1 --batch --forward --dry-run -i {pfile} && "
                   f"patch -p1 --batch --forward --no-backup-if-mismatch -i {pfile}")),
    ]
    for method, cmd in attempts:
        res = await _sh(sb, log, f"agent patch ({method})", cmd, cwd=workdir)
        if res.ok:
            return method
        if paths:
            await _must(sb, log, "restore after failed attempt", _RESTORE.format(wd=q(workdir), paths=paths), cwd="/")
    return None


async def _official_tests(sb: Sandbox, log: _Log, meta: TaskMetadata) -> None:
    wd = meta.workdir
    if meta.swepro is not None and meta.swepro.before_repo_set_cmd.strip():
        last = meta.swepro.before_repo_set_cmd.strip().splitlines()[-1]
        await _must(sb, log, "official test files (before_repo_set_cmd, last line)", last, cwd=wd)
        return
    paths = meta.test_paths
    if not paths:
        return
    reset = " ; ".join(
        f"if {GIT} cat-file -e HEAD:{q(p)} 2>/dev/null; then {GIT} checkout -q HEAD -- {q(p)}; else rm -rf -- {q(p)}; fi"
        for p in paths
    )
    await _must(sb, log, "reset official test paths to HEAD", f"set -e; {reset}", cwd=wd)
    await sb.write_file(f"{GRADER_DIR}/test.patch", meta.test_patch)
    await _must(sb, log, "apply official test patch", f"{GIT} apply --whitespace=nowarn {GRADER_DIR}/test.patch || "
                f"patch -p1 --batch --forward --fuzz=0 -i {GRADER_DIR}/test.patch", cwd=wd)


async def _verdict(sb: Sandbox, log: _Log, meta: TaskMetadata, timeout: float) -> GradeResult:
    wd, user = meta.workdir, meta.eval_user
    if meta.swepro is not None:
        sp = meta.swepro
        for name in ("run_script", "parser"):
            host = Path(getattr(sp, name))
            if not host.is_file():
                raise GraderError(f"SWE-bench Pro {name} {host} does not exist on this host")
        await sb.write_file(f"{GRADER_DIR}/run_script.sh", Path(sp.run_script))
        await sb.write_file(f"{GRADER_DIR}/parser.py", Path(sp.parser))
        await _must(sb, log, "grader files readable", f"chmod -R a+rwX {GRADER_DIR}", cwd="/")
        files = q(",".join(sp.selected_test_files))
        run = f"bash {GRADER_DIR}/run_script.sh {files} > {GRADER_DIR}/stdout.log 2> {GRADER_DIR}/stderr.log"
        res = await _sh(sb, log, "run_script", run, cwd=wd, user=user, timeout=timeout)
        if res.timed_out:
            return GradeResult(0.0, False, f"tests timed out after {timeout:.0f} s", timed_out=True)
        py = "$(command -v python3 || command -v python)"
        await _must(sb, log, "parser", f"cat {GRADER_DIR}/stdout.log; {py} {GRADER_DIR}/parser.py "
                    f"{GRADER_DIR}/stdout.log {GRADER_DIR}/stderr.log {GRADER_DIR}/output.json", cwd=wd)
        statuses = parse_parser_output(await sb.read_file(f"{GRADER_DIR}/output.json"))
        v = judge_tests(statuses, sp.fail_to_pass, sp.pass_to_pass)
        reason = "all fail-to-pass and pass-to-pass tests passed" if v.solved else "not passed: " + "; ".join(v.failing[:5])
        return GradeResult(float(v.solved), v.solved, reason, eval_exit_code=res.exit_code, tests=statuses)
    cmd = meta.eval_cmd
    if meta.f2p_script is not None:
        await sb.write_file(F2P_PATH, meta.f2p_script)
        await _must(sb, log, "grader files readable", f"chmod -R a+rwX {GRADER_DIR}", cwd="/")
        cmd = cmd or F2P_DEFAULT_CMD
    assert cmd is not None  # TaskMetadata guarantees a grading command
    res = await _sh(sb, log, f"eval as {user}", cmd, cwd=wd, user=user, timeout=timeout)
    if res.timed_out:
        return GradeResult(0.0, False, f"tests timed out after {timeout:.0f} s", eval_exit_code=None, timed_out=True)
    ok = res.exit_code == 0
    return GradeResult(float(ok), ok, "tests passed" if ok else f"tests failed (exit {res.exit_code})",
                       eval_exit_code=res.exit_code)


async def grade(meta: TaskMetadata, patch: bytes | str, *, open_sandbox: SandboxOpener,
                timeout: float = 180.0) -> GradeResult:
    """Grade ``patch`` for the task ``meta`` in a fresh sandbox from ``open_sandbox()``.

    ``open_sandbox`` returns an async context manager of a new sandbox of the task's image, e.g.
    ``lambda: create_sandbox(meta.image, provider="bwrap", images=images)``.
    """
    data = patch.encode() if isinstance(patch, str) else patch
    log = _Log()
    try:
        async with contextlib.AsyncExitStack() as stack:
            sb = await stack.enter_async_context(open_sandbox())
            await _must(sb, log, "grader dir", f"mkdir -p {GRADER_DIR}", cwd="/")
            for n, cmd in enumerate(meta.pre_commands, start=1):
                await _must(sb, log, f"pre-command {n}", cmd, cwd=meta.workdir)
            method: ApplyMethod | None = "empty"
            if data.strip():
                method = await _apply_agent_patch(sb, log, data, meta.workdir)
                if method is None:
                    return GradeResult(0.0, False, "agent patch does not apply (3-way, plain, patch)", log.text)
            await _official_tests(sb, log, meta)
            result = await _verdict(sb, log, meta, timeout)
            result.apply_method, result.output = method, log.text
            return result
    except Exception as exc:
        # A provider may leak its SDK's own exception type; it is still not the agent's doing.
        if isinstance(exc, SandboxError):
            what = "grader sandbox failed"
        elif isinstance(exc, GraderError):
            what = "grader failed"
        else:
            what = f"grader crashed ({type(exc).__name__})"
        raise GraderError(f"{what} for {meta.instance_id}: {exc}", output=log.text) from exc
