"""A repository whose files carry POSIX ACLs (real task images do: a uid of the image builder's host,
outside any sandbox's uid map) is prepared, snapshotted and captured like any other.

``cp -a`` of ``.git/objects`` into the snapshot used to copy the ACLs too; in a sunabako sandbox
(a user namespace) an ACL naming an unmapped uid cannot be set and setup failed with "preserving
permissions ... Invalid argument". The snapshot must not depend on ACLs or xattrs at all.
"""

from __future__ import annotations

import pytest
from swe_data import WORKDIR, provider_options

from lego_rl.sandbox.base import ImageSpec
from lego_rl.sandbox.factory import create_sandbox
from lego_rl.swe import prepare_workspace
from lego_rl.swe.patch import SNAPSHOT_DIR, capture_patch, take_snapshot

# Which files under a tree carry an access or default ACL (python3 is in every test image; getfacl is not).
_ACL_FILES = (
    "import os, sys\n"
    "hits = []\n"
    "for root, dirs, files in os.walk(sys.argv[1]):\n"
    "    for name in dirs + files:\n"
    "        p = os.path.join(root, name)\n"
    "        for attr in ('system.posix_acl_access', 'system.posix_acl_default'):\n"
    "            try:\n"
    "                os.getxattr(p, attr, follow_symlinks=False)\n"
    "                hits.append(p)\n"
    "            except OSError:\n"
    "                pass\n"
    "print(len(hits), *hits[:3])\n"
)


@pytest.mark.parametrize("provider", ["bwrap", pytest.param("sunabako", marks=[pytest.mark.slow, pytest.mark.root])])
async def test_workspace_and_snapshot_ignore_acls(provider: str, acl_image: ImageSpec) -> None:
    async with create_sandbox(acl_image, provider=provider, provider_options=provider_options(provider)) as sb:
        await prepare_workspace(sb, workdir=WORKDIR, problem_statement="Fix add()")
        snap = await take_snapshot(sb, WORKDIR)
        res = await sb.exec(["python3", "-c", _ACL_FILES, SNAPSHOT_DIR], timeout=60)
        assert res.stdout.split()[0] == "0", f"the snapshot copied ACLs: {res.stdout}"
        await sb.exec(["bash", "-c", "sed -i 's/a - b/a + b/' calc.py && echo new > added.txt"],
                      user="agent", cwd=WORKDIR, check=True, timeout=60)
        patch = (await capture_patch(sb, snap)).decode()
    assert "-    return a - b" in patch and "+    return a + b" in patch and "+++ b/added.txt" in patch
