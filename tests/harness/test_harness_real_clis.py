"""The real CLIs, installed offline from the fetched toolchain into real bwrap sandboxes, start as the
agent user. Needs scripts/setup_toolchain.sh (and the rootfs of scripts/build_rootfs.sh)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import MakeSandbox
from harness_helpers import missing

from lego_rl.errors import HarnessError
from lego_rl.harness import Toolchain, get_harness, get_plugin_manager
from lego_rl.harness.toolchain import default_toolchain_dir

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def toolchain() -> Toolchain:
    folder = default_toolchain_dir()
    if not (folder / "toolchain.lock.json").is_file():
        missing(f"no harness toolchain at {folder}: run scripts/setup_toolchain.sh")
    return Toolchain(folder)


def needs(toolchain: Toolchain, handle: object) -> None:
    lock = toolchain.lockfile().entries
    absent = [p.key for p in handle.toolchain_pins() if p.key not in lock]  # type: ignore[attr-defined]
    if absent:
        missing(f"toolchain lacks {absent}: run scripts/setup_toolchain.sh")


@pytest.mark.parametrize(
    ("name", "overrides", "expect"),
    [
        ("claude_code", {}, "2.1.332 (Claude Code)"),
        ("claude_code", {"install_from": "npm"}, "2.1.332 (Claude Code)"),
        ("codex", {}, "codex-cli 0.162.1"),
        ("codex", {"install_from": "npm"}, "codex-cli 0.162.1"),
        ("opencode", {}, "1.18.33"),
    ],
    ids=["claude_code-native", "claude_code-npm", "codex-native", "codex-npm", "opencode"],
)
async def test_cli_installs_offline_and_starts_as_agent(
    make_sandbox: MakeSandbox, toolchain: Toolchain, name: str, overrides: dict[str, str], expect: str
) -> None:
    handle = get_harness(name, overrides, environ={}, pm=get_plugin_manager({}))
    needs(toolchain, handle)
    sb = await make_sandbox()  # network "none": nothing can be downloaded inside
    exe = await handle.install(sb, toolchain)
    assert (await sb.exec(["test", "-r", exe], user="agent")).exit_code == 0  # node scripts are read, not run
    assert await handle.verify(sb, "agent") == expect
    if overrides.get("install_from") == "npm":
        node = await sb.exec(["/opt/lego/node/22.23.5/bin/node", "--version"], user="agent")
        assert node.stdout.strip() == "v22.23.5"


async def test_tarball_override_with_wrong_hash_is_refused_before_upload(
    make_sandbox: MakeSandbox, toolchain: Toolchain, tmp_path: Path
) -> None:
    fake = tmp_path / "codex-linux-x64.tgz"
    fake.write_bytes(b"not the pinned archive")
    handle = get_harness(
        "codex", environ={"VIME_AGENT_CODEX_NATIVE_TARBALL": str(fake)}, pm=get_plugin_manager({})
    )
    sb = await make_sandbox()
    with pytest.raises(HarnessError, match="refusing .*codex-linux-x64.tgz.*does not match the pin"):
        await handle.install(sb, toolchain)
    assert (await sb.exec("ls /opt/lego 2>/dev/null | wc -l")).stdout.strip() == "0"


async def test_openhands_refuses_an_image_without_its_python(
    make_sandbox: MakeSandbox, toolchain: Toolchain
) -> None:
    handle = get_harness("openhands", {"python": "python3"}, environ={}, pm=get_plugin_manager({}))
    sb = await make_sandbox()  # the bookworm test rootfs has Python 3.11 only
    with pytest.raises(HarnessError, match=r"needs Python 3.13 in the sandbox .* 'python3' is 3.11"):
        await handle.install(sb, toolchain)


async def test_openhands_runs_on_bookworm_with_the_mounted_python(
    make_sandbox: MakeSandbox, toolchain: Toolchain
) -> None:
    """The toolchain brings Python 3.13 (loader and libraries included) to an image with 3.11 and glibc 2.36."""
    handle = get_harness("openhands", environ={}, pm=get_plugin_manager({}))
    needs(toolchain, handle)
    sb = await make_sandbox()
    await handle.install(sb, toolchain)
    assert set(sb.mounts()) == {"/opt/lego/python/3.13", "/opt/lego/openhands/1.58.2-py3.13"}
    assert await handle.verify(sb, "agent") == "openhands-sdk 1.58.2"
    # sys.executable is the launcher, so a child Python gets the same loader; image programs run as usual.
    code = "import subprocess, sys; print(subprocess.run([sys.executable, '-c', 'import ssl, sqlite3; print(1)'], "
    code += "capture_output=True, text=True).stdout.strip(), subprocess.run(['ldd', '--version'], "
    code += "capture_output=True, text=True).stdout.split()[4])"
    res = await sb.exec(["/opt/lego/python/3.13/bin/python3.13", "-c", code], user="agent")
    assert res.stdout.split() == ["1", "2.36"], res.stderr


@pytest.mark.root
@pytest.mark.parametrize(
    ("name", "expect"),
    [("claude_code", "2.1.332 (Claude Code)"), ("codex", "codex-cli 0.162.1"), ("opencode", "1.18.33")],
)
async def test_cli_installs_into_sunabako_and_starts_as_agent(
    make_sunabako: MakeSandbox, toolchain: Toolchain, name: str, expect: str
) -> None:
    handle = get_harness(name, environ={}, pm=get_plugin_manager({}))
    needs(toolchain, handle)
    sb = await make_sunabako()
    await handle.install(sb, toolchain)
    assert await handle.verify(sb, "agent") == expect
