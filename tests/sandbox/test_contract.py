"""The Sandbox contract, run against every provider available on this machine (real sandboxes)."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sandbox_helpers import MakeSandbox, host_processes, image_for

from lego_rl.errors import SandboxError, SandboxTimeout

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.timeout(600)]


async def test_exec_exit_codes_and_check(make_sandbox: MakeSandbox) -> None:
    sb = await make_sandbox()
    res = await sb.exec("echo out; echo err >&2; exit 3")
    assert (res.exit_code, res.stdout, res.stderr, res.ok) == (3, "out\n", "err\n", False)
    argv = await sb.exec(["/bin/echo", "a b", "$HOME"])
    assert argv.ok and argv.stdout == "a b $HOME\n"
    with pytest.raises(SandboxError, match="exited 7"):
        await sb.exec("exit 7", check=True)
    assert (await sb.exec("true", check=True)).ok


async def test_timeout_kills_whole_tree(make_sandbox: MakeSandbox, provider_name: str) -> None:
    sb = await make_sandbox()
    marker = f"{3000 + uuid.uuid4().int % 5000}"
    start = time.monotonic()
    res = await sb.exec(f"(sleep {marker}1 &); sleep {marker}2; echo never", timeout=1.5)
    assert res.timed_out and not res.ok and "never" not in res.stdout
    assert time.monotonic() - start < 20
    with pytest.raises(SandboxTimeout):
        await sb.exec("sleep 30", timeout=1, check=True)
    if provider_name != "e2b":
        await asyncio.sleep(0.5)
        assert host_processes(f"sleep {marker}") == []
    assert (await sb.exec("echo alive")).stdout == "alive\n"  # the sandbox survives a timeout


async def test_env_image_and_per_exec(make_sandbox: MakeSandbox) -> None:
    sb = await make_sandbox()
    res = await sb.exec('echo "$LEGO_IMAGE_VAR/$EXTRA"', env={"EXTRA": "x y"})
    assert res.stdout == "from-image/x y\n"
    over = await sb.exec('echo "$LEGO_IMAGE_VAR"', env={"LEGO_IMAGE_VAR": "override"})
    assert over.stdout == "override\n"


async def test_cwd_default_and_explicit(make_sandbox: MakeSandbox, provider_name: str) -> None:
    sb = await make_sandbox()
    workdir = image_for(provider_name).workdir
    assert (await sb.exec("pwd")).stdout.strip() == workdir
    assert (await sb.exec("pwd", cwd="/tmp")).stdout.strip() == "/tmp"
    with pytest.raises(SandboxError):
        await sb.exec("pwd", cwd="/no/such/dir", check=True)


async def test_agent_is_non_root_and_separated(make_sandbox: MakeSandbox) -> None:
    sb = await make_sandbox()
    agent = await sb.exec('id -un; id -u; echo "$HOME"; touch "$HOME/ok" && echo home-writable', user="agent")
    name, uid, home, writable = agent.stdout.split()
    assert name == "agent" and int(uid) != 0 and home.endswith("agent") and writable == "home-writable"
    assert (await sb.exec("id -u", user="root")).stdout.strip() == "0"
    await sb.write_file("/root-only.txt", "secret", user="root")
    await sb.exec("chmod 600 /root-only.txt", check=True)
    denied = await sb.exec("cat /root-only.txt", user="agent")
    assert not denied.ok and "secret" not in denied.stdout
    with pytest.raises(SandboxError):
        await sb.read_file("/root-only.txt", user="agent")
    with pytest.raises(SandboxError):
        await sb.write_file("/etc/agent-was-here", "x", user="agent")
    # Files an agent writes belong to it, so root can later hand a repo to the agent and back.
    await sb.write_file("/tmp/mine.txt", "x", user="agent")
    assert (await sb.exec("stat -c %U /tmp/mine.txt")).stdout.strip() == "agent"
    git = await sb.exec("git --version", user="agent")
    assert git.ok, git.stderr


async def test_write_read_text_bytes_and_host_path(make_sandbox: MakeSandbox, tmp_path: Path) -> None:
    sb = await make_sandbox()
    await sb.write_file("/tmp/dir/sub/t.txt", "héllo\nworld")
    assert await sb.read_file("/tmp/dir/sub/t.txt") == "héllo\nworld".encode()
    blob = bytes(range(256)) * 4 + b"\0\xff\xfe"
    await sb.write_file("/tmp/b.bin", blob)
    assert await sb.read_file("/tmp/b.bin") == blob
    host = tmp_path / "big.bin"
    host.write_bytes(os.urandom(5 << 20))  # above sunabako's 4 MiB chunk: exercises appends
    await sb.write_file("/tmp/big.bin", host)
    assert await sb.read_file("/tmp/big.bin") == host.read_bytes()
    await sb.write_file("/tmp/empty", b"")
    assert await sb.read_file("/tmp/empty") == b""
    with pytest.raises(SandboxError):
        await sb.read_file("/no/such/file")


async def test_writes_persist_across_execs(make_sandbox: MakeSandbox, provider_name: str) -> None:
    sb = await make_sandbox()
    workdir = image_for(provider_name).workdir
    await sb.exec("echo one > state.txt && mkdir -p d && echo two > /tmp/t", check=True)
    res = await sb.exec("cat state.txt /tmp/t && ls -d d", check=True)
    assert res.stdout == "one\ntwo\nd\n"
    assert await sb.read_file(f"{workdir}/state.txt") == b"one\n"
    await sb.write_file(f"{workdir}/w.txt", "via write_file")
    assert (await sb.exec("cat w.txt")).stdout == "via write_file"
    await sb.exec("rm state.txt", check=True)
    assert not (await sb.exec("test -e state.txt")).ok


async def test_image_files_visible_in_workdir(make_sandbox: MakeSandbox, provider_name: str) -> None:
    if provider_name == "e2b":
        pytest.skip("e2b images are remote templates; the local rootfs is not used")
    sb = await make_sandbox(image_for(provider_name, workdir="/etc/apt"))
    res = await sb.exec("ls; echo new > added.conf && cat added.conf", check=True)
    assert "sources.list.d" in res.stdout and res.stdout.endswith("new\n")
    again = await make_sandbox(image_for(provider_name, workdir="/etc/apt"))
    assert not (await again.exec("test -e added.conf")).ok  # the image itself was not modified


async def test_memory_limit_kills_the_hog(make_sandbox: MakeSandbox) -> None:
    sb = await make_sandbox(memory_mb=64)
    hog = "python3 -c 'x = bytearray(400 << 20); import time; time.sleep(5); print(\"survived\")'"
    try:
        res = await sb.exec(hog, timeout=60)
    except SandboxError:
        return  # the provider tore the sandbox down over the limit: also a kill
    assert not res.ok and "survived" not in res.stdout


@pytest.fixture
async def loopback_server() -> AsyncIterator[int]:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"pong\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()


_CONNECT = (
    "python3 -c 'import socket,sys; s=socket.create_connection((\"127.0.0.1\", int(sys.argv[1])), timeout=5);"
    " print(s.recv(16).decode().strip())' {port}"
)


async def test_network_none_vs_host(make_sandbox: MakeSandbox, provider_name: str, loopback_server: int) -> None:
    if provider_name == "e2b":
        pytest.skip("an e2b sandbox is remote: it cannot reach this host's loopback")
    cmd = _CONNECT.format(port=loopback_server)
    shared = await make_sandbox(network="host")
    res = await shared.exec(cmd, user="agent", timeout=30)
    assert res.ok and res.stdout == "pong\n", res.stderr
    caged = await make_sandbox(network="none")
    res = await caged.exec(cmd, user="agent", timeout=30)
    assert not res.ok and "pong" not in res.stdout
    local = await caged.exec("python3 -c 'import socket; s=socket.socket(); s.bind((\"127.0.0.1\", 0))'")
    assert local.ok, local.stderr  # loopback still exists inside the cage


async def test_close_leaves_nothing_running(make_sandbox: MakeSandbox, provider_name: str) -> None:
    sb = await make_sandbox()
    marker = f"{3000 + uuid.uuid4().int % 5000}"
    running = asyncio.ensure_future(sb.exec(f"sleep {marker}9", timeout=120))
    await asyncio.sleep(1.5)
    if provider_name != "e2b":
        assert host_processes(f"sleep {marker}9"), "the command should be running before close"
    start = time.monotonic()
    await sb.close()
    # The sandbox died mid-exec: the pending exec fails with SandboxError, it does not hang.
    with pytest.raises(SandboxError):
        await asyncio.wait_for(running, 30)
    assert time.monotonic() - start < 30
    if provider_name != "e2b":
        assert host_processes(f"sleep {marker}9") == []
    await sb.close()  # idempotent
    with pytest.raises(SandboxError):
        await sb.exec("true")


async def test_close_after_timeout(make_sandbox: MakeSandbox) -> None:
    sb = await make_sandbox()
    res = await sb.exec("sleep 60", timeout=1)
    assert res.timed_out
    await sb.close()
    with pytest.raises(SandboxError):
        await sb.exec("true")


async def test_huge_output_is_capped_not_fatal(make_sandbox: MakeSandbox) -> None:
    sb = await make_sandbox()
    res = await sb.exec("head -c 100000000 /dev/zero; echo done >&2", timeout=120)
    assert res.exit_code == 0 and res.stderr == "done\n"
    assert 0 < len(res.stdout) <= 100_000_000
    if len(res.stdout) < 100_000_000:
        assert res.truncated


@pytest.fixture
def host_folder() -> Iterator[Path]:
    """A world-traversable host folder (pytest's tmp_path is 0700, which the agent could not enter)."""
    folder = Path(tempfile.mkdtemp(prefix="lego-mount-test-", dir="/var/tmp"))
    os.chmod(folder, 0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


async def test_readonly_mount_cannot_be_written_by_anyone(
    make_sandbox: MakeSandbox, host_folder: Path
) -> None:
    """A mounted toolchain is shared by every rollout on the host: no sandbox user may change it."""
    (host_folder / "bin").mkdir()
    tool = host_folder / "bin" / "tool"
    tool.write_text("#!/bin/sh\necho tool-ok\n")
    tool.chmod(0o755)
    sb = await make_sandbox()
    if not sb.readonly_mounts:
        with pytest.raises(SandboxError, match="cannot mount host folders"):
            await sb.mount_readonly(host_folder, "/opt/lego/t")
        return
    await sb.mount_readonly(host_folder, "/opt/lego/t")
    assert sb.mounts() == {"/opt/lego/t": str(host_folder)}
    assert (await sb.exec(["/opt/lego/t/bin/tool"], user="agent")).stdout == "tool-ok\n"
    for user in ("agent", "root"):
        for attack in (
            "echo evil > /opt/lego/t/bin/tool",
            "touch /opt/lego/t/new",
            "rm -f /opt/lego/t/bin/tool",
            "mv /opt/lego/t/bin /opt/lego/t/bin2",
            "chmod 777 /opt/lego/t/bin/tool",
            "mount -o remount,rw /opt/lego/t",
            "umount /opt/lego/t",
        ):
            res = await sb.exec(attack, user=user)
            assert res.exit_code != 0, f"{attack!r} as {user} succeeded"
    # Nothing reached the host, and the mount is still there in a later exec.
    assert tool.read_text() == "#!/bin/sh\necho tool-ok\n" and sorted(os.listdir(host_folder)) == ["bin"]
    assert (await sb.exec(["/opt/lego/t/bin/tool"], user="agent")).stdout == "tool-ok\n"
    # Another mount at the same place replaces the first; bad input is refused, naming it.
    other = host_folder / "bin"
    await sb.mount_readonly(other, "/opt/lego/t")
    assert (await sb.exec(["/opt/lego/t/tool"], user="agent")).stdout == "tool-ok\n"
    with pytest.raises(SandboxError, match="mount target '/opt/../etc'"):
        await sb.mount_readonly(host_folder, "/opt/../etc")
    with pytest.raises(SandboxError, match="mount source .*nope .* is not a directory"):
        await sb.mount_readonly(host_folder / "nope", "/opt/lego/u")
