"""Provider specifics beyond the shared contract: option validation, guest user, node checks."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_helpers import ROOTFS, check_available

from lego_rl.errors import SandboxError
from lego_rl.sandbox import ImageSpec, cut_message, get_provider
from lego_rl.sandbox.bwrap_state import list_state, prepare_upper
from lego_rl.sandbox.sunabako_provider import TRANSIENT_CREATE_ERRORS

IMAGE = ImageSpec(name="bookworm-test", rootfs=ROOTFS, workdir="/testbed")


def test_cut_message_keeps_head_and_tail() -> None:
    text = "HEAD" + "x" * 10_000 + "TAIL"
    cut = cut_message(text, 200)
    assert cut.startswith("HEAD") and cut.endswith("TAIL") and len(cut) < 260 and "chars cut" in cut
    assert cut_message("  short  ") == "short"


@pytest.mark.parametrize(
    "message",
    [
        "sandbox setup failed; see supervisor.log: key must be a string at line 1 column 2",
        "sandbox setup failed; see supervisor.log: expected `,` or `}` at line 1 column 17",
        '{"error":"creation worker failed: {\\"error\\":\\"sandbox startup failed: ; log: /x/supervisor.log\\"}"}',
    ],
)
def test_transient_create_errors_are_recognised(message: str) -> None:
    assert TRANSIENT_CREATE_ERRORS.search(message)


@pytest.mark.parametrize("message", ["invalid image path", "max_sandboxes reached (delete unused sandboxes)"])
def test_other_create_errors_are_not_retried(message: str) -> None:
    assert TRANSIENT_CREATE_ERRORS.search(message) is None


def _rootfs_with_passwd(tmp_path: Path, passwd: str) -> Path:
    root = tmp_path / "rootfs"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "passwd").write_text(passwd)
    (root / "etc" / "group").write_text("root:x:0:\nubuntu:x:1000:\n")
    (root / "tmp").mkdir(mode=0o1777)
    return root


def test_guest_user_avoids_taken_uid(tmp_path: Path) -> None:
    root = _rootfs_with_passwd(tmp_path, "root:x:0:0:root:/root:/bin/sh\nubuntu:x:1000:1000::/home/ubuntu:/bin/sh\n")
    upper = tmp_path / "upper"
    upper.mkdir()
    user = prepare_upper(str(root), upper, "/testbed")
    assert (user.name, user.uid, user.gid, user.home) == ("agent", 1001, 1001, "/home/agent")
    passwd = (upper / "etc" / "passwd").read_text().splitlines()
    assert passwd[-1] == "agent:x:1001:1001::/home/agent:/bin/sh" and passwd[1].startswith("ubuntu:")
    assert (upper / "etc" / "group").read_text().endswith("agent:x:1001:\n")
    assert (upper / "home" / "agent").stat().st_uid == 1001
    assert (upper / "testbed").is_dir()
    assert (root / "etc" / "passwd").read_text().count("agent") == 0  # the image is untouched


def test_existing_guest_user_is_reused(tmp_path: Path) -> None:
    root = _rootfs_with_passwd(tmp_path, "root:x:0:0::/root:/bin/sh\nagent:x:1500:1500::/work:/bin/sh\n")
    (root / "work").mkdir()
    upper = tmp_path / "upper"
    upper.mkdir()
    user = prepare_upper(str(root), upper, "/")
    assert (user.uid, user.gid, user.home) == (1500, 1500, "/work")
    assert not (upper / "etc").exists()


def test_image_symlink_cannot_point_at_host_passwd(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "passwd").symlink_to("/etc/passwd")  # absolute: on the host it means the host's file
    upper = tmp_path / "upper"
    upper.mkdir()
    user = prepare_upper(str(root), upper, "/")
    assert "root" not in (upper / "etc" / "passwd").read_text()  # the host's entries were not copied
    assert user.uid == 1000


@pytest.fixture
def bwrap_state() -> Iterator[Path]:
    check_available("bwrap")
    root = Path(tempfile.mkdtemp(prefix="lego-bwrap-test-", dir="/var/tmp"))
    root.chmod(0o755)
    yield root / "state"
    shutil.rmtree(root, ignore_errors=True)


async def test_bwrap_rejects_bad_options(bwrap_state: Path) -> None:
    provider = get_provider("bwrap", state_dir=bwrap_state)
    with pytest.raises(SandboxError, match="unknown option.*'cpus'"):
        await provider.create(IMAGE, cpus=2)
    with pytest.raises(SandboxError, match="network must be one of"):
        await provider.create(IMAGE, network="bridge")
    with pytest.raises(SandboxError, match="memory_mb must be an integer >= 16"):
        await provider.create(IMAGE, memory_mb=1)
    with pytest.raises(SandboxError, match="is not a directory"):
        await provider.create(ImageSpec(name="x", rootfs="/no/such/rootfs"))
    assert list_state(bwrap_state) == []


async def test_bwrap_unknown_user_and_reuse_of_id(bwrap_state: Path) -> None:
    provider = get_provider("bwrap", state_dir=bwrap_state)
    sb = await provider.create(IMAGE, sandbox_id="bw-fixed-id")
    try:
        with pytest.raises(SandboxError, match="user 'nobody2' does not exist"):
            await sb.exec("true", user="nobody2")
        with pytest.raises(SandboxError, match="already in use"):
            await provider.create(IMAGE, sandbox_id="bw-fixed-id")
        # A user added inside the sandbox is usable by name afterwards.
        await sb.exec("useradd -u 2345 worker", check=True)
        assert (await sb.exec("id -u", user="worker")).stdout.strip() == "2345"
    finally:
        await sb.close()
    assert list_state(bwrap_state) == []


def _mounts_under(root: Path) -> list[str]:
    return [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
            if line.split()[1].startswith(str(root))]


async def test_bwrap_disk_cap_fills_the_sandbox_not_the_host(bwrap_state: Path) -> None:
    """disk_mb: the writable layer is a loop-mounted ext4 of that size. A write past it fails inside the sandbox
    (ENOSPC, for root too: no reserved blocks), the host holds at most disk_mb of it, the sandbox stays usable
    once the file is gone, and close (or gc) leaves no mount and no state behind."""
    provider = get_provider("bwrap", state_dir=bwrap_state)
    for bad in (10, True, "64"):
        with pytest.raises(SandboxError, match="disk_mb must be an integer >= 64"):
            await provider.create(IMAGE, disk_mb=bad)
    sb = await provider.create(IMAGE, disk_mb=64)
    try:
        layer = bwrap_state / sb.id / "layer.img"
        for user in ("agent", "root"):
            res = await sb.exec("head -c 100M /dev/zero > /tmp/big; echo rc=$?; rm -f /tmp/big", user=user,
                                timeout=60)
            assert "No space left on device" in res.stderr and "rc=1" in res.stdout, (user, res)
        assert layer.stat().st_blocks * 512 <= 64 << 20  # what the host holds of it, at most the cap
        # Writes before and after the full disk persist as always.
        await sb.exec("echo kept > /tmp/small", user="agent", check=True)
        assert (await sb.exec("cat /tmp/small", user="agent", check=True)).stdout == "kept\n"
        assert len(_mounts_under(bwrap_state / sb.id)) == 2  # the layer and the overlay on it
    finally:
        await sb.close()
    assert list_state(bwrap_state) == [] and _mounts_under(bwrap_state) == []
    # A sandbox whose owner is gone: gc unmounts both and removes its state.
    left = await provider.create(IMAGE, disk_mb=64)
    from lego_rl.sandbox.bwrap_state import gc_state

    assert gc_state(bwrap_state, include_alive=True) == [left.id]
    assert list_state(bwrap_state) == [] and _mounts_under(bwrap_state) == []


async def test_bwrap_host_rootfs(bwrap_state: Path) -> None:
    provider = get_provider("bwrap", state_dir=bwrap_state)
    sb = await provider.create(ImageSpec(name="host", rootfs=None, workdir="/srv/lego-test-workdir"))
    try:
        res = await sb.exec("echo hi > f && cat f && id -un", user="root", check=True)
        assert res.stdout == "hi\nroot\n"
        assert (await sb.exec("id -un", user="agent")).stdout == "agent\n"
    finally:
        await sb.close()
    assert not Path("/srv/lego-test-workdir").exists()  # writes stayed in the sandbox's layer


def _sunabako_state() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="lego-sunabako-test-", dir="/var/tmp"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


sunabako_state = pytest.fixture(_sunabako_state)


async def test_sunabako_production_mode_fails_clearly_without_cgroups(sunabako_state: Path) -> None:
    check_available("sunabako")
    from sandbox_helpers import provider_options

    binary = provider_options("sunabako")["binary"]
    node = sunabako_state / "node"
    prod = get_provider("sunabako", state_dir=str(node), binary=binary, test_memory=False)
    controls = Path("/sys/fs/cgroup/cgroup.subtree_control")
    if controls.exists() and "memory" in controls.read_text():
        pytest.skip("this machine has delegated cgroups: production mode may work")
    with pytest.raises(SandboxError, match="could not initialise node.*test memory mode"):
        await prod.create(IMAGE)
    tester = get_provider("sunabako", state_dir=str(node), binary=binary, allow_test_memory=True)
    with pytest.raises(SandboxError, match="no rootfs"):
        await tester.create(ImageSpec(name="host"))
    with pytest.raises(SandboxError, match="unknown option"):
        await tester.create(IMAGE, cpus=2)
    await tester._check_nodes()
    assert json.loads((node / "node.json").read_text())["allow_unbounded_memory_for_tests"] is True


def test_sunabako_env_flag_must_be_explicit(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("sunabako")
    monkeypatch.setenv("SUNABAKO_ALLOW_TEST_MEMORY", "yes")
    with pytest.raises(SandboxError, match="SUNABAKO_ALLOW_TEST_MEMORY must be 0 or 1"):
        get_provider("sunabako")
    monkeypatch.setenv("SUNABAKO_ALLOW_TEST_MEMORY", "1")
    assert get_provider("sunabako").test_memory is True
    assert get_provider("sunabako", allow_test_memory=False).test_memory is False
    with pytest.raises(SandboxError, match="contradicts"):
        get_provider("sunabako", allow_test_memory=True, test_memory=False)


def test_e2b_needs_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("e2b")
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    with pytest.raises(SandboxError, match="E2B_API_KEY"):
        get_provider("e2b")



def test_sunabako_bad_cluster_file_is_named(tmp_path: Path) -> None:
    pytest.importorskip("sunabako")
    bad = tmp_path / "cluster.json"
    bad.write_text('{"nodes": [{"name": "a", "hots": "x"}]}')
    with pytest.raises(SandboxError, match=f"cluster file {bad}"):
        get_provider("sunabako", cluster=str(bad))
    with pytest.raises(SandboxError, match="cluster file"):
        get_provider("sunabako", cluster=str(tmp_path / "missing.json"))


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_sunabako_cluster_file_mode(sunabako_state: Path) -> None:
    """cluster.json with one node reached without SSH (no host): the cluster code path, for real."""
    check_available("sunabako")
    from sandbox_helpers import provider_options

    binary = provider_options("sunabako")["binary"]
    node_dir = sunabako_state / "node0"
    local = get_provider("sunabako", state_dir=str(node_dir), binary=binary, allow_test_memory=True)
    await local._check_nodes()  # provisions the node, as an operator would
    cluster = sunabako_state / "cluster.json"
    cluster.write_text(json.dumps({"nodes": [{"name": "n0", "state_dir": str(node_dir), "binary": binary}]}))
    provider = get_provider("sunabako", cluster=str(cluster), allow_test_memory=True, memory_mb=256)
    sb = await provider.create(IMAGE)
    try:
        assert sb.node_name == "n0"
        assert (await sb.exec("id -un", user="agent")).stdout == "agent\n"
    finally:
        await sb.close()
    from lego_rl.sandbox.sunabako_admin import list_node

    # list_node runs its own event loop: off this test's loop, as the CLI calls it.
    assert await asyncio.to_thread(list_node, str(node_dir)) == []
