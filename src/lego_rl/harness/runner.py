"""The built-in default ``lego_harness_run``: write config files, run the command, record the outcome.

Registered by ``get_plugin_manager()`` with ``trylast``, so a plugin that implements its own run
hook wins, and every other harness only has to build its ``CommandSpec``.
"""

from __future__ import annotations

import posixpath
import shlex
import time
from collections.abc import Awaitable
from pathlib import Path

import pluggy
from pydantic import BaseModel

from lego_rl.errors import HarnessError, SandboxLost
from lego_rl.harness.hookspecs import hookimpl
from lego_rl.harness.models import CommandSpec, HarnessOutcome, RunRequest
from lego_rl.runstore.files import write_next_free
from lego_rl.runstore.layout import RolloutFiles
from lego_rl.sandbox.base import Sandbox

# Exit statuses meaning the CLI never ran or died from a signal. These are facts ("crashed"), not a verdict:
# whether a crash is the policy's (a tool call that killed the CLI) is decided by the rollout, which knows
# whether the policy had answered yet (lego_rl.termination).
_NOT_RUN = {126: "not executable", 127: "command not found"}
_GRACE_S = 15.0


async def write_spec_files(sb: Sandbox, spec: CommandSpec) -> None:
    """Create each config file's folder and the file itself as the run's user."""
    for path, text in spec.files.items():
        if not posixpath.isabs(path):
            raise HarnessError(f"harness config file path must be absolute, got {path!r}")
        mk = await sb.exec(["mkdir", "-p", posixpath.dirname(path)], user=spec.user, timeout=30)
        if mk.exit_code != 0:
            raise HarnessError(f"cannot create {posixpath.dirname(path)} as {spec.user}: {mk.stderr.strip()}")
        await sb.write_file(path, text, user=spec.user)


def classify_exit(
    harness: str, exit_code: int, timed_out: bool, stdout: str, stderr: str, duration: float
) -> HarnessOutcome:
    """Protocol-neutral outcome: timeouts, missing binaries and signals; the plugin refines the rest."""
    crashed, detail = False, ""
    if timed_out:
        detail = f"killed at the time budget after {duration:.0f} s"
    elif exit_code in _NOT_RUN:
        crashed, detail = True, f"exit {exit_code}: {_NOT_RUN[exit_code]}"
    elif exit_code < 0 or exit_code >= 128:
        sig = -exit_code if exit_code < 0 else exit_code - 128
        crashed, detail = True, f"killed by signal {sig}"
    return HarnessOutcome(
        harness=harness, exit_code=None if timed_out else exit_code, duration_s=duration, event_log=stdout,
        stderr_tail=stderr[-4000:], timed_out=timed_out, crashed=crashed, detail=detail,
    )  # fmt: skip


def launch_argv(spec: CommandSpec) -> list[str]:
    """Wrap ``spec.argv``: extend the image's PATH, create $HOME, and give the CLI no terminal on stdin
    (an interactive CLI waiting for input would otherwise sit until the time budget)."""
    prefix = "".join(f"{shlex.quote(p)}:" for p in spec.path_prepend)
    prelude = f"{{ {spec.prelude}\n}} || exit 126; " if spec.prelude.strip() else ""
    script = f'PATH={prefix}"$PATH"; export PATH; mkdir -p "$HOME" 2>/dev/null; {prelude}exec "$@" </dev/null'
    return ["sh", "-c", script, "sh", *spec.argv]


class DefaultRunner:
    """Built-in plugin: the generic run and classify hooks for every harness."""

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self._pm = pm

    @hookimpl(trylast=True)
    def lego_harness_run(
        self, harness: str, sandbox: Sandbox, request: RunRequest, options: BaseModel
    ) -> Awaitable[HarnessOutcome]:
        return self._run(harness, sandbox, request, options)

    @hookimpl(trylast=True)
    def lego_harness_classify(
        self, harness: str, outcome: HarnessOutcome, request: RunRequest
    ) -> HarnessOutcome:
        return outcome

    async def _run(
        self, harness: str, sb: Sandbox, request: RunRequest, options: BaseModel
    ) -> HarnessOutcome:
        spec = self._pm.hook.lego_harness_command(harness=harness, request=request, options=options)
        if spec is None:
            raise HarnessError(f"no plugin builds a command for harness {harness!r}")
        await write_spec_files(sb, spec)
        argv = launch_argv(spec)
        start = time.monotonic()
        try:
            res = await sb.exec(
                argv, user=spec.user, env=spec.env, cwd=spec.cwd, timeout=request.time_budget_s
            )
        except SandboxLost as exc:
            # The sandbox died under the CLI: what the CLI wrote until then is the evidence of what it
            # was doing; keep it before the error ends the rollout.
            if request.artifacts_dir is not None:
                _save_run_files(Path(request.artifacts_dir), harness, spec, exc.stdout)
            raise
        duration = time.monotonic() - start
        outcome = classify_exit(harness, res.exit_code, res.timed_out, res.stdout, res.stderr, duration)
        if (
            not outcome.crashed
            and not outcome.timed_out
            and outcome.exit_code != 0
            and not res.stdout.strip()
        ):
            outcome = outcome.model_copy(
                update={
                    "crashed": True,
                    "detail": f"exit {res.exit_code} before any event: {res.stderr.strip()[-300:]}",
                }
            )
        refined = self._pm.hook.lego_harness_classify(harness=harness, outcome=outcome, request=request)
        if getattr(res, "truncated", False):  # the provider capped the output: say so, do not hide it
            refined = refined.model_copy(
                update={"detail": f"{refined.detail} [event log truncated by the sandbox]"}
            )
        if request.artifacts_dir is not None:
            path = _save_run_files(Path(request.artifacts_dir), harness, spec, refined.event_log)
            refined = refined.model_copy(update={"event_log_path": path})
        return refined


def _save_run_files(folder: Path, harness: str, spec: CommandSpec, event_log: str) -> Path:
    """The CLI's event log and its command line, under names never overwritten; the log's path."""
    path = write_next_free(folder, RolloutFiles.harness_events(harness), event_log)
    write_next_free(folder, RolloutFiles.harness_command(harness), shlex.join(spec.argv) + "\n")
    return path
