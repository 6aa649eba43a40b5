"""Offline install helpers in a real bwrap sandbox: shared read-only trees, the copy path, idempotence."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import MakeSandbox
from harness_helpers import make_tgz

from lego_rl.errors import HarnessError
from lego_rl.harness import install
from lego_rl.harness.install import (
    MARKER,
    TREE_DIGEST,
    install_archive,
    integrity_hex,
    link_executable,
    python_version,
    version_of,
)
from lego_rl.harness.toolchain import sha512_integrity
from lego_rl.rollout.recording import RecordingSandbox

TOOL = '#!/bin/sh\necho "tool 1.2.3 as $(id -un)"\n'


@pytest.fixture(autouse=True)
def trees(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This module's own shared-tree folder (world-traversable, unlike tmp_path), not the host's."""
    folder = Path(tempfile.mkdtemp(prefix="lego-trees-test-", dir="/var/tmp"))
    os.chmod(folder, 0o755)
    monkeypatch.setenv("LEGO_TOOLCHAIN_TREES", str(folder))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def tool_tgz(tmp_path: Path, body: str = TOOL, name: str = "tool.tgz") -> Path:
    return make_tgz(tmp_path / name, {"bin/tool": body, "README": "x"}, modes={"bin/tool": 0o755})


@pytest.mark.parametrize("share", [True, False], ids=["shared", "copy"])
async def test_install_extracts_for_the_agent_and_is_idempotent(
    make_sandbox: MakeSandbox, tmp_path: Path, share: bool
) -> None:
    sb = await make_sandbox()
    archive = tool_tgz(tmp_path)
    integrity = sha512_integrity(archive)
    assert await install_archive(sb, archive, "/opt/lego/tool/1", integrity=integrity, share=share) is True
    assert (
        await version_of(sb, ["/opt/lego/tool/1/bin/tool"], user="agent", expect="1.2.3")
        == "tool 1.2.3 as agent"
    )
    marker = await sb.read_file(f"/opt/lego/tool/1/{MARKER}")
    assert marker.decode().strip() == integrity_hex(sha512_integrity(archive))
    # Same archive again: nothing to do. A different archive replaces the tree (no stale files).
    assert await install_archive(sb, archive, "/opt/lego/tool/1", integrity=integrity, share=share) is False
    other = make_tgz(
        tmp_path / "other.tgz", {"bin/tool": TOOL.replace("1.2.3", "2.0.0")}, modes={"bin/tool": 0o755}
    )
    integrity = sha512_integrity(other)
    assert await install_archive(sb, other, "/opt/lego/tool/1", integrity=integrity, share=share) is True
    assert (await sb.exec(["test", "-e", "/opt/lego/tool/1/README"])).exit_code == 1
    with pytest.raises(HarnessError, match="reported 'tool 2.0.0 as agent', expected version 1.2.3"):
        await version_of(sb, ["/opt/lego/tool/1/bin/tool"], user="agent", expect="1.2.3")
    await link_executable(sb, "/opt/lego/tool/1/bin/tool", "/usr/local/bin/tool")
    assert (await sb.exec(["tool"], user="agent")).stdout.startswith("tool 2.0.0")


async def test_archive_whose_hash_differs_is_not_uploaded(make_sandbox: MakeSandbox, tmp_path: Path) -> None:
    sb = await make_sandbox()
    archive = tool_tgz(tmp_path)
    wrong = sha512_integrity(tool_tgz(tmp_path, body="#!/bin/sh\necho evil\n", name="evil.tgz"))
    with pytest.raises(HarnessError, match="refusing .*tool.tgz: its sha512 .* does not match"):
        await install_archive(sb, archive, "/opt/lego/tool/1", integrity=wrong)
    res = await sb.exec("ls /opt/lego/tool /tmp | grep -c -e lego-upload -e '^1' || true")
    assert res.stdout.strip() == "0"  # neither the tree nor an upload is left behind


