"""AdapterCore over the real ServingClient and HTTP (vLLM's /inference/v1/generate shape).

The engine behind the HTTP route is the shared TEST DOUBLE ``ScriptedPolicyEngine`` (chosen text, real
tokenizer, real tiny-model logprobs), or a route answering a malformed reply, which a real engine cannot
be made to produce on demand.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from support.scripted_engine import ScriptedPolicyEngine, tool_call_text

from lego_rl.adapter.canonical import CanonicalRequest, Message, ToolSpec
from lego_rl.adapter.core import AdapterCore
from lego_rl.adapter.sessions import SessionRegistry
from lego_rl.chat.render import ChatRenderer
from lego_rl.errors import ProviderError
from lego_rl.serving.client import ServingClient

WRITE = ToolSpec(
    name="write_file",
    parameters={"type": "object", "properties": {"path": {"type": "string"}, "text": {"type": "string"}}},
)
ASK = [Message(role="user", content="write hello.txt")]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[web.Application], Any]]:
    servers: list[TestServer] = []

    async def start(app: web.Application) -> str:
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        return str(server.make_url("")).rstrip("/")

    yield start
    for server in servers:
        await server.close()


async def test_tool_loop_over_http(serve: Any, tiny_model_dir: Path, renderer: ChatRenderer) -> None:
    engine = ScriptedPolicyEngine(
        tiny_model_dir,
        [tool_call_text("write_file", {"path": "hello.txt", "text": "hi"}, before="Writing."), "Done."],
    )
    url = await serve(engine.app())
    async with ServingClient([url], vocab_size=len(renderer.tokenizer)) as client:
        core = AdapterCore(renderer, client, max_context_tokens=4096, verify_bridges=True)
        session = SessionRegistry().open("http-1")
        first = await core.run_turn(
            session, CanonicalRequest(protocol="responses", messages=ASK, tools=[WRITE])
        )
        (call,) = first.tool_calls
        assert (call.name, call.arguments, call.id[:5]) == (
            "write_file",
            {"path": "hello.txt", "text": "hi"},
            "call_",
        )
        history = [*ASK, Message(role="assistant", content=first.text, tool_calls=[call]),
                   Message(role="tool", tool_call_id=call.id, content="ok")]  # fmt: skip
        second = await core.run_turn(
            session, CanonicalRequest(protocol="responses", messages=history, tools=[WRITE])
        )
    assert second.text == "Done." and second.stop == "end_turn"
    assert [r.render_mode for r in session.records] == ["full", "bridged"]
    for rec, sent in zip(session.records, engine.calls, strict=True):
        assert (rec.prompt_ids, rec.output_ids) == (sent.prompt_ids, sent.output_ids)
        assert rec.logprobs == pytest.approx(sent.logprobs, abs=0)


async def test_invalid_reply_over_http_fails_the_session(serve: Any, renderer: ChatRenderer) -> None:
    async def bad(request: web.Request) -> web.Response:
        content = [{"token_id": 5, "logprob": -0.1}]  # two ids, one logprob
        return web.json_response(
            {"choices": [{"token_ids": [5, 6], "logprobs": {"content": content}, "finish_reason": "stop"}]}
        )

    app = web.Application()
    app.router.add_post("/inference/v1/generate", bad)
    url = await serve(app)
    async with ServingClient([url], vocab_size=len(renderer.tokenizer)) as client:
        core = AdapterCore(renderer, client, max_context_tokens=4096)
        session = SessionRegistry().open("http-bad")
        with pytest.raises(ProviderError) as err:
            await core.run_turn(session, CanonicalRequest(protocol="chat", messages=ASK))
    assert err.value.status_code == 502
    assert session.records == [] and session.infra_failure and "engine:" in session.infra_failure
