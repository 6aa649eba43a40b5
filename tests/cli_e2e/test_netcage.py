"""The cage the real CLIs run in: loopback only, forwards to unix sockets, nothing outlives it."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from aiohttp import web
from support.netcage import run_caged

pytestmark = [pytest.mark.root]


async def test_cage_has_only_loopback_and_forwards_to_the_socket(tmp_path: Path) -> None:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hello from outside")

    app = web.Application()
    app.router.add_get("/", hello)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = tmp_path / "s.sock"
    await web.UnixSite(runner, str(sock)).start()
    probe = (
        "import socket, urllib.request\n"
        "print(urllib.request.urlopen('http://127.0.0.1:18555/').read().decode())\n"
        "print(sorted(name for _, name in socket.if_nameindex()))\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 80), timeout=3)\n"
        "    print('escaped')\n"
        "except OSError as exc:\n"
        "    print('no route:', exc.errno)\n"
    )
    try:
        res = await run_caged([sys.executable, "-c", probe], forwards={18555: str(sock)}, timeout=60)
    finally:
        await runner.cleanup()
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "hello from outside"
    assert lines[1] == "['lo']"
    assert lines[2].startswith("no route:")


async def test_everything_inside_dies_with_the_cage(tmp_path: Path) -> None:
    marker = tmp_path / "still-running"
    # A daemonised grandchild (setsid, like a tmux server) that would touch the marker after 3 s.
    script = f"setsid sh -c 'sleep 3; touch {marker}' & sleep 0.2; echo started"
    res = await run_caged(["sh", "-c", script], forwards={}, timeout=30)
    assert res.returncode == 0 and res.stdout.strip() == "started"
    await asyncio.sleep(4)
    assert not marker.exists()


async def test_timeout_kills_the_cage(tmp_path: Path) -> None:
    res = await run_caged(["sleep", "60"], forwards={}, timeout=1)
    assert res.timed_out and res.returncode == -9