async def test_one_host_tree_is_mounted_read_only_into_every_sandbox(
    make_sandbox: MakeSandbox, tmp_path: Path, trees: Path
) -> None:
    archive = tool_tgz(tmp_path)
    integrity = sha512_integrity(archive)
    first, second = await make_sandbox(), await make_sandbox()
    for sb in (first, second):
        assert await install_archive(sb, archive, "/opt/lego/tool", integrity=integrity) is True
        assert await install_archive(sb, archive, "/opt/lego/tool", integrity=integrity) is False
        assert (await sb.exec(["/opt/lego/tool/bin/tool"], user="agent")).stdout == "tool 1.2.3 as agent\n"
        for user in ("agent", "root"):
            assert not (await sb.exec("echo evil > /opt/lego/tool/bin/tool", user=user)).ok
    [tree] = [p for p in trees.iterdir()]  # extracted once for both sandboxes, no temporary left over
    assert tree.name == f"{integrity_hex(integrity)[:40]}-s1"
    assert first.mounts() == second.mounts() == {"/opt/lego/tool": str(tree)}
    assert (tree / MARKER).read_text().strip() == integrity_hex(integrity)
    assert oct((tree / "bin").stat().st_mode & 0o777) == "0o755"  # nobody but root may write the tree


async def test_a_changed_host_tree_is_refused(make_sandbox: MakeSandbox, tmp_path: Path, trees: Path) -> None:
    archive = tool_tgz(tmp_path)
    integrity = sha512_integrity(archive)
    await install_archive(await make_sandbox(), archive, "/opt/lego/tool", integrity=integrity)
    [tree] = list(trees.iterdir())
    (tree / "bin" / "tool").write_text("#!/bin/sh\necho evil\n")
    install._verified_trees.clear()  # the digest is checked once per process: start a "new process"
    sb = await make_sandbox()
    with pytest.raises(HarnessError, match=f"shared toolchain tree {tree} was changed after extraction"):
        await install_archive(sb, archive, "/opt/lego/tool", integrity=integrity)
    assert sb.mounts() == {}
    (tree / TREE_DIGEST).unlink()
    with pytest.raises(HarnessError, match=f"has no {TREE_DIGEST}: delete the folder"):
        await install_archive(sb, archive, "/opt/lego/tool", integrity=integrity)


async def test_plain_tar_cache_is_made_once_per_archive(
    make_sandbox: MakeSandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trees: Path
) -> None:
    """The copy path (providers without read-only mounts) uploads a cached plain tar."""
    monkeypatch.setenv("LEGO_TOOLCHAIN_CACHE", str(tmp_path / "cache"))
    archive = tool_tgz(tmp_path)
    for _ in range(2):
        sb = await make_sandbox()
        await install_archive(sb, archive, "/opt/lego/tool", integrity=sha512_integrity(archive), share=False)
        assert sb.mounts() == {} and list(trees.iterdir()) == []
        assert (await sb.exec(["/opt/lego/tool/bin/tool"], user="agent")).stdout.startswith("tool 1.2.3")
    [cached] = list((tmp_path / "cache").iterdir())
    assert cached.name == integrity_hex(sha512_integrity(archive))[:40] + ".tar"


async def test_bad_inputs_are_refused_precisely(make_sandbox: MakeSandbox, tmp_path: Path) -> None:
    sb = await make_sandbox()
    archive = tool_tgz(tmp_path)
    with pytest.raises(HarnessError, match="absolute path without '..'"):
        await install_archive(sb, archive, "/opt/../etc", integrity=sha512_integrity(archive))
    zipped = tmp_path / "tool.zip"
    zipped.write_bytes(b"PK")
    with pytest.raises(HarnessError, match=r"expected a \.tgz"):
        await install_archive(sb, zipped, "/opt/lego/z", integrity=sha512_integrity(zipped))
    with pytest.raises(HarnessError, match="not an executable file"):
        await link_executable(sb, "/opt/lego/none", "/usr/local/bin/none")
    with pytest.raises(HarnessError, match="no usable 'python3.12'"):
        await python_version(sb, "python3.12")
    assert await python_version(sb, "python3") >= (3, 11)


async def test_the_rollouts_recording_wrapper_keeps_the_shared_path(
    make_sandbox: MakeSandbox, tmp_path: Path, trees: Path
) -> None:
    """Rollouts wrap their sandbox (RecordingSandbox): the wrapper must pass mounts through, not fall back to
    copying 186 MB (a rollout's harness_install was 3.6-5.8 s instead of ~0.1 s before it did)."""
    sb = RecordingSandbox(await make_sandbox(), "agent")
    archive = tool_tgz(tmp_path)
    assert sb.readonly_mounts
    await install_archive(sb, archive, "/opt/lego/tool", integrity=sha512_integrity(archive))
    [tree] = list(trees.iterdir())
    assert sb.mounts() == {"/opt/lego/tool": str(tree)}
    assert [e["op"] for e in sb.log] == ["mount_readonly"]  # recorded with the sandbox's commands
    assert (await sb.exec(["/opt/lego/tool/bin/tool"], user="agent")).stdout == "tool 1.2.3 as agent\n"
