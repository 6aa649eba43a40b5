"""Run a process in a loopback-only network namespace (and its own PID namespace), for real-CLI tests.

Inside the cage nothing can leave the machine: the only interface is ``lo``, so a CLI that tries to
reach the internet gets an immediate error instead of a hang. Servers of the test (the adapter) stay
outside and listen on unix sockets; the cage forwards chosen ``127.0.0.1:PORT`` addresses inside to
those sockets (unix sockets are not network-namespaced). The cage is also a PID namespace whose init is
this module's launcher: when the command exits or the cage is killed, the kernel kills everything left
inside (tmux servers, shells a CLI spawned), so tests leave nothing running.

    result = await run_caged(["codex", "exec", ...], forwards={18080: "/tmp/x/adapter.sock"}, env=env)

Needs root (or user namespaces), ``unshare`` (util-linux) and ``ip`` (iproute2).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass
class CagedResult:
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False


def cage_argv(cmd: Sequence[str], forwards: Mapping[int, str | Path]) -> list[str]:
    """The full argv that runs ``cmd`` caged, with ``127.0.0.1:port`` -> unix socket forwards."""
    fw = [f"--forward={port}={sock}" for port, sock in forwards.items()]
    return ["unshare", "--net", "--pid", "--fork", "--mount-proc", "--kill-child",
            sys.executable, str(Path(__file__).resolve()), *fw, "--", *cmd]


async def run_caged(
    cmd: Sequence[str],
    *,
    forwards: Mapping[int, str | Path],
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout: float = 300.0,
) -> CagedResult:
    """Run ``cmd`` in a fresh cage with stdin closed; kill the whole cage after ``timeout`` seconds."""
    proc = await asyncio.create_subprocess_exec(
        *cage_argv(cmd, forwards), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, env=dict(env) if env is not None else None, cwd=cwd)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
        return CagedResult(proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace"))
    except TimeoutError:
        proc.kill()  # --kill-child takes the cage's init, and with it everything inside
        out, err = await proc.communicate()
        return CagedResult(-9, out.decode(errors="replace"), err.decode(errors="replace"), timed_out=True)


# --------------------------------------------------------------------------------------------------
# Inside the cage (this file run as a script by ``cage_argv``): PID 1 of the new namespaces.


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except (ConnectionError, OSError):
            pass


async def _forward(port: int, sock: str) -> asyncio.base_events.Server:
    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(sock)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    return await asyncio.start_server(on_client, "127.0.0.1", port)


async def _inner(forwards: list[tuple[int, str]], cmd: list[str]) -> int:
    ip = await asyncio.create_subprocess_exec("ip", "link", "set", "lo", "up")
    if await ip.wait() != 0:
        raise RuntimeError("netcage: 'ip link set lo up' failed inside the cage")
    servers = [await _forward(port, sock) for port, sock in forwards]
    child = await asyncio.create_subprocess_exec(*cmd)
    code = await child.wait()
    for server in servers:
        server.close()
    return code


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print("usage: netcage.py [--forward=PORT=SOCKET]... -- CMD...", file=sys.stderr)
        return 2
    split = argv.index("--")
    forwards = []
    for opt in argv[:split]:
        port, _, sock = opt.removeprefix("--forward=").partition("=")
        forwards.append((int(port), sock))
    if os.getpid() != 1:
        print("netcage.py: expected to run as PID 1 of a new PID namespace (use cage_argv)", file=sys.stderr)
        return 2
    return asyncio.run(_inner(forwards, argv[split + 1 :]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
