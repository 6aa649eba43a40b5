"""Patch capture in a real sandbox: every kind of change, HEAD and index untouched, applies fresh."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from swe_data import WORKDIR

from lego_rl.sandbox.base import Sandbox
from lego_rl.swe import capture_patch, prepare_workspace, take_snapshot
from lego_rl.swe.grader import GRADER_DIR

# What an agent does, as the agent user: every kind of change, some committed, some staged, some not.
AGENT_EDITS = r"""
set -e
git config user.name a; git config user.email a@a
sed -i 's/a - b/a + b/' calc.py && git add calc.py && git commit -qm "fix add"    # committed
echo "extra = 1" >> tests/test_existing.py && git add tests/test_existing.py        # staged
echo "more notes" >> README.md                                                    # unstaged, on an image-modified file
printf 'new\n' > new_module.py                                                    # untracked new
mkdir -p pkg && printf 'x = 1\n' > pkg/__init__.py && git add pkg                 # staged new in a new dir
rm local_settings.py                                                       # delete an image-shipped untracked file
git mv tests/test_existing.py tests/test_renamed.py                               # rename (with the staged edit)
head -c 3000 /dev/urandom > blob.bin; printf '\x00\x01\x02' >> blob.bin           # binary
chmod +x calc.py                                                                  # mode change
ln -s calc.py link_to_calc                                                        # symlink
"""


async def _sh(sb: Sandbox, cmd: str, user: str = "agent") -> str:
    res = await sb.exec(["bash", "-c", cmd], user=user, cwd=WORKDIR, timeout=60)
    assert res.exit_code == 0, res
    return res.stdout


async def test_capture_covers_every_change_and_applies_in_a_fresh_sandbox(
    agent_sb: Sandbox, opener: Callable[[], AbstractAsyncContextManager[Sandbox]]
) -> None:
    await prepare_workspace(agent_sb, workdir=WORKDIR, problem_statement="p")
    snap = await take_snapshot(agent_sb, WORKDIR)
    await _sh(agent_sb, AGENT_EDITS)
    head_idx = await _sh(agent_sb, "git rev-parse HEAD; sha256sum .git/index; git status --porcelain")
    patch = await capture_patch(agent_sb, snap)
    # capture never touches the repository's own HEAD or index
    assert await _sh(agent_sb, "git rev-parse HEAD; sha256sum .git/index; git status --porcelain") == head_idx
    text = patch.decode("utf-8", errors="replace")
    for needle in ("a/calc.py", "old mode 100644", "new mode 100755", "new file mode 100644", "b/new_module.py",
                   "b/pkg/__init__.py", "deleted file mode 100644", "a/local_settings.py", "GIT binary patch",
                   "rename from tests/test_existing.py", "rename to tests/test_renamed.py", "new file mode 120000",
                   "+more notes"):
        assert needle in text, needle
    # the image's own edit to README.md is baseline, not an agent edit
    assert "-calc\n" not in text and "+calc (image build notes)" not in text
    after = await take_snapshot(agent_sb, WORKDIR, git_dir="/var/lib/lego-rl/after.git")

    async with opener() as fresh:  # a new sandbox of the same image, like the grader's
        await fresh.write_file(f"{GRADER_DIR}/p.patch", patch)
        await _sh(fresh, f"git -c safe.directory='*' apply --check {GRADER_DIR}/p.patch", user="root")
        await _sh(fresh, f"git -c safe.directory='*' apply {GRADER_DIR}/p.patch", user="root")
        replay = await take_snapshot(fresh, WORKDIR)
    assert replay.tree == after.tree  # byte-for-byte and mode-for-mode the agent's workspace


async def test_no_change_gives_an_empty_patch(agent_sb: Sandbox) -> None:
    await prepare_workspace(agent_sb, workdir=WORKDIR, problem_statement="p")
    snap = await take_snapshot(agent_sb, WORKDIR)
    await _sh(agent_sb, "git status >/dev/null; touch calc.py")  # stat change only
    assert await capture_patch(agent_sb, snap) == b""


async def test_agent_cannot_hide_edits_by_committing_or_resetting(agent_sb: Sandbox) -> None:
    await prepare_workspace(agent_sb, workdir=WORKDIR, problem_statement="p")
    snap = await take_snapshot(agent_sb, WORKDIR)
    await _sh(agent_sb, "sed -i 's/a - b/a + b/' calc.py && git -c user.name=a -c user.email=a@a commit -qam x "
                        "&& git checkout -q --detach && git branch -q -D main && git gc -q --prune=now")
    patch = (await capture_patch(agent_sb, snap)).decode()
    assert "+    return a + b" in patch
    # even deleting the repository's git directory cannot break the capture (objects were copied)
    await _sh(agent_sb, "rm -rf .git")
    assert (await capture_patch(agent_sb, snap)).decode() == patch
    # the snapshot is root's: the agent can neither read nor rewrite it
    res = await agent_sb.exec(["ls", snap.git_dir], user="agent", timeout=30)
    assert res.exit_code != 0
