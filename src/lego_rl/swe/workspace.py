"""Prepare a task's repository for the agent.

In order, as root inside the agent sandbox: run the row's pre-commands (the grader runs them too, so
both start from the same base); make every commit and ref beyond HEAD unreachable and prune it, so
the agent cannot read the answer out of git history; give the repository to the agent user; write the
problem statement outside the repository (so it never shows up in the captured patch).
"""

from __future__ import annotations

from collections.abc import Sequence

from lego_rl.errors import SandboxError
from lego_rl.sandbox.base import Sandbox
from lego_rl.swe.shell import GIT, q, run_step

DEFAULT_PROBLEM_PATH = "/tmp/PROBLEM_STATEMENT.md"

# Keeps only HEAD (and the branch it is on). Remotes go with their config so nothing can be fetched
# back; reflogs, stashes, tags and replace refs would each still reach future commits; gc --prune=now
# then deletes the unreachable objects themselves (an unreferenced object is still readable by id).
_STRIP_HISTORY = f"""
g() {{ {GIT} "$@"; }}
g rev-parse --verify -q HEAD >/dev/null || {{ echo "no commit at HEAD" >&2; exit 3; }}
keep="$(g symbolic-ref -q HEAD || true)"
for r in $(g remote); do g remote remove "$r"; done
g for-each-ref --format='%(refname)' | while read -r ref; do
  [ "$ref" = "$keep" ] || g update-ref -d "$ref"
done
g reflog expire --expire=now --all
gd="$(g rev-parse --git-dir)"
for f in FETCH_HEAD ORIG_HEAD MERGE_HEAD CHERRY_PICK_HEAD REVERT_HEAD; do rm -f "$gd/$f"; done
g gc --prune=now --quiet
"""


async def strip_future_history(sb: Sandbox, workdir: str, *, timeout: float = 900) -> None:
    """Leave only HEAD's history reachable, and delete everything else from the object store."""
    await run_step(sb, f"removing history beyond HEAD in {workdir}", _STRIP_HISTORY, cwd=workdir, timeout=timeout)


async def ensure_user(sb: Sandbox, user: str) -> None:
    """Create ``user`` when the image lacks it (providers may have created it already)."""
    await run_step(
        sb,
        f"creating user {user}",
        f"id -u {q(user)} >/dev/null 2>&1 || useradd -m -s /bin/bash {q(user)}",
        timeout=60,
    )


async def prepare_workspace(
    sb: Sandbox,
    *,
    workdir: str,
    problem_statement: str,
    pre_commands: Sequence[str] = (),
    agent_user: str = "agent",
    problem_path: str = DEFAULT_PROBLEM_PATH,
    strip_history: bool = True,
    timeout: float = 900,
) -> None:
    """Prepare ``workdir`` in ``sb`` for ``agent_user``; failures raise ``SandboxError`` (setup failure)."""
    check = await sb.exec(["test", "-d", workdir], timeout=30)
    if check.exit_code != 0:
        raise SandboxError(f"the task's workdir {workdir} does not exist in the image")
    for n, cmd in enumerate(pre_commands, start=1):
        await run_step(sb, f"pre-command {n} ({cmd[:80]!r})", cmd, cwd=workdir, timeout=timeout)
    if strip_history:
        is_git = await sb.exec(["bash", "-c", f"{GIT} rev-parse --git-dir"], cwd=workdir, timeout=60)
        if is_git.exit_code == 0:
            await strip_future_history(sb, workdir, timeout=timeout)
    await ensure_user(sb, agent_user)
    await run_step(sb, f"giving {workdir} to {agent_user}", f"chown -R {q(agent_user)}: {q(workdir)}", timeout=timeout)
    await sb.write_file(problem_path, problem_statement, user=agent_user)
