"""The warm pool and the reflink staging of sunabako images, on real sandboxes and a real XFS filesystem."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sandbox_helpers import ROOTFS, check_available, image_for

from lego_rl.errors import SandboxError
from lego_rl.sandbox import ImageSpec, Sandbox
from lego_rl.sandbox.bwrap import BwrapProvider
from lego_rl.sandbox.sunabako_provider import SunabakoProvider
from lego_rl.sandbox.sunabako_stage import RootfsStage, supports_reflink
from lego_rl.sandbox.warm_pool import WarmPool

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.timeout(900)]


@pytest.fixture
def bwrap() -> Iterator[BwrapProvider]:
    """A bwrap provider with its own state dir (not the host's shared one)."""
    check_available("bwrap")
    state = Path(tempfile.mkdtemp(prefix="lego-pool-test-", dir="/var/tmp"))
    os.chmod(state, 0o755)
    yield BwrapProvider(state_dir=state)
    shutil.rmtree(state, ignore_errors=True)


async def test_pool_hands_out_fresh_sandboxes_and_refills(bwrap: BwrapProvider) -> None:
    made: list[Sandbox] = []

    async def make(image: ImageSpec, options: dict[str, Any]) -> Sandbox:
        sb = await bwrap.create(image, **options)
        made.append(sb)
        return sb

    pool = WarmPool(make, 2)
    image = image_for("bwrap")
    first = await pool.take(image, {})  # empty pool: made on the spot, and two more started
    assert (pool.hits, pool.misses) == (0, 1)
    await pool.wait_filled()
    assert pool.ready(image, {}) == 2 and len(made) == 3
    await first.exec("touch /testbed/dirty", check=True)
    second = await pool.take(image, {})
    assert pool.hits == 1 and second is not first
    assert not (await second.exec("test -e /testbed/dirty")).ok  # nothing of another sandbox leaks in
    # A pooled sandbox that died while waiting is not handed out.
    await pool.wait_filled()
    for sb in made[1:]:
        if sb is not second:
            await sb.close()
    third = await pool.take(image, {})
    assert (await third.exec(["true"])).ok and third not in made[:3]
    await pool.aclose()
    for sb in (first, second, third):
        await sb.close()
    assert not [p for p in bwrap.state_root.iterdir() if not p.name.startswith(".")]  # nothing left


async def test_pool_is_bounded_across_keys_and_does_not_loop_on_failure(bwrap: BwrapProvider) -> None:
    calls = 0

    async def make(image: ImageSpec, options: dict[str, Any]) -> Sandbox:
        nonlocal calls
        calls += 1
        return await bwrap.create(image, **options)

    pool = WarmPool(make, 2)
    for workdir in ("/testbed", "/tmp", "/srv"):
        await (await pool.take(image_for("bwrap", workdir=workdir), {})).close()
        await pool.wait_filled()
    assert sum(pool.ready(image_for("bwrap", workdir=w), {}) for w in ("/testbed", "/tmp", "/srv")) == 2
    await pool.aclose()

    broken = WarmPool(make, 3)
    missing = ImageSpec(name="gone", rootfs="/nonexistent/rootfs", workdir="/")
    with pytest.raises(SandboxError, match="is not a directory"):
        await broken.take(missing, {})
    await broken.wait_filled()
    before = calls
    await asyncio.sleep(0.2)
    assert calls == before and broken.ready(missing, {}) == 0  # failed refills are not retried on their own
    await broken.aclose()


@pytest.fixture
def xfs_folder() -> Iterator[Path]:
    """A real XFS filesystem with reflinks, on a loop device (mkfs.xfs from xfsprogs)."""
    if shutil.which("mkfs.xfs") is None:
        pytest.skip("mkfs.xfs is not installed (apt-get install xfsprogs)")
    base = Path(tempfile.mkdtemp(prefix="lego-xfs-test-", dir="/var/tmp"))
    os.chmod(base, 0o755)  # sandboxes' guest uids must traverse it to reach their root filesystems
    image, mnt = base / "fs.img", base / "mnt"
    mnt.mkdir()
    with image.open("wb") as fh:
        fh.truncate(2 << 30)
    subprocess.run(["mkfs.xfs", "-q", "-m", "reflink=1", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
        shutil.rmtree(base, ignore_errors=True)


async def test_images_are_staged_once_for_reflink_clones(xfs_folder: Path, tmp_path: Path) -> None:
    assert supports_reflink(xfs_folder) and not supports_reflink(tmp_path)  # tmp_path: the host's ext4
    state = xfs_folder / "node"
    state.mkdir()
    stage = RootfsStage.for_state_dir(state, required=True)
    source = tmp_path / "rootfs"
    (source / "etc").mkdir(parents=True)
    (source / "etc" / "os-release").write_text("ID=test\n")
    (source / ".lego-rootfs-stamp").write_text("v1\n")
    first = await stage.staged(str(source))
    assert Path(first).parent == xfs_folder / "node.images"
    assert Path(first, "etc", "os-release").read_text() == "ID=test\n"
    assert await stage.staged(str(source)) == first  # once per image
    missing = str(tmp_path / "no-such-rootfs")  # the create fails on it with the provider's error, not here
    assert await stage.staged(missing) == missing
    os.utime(source / ".lego-rootfs-stamp", ns=(1, 1))  # a rebuilt image gets a new copy
    assert await stage.staged(str(source)) != first
    on_ext4 = RootfsStage.for_state_dir(tmp_path, required=True)
    with pytest.raises(SandboxError, match="has no reflinks"):
        await on_ext4.staged(str(source))
    assert await RootfsStage.for_state_dir(tmp_path, required=False).staged(str(source)) == str(source)


async def test_sunabako_pool_create_is_fast_when_warm(xfs_folder: Path) -> None:
    """A real sunabako node whose state is on XFS: staged image, reflink clones, one pooled sandbox."""
    check_available("sunabako")
    provider = SunabakoProvider(state_dir=str(xfs_folder / "node"), allow_test_memory=True, warm_pool=1,
                                stage_rootfs=True)  # fmt: skip
    image = ImageSpec(name="bookworm-test", rootfs=ROOTFS, workdir="/testbed")
    try:
        first = await provider.create(image)
        assert provider.pool is not None
        await provider.pool.wait_filled()
        start = time.perf_counter()
        second = await provider.create(image)
        took = time.perf_counter() - start
        assert provider.pool.hits == 1 and took < 1.5, took
        who = await second.exec("id -un", user="agent")
        assert who.stdout.strip() == "agent"
        info = await provider.node.call_async("inspect", second.id)
        assert info["spec"]["rootfs"].startswith(str(xfs_folder / "node.images"))
        await first.close()
        await second.close()
    finally:
        await provider.aclose()
    rows = await provider.node.call_async("list")
    assert [r for r in rows if (r.get("status") or {}).get("state") == "running"] == []
