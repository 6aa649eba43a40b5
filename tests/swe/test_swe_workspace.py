"""Workspace preparation in a real sandbox: history beyond HEAD gone, agent owns the repo."""

from __future__ import annotations

from swe_data import WORKDIR

from lego_rl.sandbox.base import Sandbox
from lego_rl.swe import prepare_workspace
from lego_rl.swe.workspace import DEFAULT_PROBLEM_PATH


async def _sh(sb: Sandbox, cmd: str, user: str = "agent") -> str:
    res = await sb.exec(["bash", "-c", cmd], user=user, cwd=WORKDIR, timeout=60)
    assert res.exit_code == 0, res
    return res.stdout


async def test_prepare_hides_future_commits_and_hands_repo_to_agent(agent_sb: Sandbox, task_image: tuple) -> None:
    future = task_image[1]
    before_head = await _sh(agent_sb, "git rev-parse HEAD", user="root")
    assert (await agent_sb.exec(["git", "cat-file", "-e", future], cwd=WORKDIR)).exit_code == 0  # there at first
    await prepare_workspace(agent_sb, workdir=WORKDIR, problem_statement="Fix add()",
                            pre_commands=["echo GENERATED = 1 > generated.py"])
    assert await _sh(agent_sb, "git rev-parse HEAD") == before_head
    missing = await agent_sb.exec(["git", "cat-file", "-e", future], user="agent", cwd=WORKDIR)
    assert missing.exit_code != 0  # the answer's object is deleted, not merely unreferenced
    assert (await _sh(agent_sb, "git log --all --format=%H")).split() == [before_head.strip()]
    assert await _sh(agent_sb, "git tag; git remote; git stash list; git reflog --all") == ""
    assert "THE ANSWER" not in await _sh(agent_sb, "git grep -h ANSWER $(git rev-list --all) -- . || true")
    # agent owns everything and can work with git normally; the image's extra files survive
    assert await _sh(agent_sb, "find . ! -user agent | head -1") == ""
    assert await _sh(agent_sb, "cat generated.py local_settings.py") == "GENERATED = 1\nDEBUG = True\n"
    await _sh(agent_sb, "git -c user.name=a -c user.email=a@a commit -qam wip && git status --short")
    assert (await agent_sb.read_file(DEFAULT_PROBLEM_PATH, user="agent")) == b"Fix add()"


async def test_missing_workdir_is_a_setup_error(agent_sb: Sandbox) -> None:
    import pytest

    from lego_rl.errors import SandboxError

    with pytest.raises(SandboxError, match="workdir /nope does not exist"):
        await prepare_workspace(agent_sb, workdir="/nope", problem_statement="x")
    with pytest.raises(SandboxError, match="pre-command 1 .*failed"):
        await prepare_workspace(agent_sb, workdir=WORKDIR, problem_statement="x", pre_commands=["false"])
