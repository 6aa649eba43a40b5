"""`lego sandbox` through typer's CliRunner, on real bwrap sandboxes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_helpers import ROOTFS, check_available
from typer.testing import CliRunner

from lego_rl.cli.main import app
from lego_rl.sandbox.bwrap_state import list_state

runner = CliRunner()


@pytest.fixture
def bwrap_ready() -> None:
    check_available("bwrap")


@pytest.fixture
def state_root() -> Iterator[Path]:
    """A bwrap state dir the agent uid can traverse (pytest's tmp_path is 0700)."""
    root = Path(tempfile.mkdtemp(prefix="lego-bwrap-test-", dir="/var/tmp"))
    root.chmod(0o755)
    yield root / "state"
    shutil.rmtree(root, ignore_errors=True)


def test_providers_lists_builtins() -> None:
    res = runner.invoke(app, ["sandbox", "providers", "--json"])
    assert res.exit_code == 0
    assert {"bwrap", "sunabako", "e2b"} <= set(json.loads(res.stdout))


def test_exec_usage_errors() -> None:
    res = runner.invoke(app, ["sandbox", "exec", "-p", "nope", "host", "--", "true"])
    assert res.exit_code == 2 and "nope" in res.stderr and "bwrap" in res.stderr
    res = runner.invoke(app, ["sandbox", "exec", "relative/dir", "--", "true"])
    assert res.exit_code == 2 and "relative/dir" in res.stderr


@pytest.mark.slow
def test_exec_runs_and_reports_exit_status(bwrap_ready: None, state_root: Path) -> None:
    state = str(state_root)
    res = runner.invoke(app, ["sandbox", "exec", ROOTFS, "--state-dir", state, "-u", "agent", "-w", "/tmp",
                              "--", "id -un; pwd"])
    assert res.exit_code == 0, res.stderr
    assert res.stdout == "agent\n/tmp\n"
    res = runner.invoke(app, ["sandbox", "exec", ROOTFS, "--state-dir", state, "--", "echo no >&2; exit 4"])
    assert res.exit_code == 1 and "no" in res.stderr
    assert list_state(state) == []  # each exec destroyed its sandbox


@pytest.mark.slow
def test_gc_removes_a_leaked_sandbox(bwrap_ready: None, state_root: Path) -> None:
    state = state_root
    # A process that creates a sandbox and dies without closing it: a real leak, overlay mounted.
    leak = (
        "import asyncio, os\n"
        "from lego_rl.sandbox import ImageSpec, create_sandbox\n"
        "async def main():\n"
        f"    sb = await create_sandbox(ImageSpec(name='t', rootfs={ROOTFS!r}), provider_options={{'state_dir': {str(state)!r}}})\n"
        "    await sb.exec('echo x > /tmp/x', check=True)\n"
        "    os._exit(0)\n"
        "asyncio.run(main())\n"
    )
    subprocess.run([sys.executable, "-c", leak], check=True, timeout=60)
    listed = runner.invoke(app, ["sandbox", "ls", "--state-dir", str(state), "--json"])
    rows = json.loads(listed.stdout)
    assert [r["state"] for r in rows] == ["leaked"]
    mounts = Path("/proc/mounts").read_text()
    assert str(state) in mounts
    res = runner.invoke(app, ["sandbox", "gc", "--state-dir", str(state)])
    assert res.exit_code == 0 and rows[0]["id"] in res.stdout
    assert list_state(state) == [] and str(state) not in Path("/proc/mounts").read_text()


@pytest.mark.slow
def test_untraversable_state_dir_is_refused(bwrap_ready: None, tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    res = runner.invoke(app, ["sandbox", "exec", ROOTFS, "--state-dir", str(tmp_path / "s"), "--", "true"])
    assert res.exit_code == 3 and "cannot traverse" in " ".join(res.stderr.split())  # rich wraps at 80 columns


@pytest.mark.slow
def test_exec_with_images_mapping(bwrap_ready: None, state_root: Path, tmp_path: Path) -> None:
    mapping = tmp_path / "images.json"
    entry = {"rootfs": ROOTFS, "workdir": "/etc/apt", "env": {"FROM_MAPPING": "yes"}}
    mapping.write_text(json.dumps({"docker.io/x/y:1": entry}))
    res = runner.invoke(app, ["sandbox", "exec", "docker.io/x/y:1", "--images", str(mapping), "--state-dir",
                              str(state_root), "--", 'pwd; echo "$FROM_MAPPING"'])
    assert res.exit_code == 0, res.stderr
    assert res.stdout == "/etc/apt\nyes\n"
    res = runner.invoke(app, ["sandbox", "exec", "other", "--images", str(mapping), "--", "true"])
    assert res.exit_code == 2 and "'other' is not in" in res.stderr


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sunabako_ls_and_gc_remove_only_dead_sandboxes(tmp_path: Path) -> None:
    check_available("sunabako")
    import asyncio

    from sandbox_helpers import provider_options

    from lego_rl.sandbox import ImageSpec, get_provider

    state = Path(tempfile.mkdtemp(prefix="lego-sunabako-gc-", dir="/var/tmp"))
    state.chmod(0o755)
    opts = {**provider_options("sunabako"), "state_dir": str(state)}

    async def make_two() -> tuple[str, str]:
        provider = get_provider("sunabako", **opts)
        image = ImageSpec(name="t", rootfs=ROOTFS, workdir="/testbed")
        dead, alive = await provider.create(image), await provider.create(image)
        await dead._inner.stop()  # type: ignore[attr-defined]  # a sandbox whose owner went away
        return dead.id, alive.id

    try:
        dead_id, alive_id = asyncio.run(make_two())
        rows = json.loads(runner.invoke(app, ["sandbox", "ls", "-p", "sunabako", "--state-dir", str(state),
                                              "--json"]).stdout)
        assert {r["id"]: r["state"] for r in rows} == {dead_id: "stopped", alive_id: "running"}
        res = runner.invoke(app, ["sandbox", "gc", "-p", "sunabako", "--state-dir", str(state)])
        assert res.exit_code == 0 and dead_id in res.stdout and alive_id not in res.stdout
        res = runner.invoke(app, ["sandbox", "gc", "-p", "sunabako", "--state-dir", str(state), "--all"])
        assert res.exit_code == 0 and alive_id in res.stdout
        rows = json.loads(runner.invoke(app, ["sandbox", "ls", "-p", "sunabako", "--state-dir", str(state),
                                              "--json"]).stdout)
        assert rows == []
    finally:
        runner.invoke(app, ["sandbox", "gc", "-p", "sunabako", "--state-dir", str(state), "--all"])
        shutil.rmtree(state, ignore_errors=True)
