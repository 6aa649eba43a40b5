"""Small helpers for running scripts in a sandbox on behalf of the workspace and grader code."""

from __future__ import annotations

import shlex

from lego_rl.errors import SandboxError
from lego_rl.sandbox.base import ExecResult, Sandbox

q = shlex.quote
GIT = "git -c safe.directory='*' -c core.quotePath=true -c advice.detachedHead=false"
"""git as root over a tree the agent owns: without safe.directory git refuses ("dubious ownership")."""
_TAIL = 2000


def tail(text: str, limit: int = _TAIL) -> str:
    """The end of a long output, marked as cut, for one-line error messages."""
    text = text.strip()
    return text if len(text) <= limit else "…" + text[-limit:]


async def run_step(
    sb: Sandbox,
    what: str,
    script: str,
    *,
    user: str = "root",
    cwd: str | None = None,
    timeout: float | None = 600,
    env: dict[str, str] | None = None,
) -> ExecResult:
    """Run a ``bash -c`` script; a non-zero exit or timeout raises ``SandboxError`` naming ``what``."""
    res = await sb.exec(["bash", "-c", "set -euo pipefail\n" + script], user=user, cwd=cwd, timeout=timeout, env=env)
    if res.timed_out:
        raise SandboxError(f"{what} timed out after {timeout} s")
    if res.exit_code != 0:
        raise SandboxError(f"{what} failed (exit {res.exit_code}): {tail(res.stderr or res.stdout)}")
    return res


def format_step(title: str, cmd: str, res: ExecResult) -> str:
    """One section of a grader log: what ran, how it ended, and its complete output."""
    status = "TIMED OUT" if res.timed_out else f"exit {res.exit_code}"
    parts = [f"===== {title}: {status} ({res.duration_s:.2f} s)", f"$ {cmd}"]
    if res.stdout:
        parts.append(res.stdout.rstrip("\n"))
    if res.stderr:
        parts += ["--- stderr", res.stderr.rstrip("\n")]
    return "\n".join(parts) + "\n"
