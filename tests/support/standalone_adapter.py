"""`lego adapter` run as its own process in front of a scripted engine, for the standalone-adapter tests.

``standalone_adapter(engine, model_dir, records)`` serves ``engine`` (a ``ScriptedPolicyEngine``: the policy's
answers are the test's script, everything after them is the product's) on a free port, starts the real
``lego adapter --open-sessions RECORDS`` CLI against it on another free port, and yields once its /health
answers. The test ends the process itself (``stop(SIGTERM)`` for a clean shutdown, ``stop(SIGKILL)`` for a
crash) and reads ``stderr``; a test that fails first leaves it to the helper, which kills it.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web
from support.scripted_engine import ScriptedPolicyEngine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class StandaloneAdapter:
    proc: asyncio.subprocess.Process
    port: int
    stderr: str = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def stop(self, sig: int) -> str:
        """Send ``sig``, wait for the exit (60 s at most); its stderr."""
        try:
            self.proc.send_signal(sig)
        except ProcessLookupError:  # it exited on its own: its stderr is still there to read
            pass
        _, err = await asyncio.wait_for(self.proc.communicate(), 60)
        self.stderr = err.decode()
        return self.stderr


async def wait_healthy(http: aiohttp.ClientSession, port: int, proc: asyncio.subprocess.Process) -> None:
    for _ in range(1200):  # the CLI imports transformers: slow on a loaded machine
        assert proc.returncode is None, "lego adapter exited early"
        try:
            async with http.get(f"http://127.0.0.1:{port}/health") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientConnectionError:
            await asyncio.sleep(0.1)
    raise AssertionError("lego adapter never became healthy")


@asynccontextmanager
async def standalone_adapter(engine: ScriptedPolicyEngine, model_dir: Path,
                             records: Path) -> AsyncIterator[StandaloneAdapter]:
    runner = web.AppRunner(engine.app(), access_log=None)
    await runner.setup()
    try:
        engine_port, port = free_port(), free_port()
        await web.TCPSite(runner, "127.0.0.1", engine_port).start()
        proc = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).with_name("lego")), "adapter", "--serving-url",
            f"http://127.0.0.1:{engine_port}", "--model", str(model_dir), "--open-sessions", str(records),
            "--port", str(port), stderr=asyncio.subprocess.PIPE)
        adapter = StandaloneAdapter(proc, port)
        try:
            async with aiohttp.ClientSession() as http:
                await wait_healthy(http, port, proc)
            yield adapter
        finally:
            if proc.returncode is None:
                await adapter.stop(signal.SIGKILL)
    finally:
        await runner.cleanup()
