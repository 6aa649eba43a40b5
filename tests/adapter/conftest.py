"""Fixtures for adapter tests: the tiny model, a scripted policy engine, and a running adapter app."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ -> `support` helpers

from support.scripted_engine import ScriptedPolicyEngine  # noqa: E402

from lego_rl.adapter.core import AdapterCore  # noqa: E402
from lego_rl.adapter.server import AdapterServer  # noqa: E402
from lego_rl.adapter.sessions import SessionRegistry  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    from lego_rl.serving.tiny_model import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture(scope="session")
def renderer(tiny_model_dir: Path) -> Any:
    from lego_rl.chat.render import ChatRenderer

    return ChatRenderer.from_pretrained(tiny_model_dir)


class Harness:
    """A running adapter (in-process aiohttp test server) over a scripted policy engine."""

    def __init__(self, client: TestClient, engine: ScriptedPolicyEngine, sessions: SessionRegistry,
                 core: AdapterCore) -> None:
        self.client = client
        self.engine = engine
        self.sessions = sessions
        self.core = core


@pytest.fixture
async def make_harness(
    tiny_model_dir: Path, renderer: Any
) -> AsyncIterator[Callable[..., Any]]:
    clients: list[TestClient] = []

    async def make(script: Sequence[str] | Callable[[str, int], str] = ("Hello.",), *,
                   max_context_tokens: int = 32768, max_body_bytes: int = 8 * 1024 * 1024,
                   sessions: Sequence[str] = ("sess-a",), score: bool = True, backend: Any = None,
                   **server_kw: Any) -> Harness:
        engine = backend or ScriptedPolicyEngine(tiny_model_dir, script, score=score)
        registry = SessionRegistry()
        for sid in sessions:
            registry.open(sid)
        core = AdapterCore(renderer, engine, max_context_tokens=max_context_tokens, max_response_tokens=1024)
        server = AdapterServer(core, registry, max_body_bytes=max_body_bytes, **server_kw)
        client = TestClient(TestServer(server.app(), host="127.0.0.1"))
        await client.start_server()
        clients.append(client)
        return Harness(client, engine, registry, core)

    yield make
    for client in clients:
        await client.close()
