"""A CLI killed mid-stream (the agent time budget, a dead sandbox) closes its connection while the
adapter is still waiting for the engine: that is normal during rollouts, so the adapter logs one quiet
line, cancels the turn and logs no traceback."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

from aiohttp import web

from lego_rl.adapter.core import AdapterCore
from lego_rl.adapter.server import AdapterServer
from lego_rl.adapter.sessions import SessionRegistry
from lego_rl.serving.protocol import GenerateResult, SamplingParams


class StalledEngine:
    """TEST DOUBLE for the engine: never answers (until cancelled), so the stream stays open."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def generate(
        self, token_ids: list[int], params: SamplingParams, *, session_id: str | None = None, **_: Any
    ) -> GenerateResult:
        self.started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        raise AssertionError("unreachable")


async def test_client_gone_mid_stream_is_one_quiet_log_line(renderer: Any, caplog: Any) -> None:
    engine = StalledEngine()
    sessions = SessionRegistry()
    sessions.open("sess-1")
    core = AdapterCore(renderer, engine, max_context_tokens=4096, max_response_tokens=16)
    runner = web.AppRunner(AdapterServer(core, sessions, keepalive_s=0.05).app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    body = b'{"model":"m","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"hi"}]}'
    request = (
        f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: sess-1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    caplog.set_level(logging.INFO, logger="lego_rl.adapter.server")
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        await writer.drain()
        assert (await reader.readline()).startswith(b"HTTP/1.1 200")
        await asyncio.wait_for(engine.started.wait(), 30)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
        writer.close()
        await asyncio.wait_for(engine.cancelled.wait(), 10)  # the turn is cancelled, not left running
        await asyncio.sleep(0.2)
    finally:
        await runner.cleanup()
    adapter_logs = [r for r in caplog.records if r.name == "lego_rl.adapter.server"]
    assert [r.levelno for r in adapter_logs] == [logging.INFO], [r.getMessage() for r in adapter_logs]
    assert "client disconnected" in adapter_logs[0].getMessage() and adapter_logs[0].exc_info is None
