"""Patch capture: the agent's edits = the workspace after the run minus the workspace before it.

The snapshot lives in a separate git directory owned by root (``SNAPSHOT_DIR``), with the task's
``workdir`` as its work tree. The repository's own ``.git`` (HEAD, index, refs) is never touched, so
the agent may stage, commit, stash or branch freely and the capture still sees only file contents.

* before the agent: ``git add -A`` into the snapshot's own index, ``write-tree``: files shipped in the
  image (tracked, modified or untracked) are part of the baseline, not agent edits;
* after the agent: ``git add -A`` again (only files whose stat changed are re-hashed, which is what
  keeps this fast on large trees), then ``diff --cached --binary --full-index -M`` against the
  baseline tree: staged, unstaged, new, deleted, renamed, binary and mode changes all come out as one
  git patch that applies to the baseline, which is what a fresh sandbox of the same image holds.

``.gitignore`` rules of the work tree apply, as they would to ``git diff``: ignored build output is
not part of the patch.
"""

from __future__ import annotations

from dataclasses import dataclass

from lego_rl.errors import SandboxError
from lego_rl.sandbox.base import Sandbox
from lego_rl.swe.shell import GIT, q, run_step

SNAPSHOT_DIR = "/var/lib/lego-rl/snapshot.git"
# Fixed settings so neither the image's nor the agent's git config changes what is captured.
_SNAP_GIT = (
    "git -c safe.directory='*' -c core.fileMode=true -c core.symlinks=true -c core.autocrlf=false "
    "-c core.excludesFile=/dev/null -c core.quotePath=true -c diff.noprefix=false -c diff.mnemonicPrefix=false "
    "-c diff.renames=true -c diff.external= -c core.safecrlf=false -c gc.auto=0"
)


@dataclass(frozen=True)
class Snapshot:
    """The baseline of one workspace: the tree id in the snapshot git dir."""

    workdir: str
    tree: str
    git_dir: str = SNAPSHOT_DIR


def _git(git_dir: str, workdir: str) -> str:
    return f"{_SNAP_GIT} --git-dir={q(git_dir)} --work-tree={q(workdir)}"


async def take_snapshot(
    sb: Sandbox, workdir: str, *, git_dir: str = SNAPSHOT_DIR, copy_objects_mb: int = 512, timeout: float = 900
) -> Snapshot:
    """Record the workspace as it is now (call after ``prepare_workspace``, before the agent runs).

    Seeding the snapshot with the repository's objects is what makes this fast: ``git add`` then
    only hashes files and writes nothing for blobs HEAD already has (10k files: ~0.3 s instead of
    several seconds of zlib). Up to ``copy_objects_mb`` the objects are copied, so an agent that
    deletes ``.git`` cannot break the capture; bigger stores are borrowed through ``alternates``
    (an agent that destroys such a repository's objects makes the capture fail, as a SandboxError).

    The copy is a plain ``cp -R``: contents only, no ownership, ACLs or xattrs (git needs none of them,
    and the snapshot dir is root's). ``cp -a`` would carry an image's ACLs, and in a user-namespaced
    sandbox (sunabako) an ACL naming a uid outside the uid map cannot be set: setup failed with
    "preserving permissions ... Invalid argument" on such images.
    """
    g = _git(git_dir, workdir)
    script = f"""
umask 077
rm -rf {q(git_dir)}
mkdir -p "$(dirname {q(git_dir)})"
git init -q --bare {q(git_dir)}
src="$({GIT} rev-parse --absolute-git-dir 2>/dev/null || true)"
if [ -n "$src" ] && [ -d "$src/objects" ]; then
  if [ "$(du -sk "$src/objects" | cut -f1)" -le {int(copy_objects_mb) * 1024} ]; then
    cp -R "$src/objects/." {q(git_dir)}/objects/
  else
    echo "$src/objects" >> {q(git_dir)}/objects/info/alternates
  fi
fi
{g} add -A .
{g} write-tree
"""
    res = await run_step(sb, f"snapshot of {workdir}", script, cwd=workdir, timeout=timeout)
    tree = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
    if len(tree) not in (40, 64):
        raise SandboxError(f"snapshot of {workdir} returned no tree id (got {res.stdout[-200:]!r})")
    return Snapshot(workdir=workdir, tree=tree, git_dir=git_dir)


async def capture_patch(sb: Sandbox, snap: Snapshot, *, timeout: float = 900) -> bytes:
    """The agent's edits since ``snap`` as a git patch (bytes: file contents need not be UTF-8).

    Empty bytes mean no change. Raises ``SandboxError`` when the snapshot cannot be read back.
    """
    g = _git(snap.git_dir, snap.workdir)
    out = f"{snap.git_dir}/lego-agent.patch"
    script = f"""
{g} add -A .
{g} diff --cached --binary --full-index -M --no-color --no-ext-diff --no-textconv \\
   --src-prefix=a/ --dst-prefix=b/ {snap.tree} -- > {q(out)}
"""
    await run_step(sb, f"patch capture in {snap.workdir}", script, cwd=snap.workdir, timeout=timeout)
    return await sb.read_file(out)
