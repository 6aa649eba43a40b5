"""Fixtures for the real-CLI tests: installed CLIs, the tiny model, and an adapter on a unix socket.

The CLIs come from ``scripts/setup_clis.sh`` (``$LEGO_CLI_DIR``, default ``<repo>/.lego/clis``). When
they are missing the tests fail and say how to install them, unless ``LEGO_CLI_TESTS_OPTIONAL=1``,
which turns that into a skip. Each CLI runs in a loopback-only network namespace (``support.netcage``)
whose ``127.0.0.1:ADAPTER_PORT`` is forwarded to the adapter's unix socket outside.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ -> `support` helpers

from support.scripted_engine import ScriptedPolicyEngine

from lego_rl.adapter.core import AdapterCore
from lego_rl.adapter.server import AdapterServer
from lego_rl.adapter.sessions import SessionRegistry

REPO = Path(__file__).resolve().parents[2]
ADAPTER_PORT = 18091
"""The adapter's address inside every cage (each cage has its own network namespace)."""

CLI_BINARIES = {
    "claude": "claude/node_modules/.bin/claude",
    "codex": "codex/node_modules/.bin/codex",
    "opencode": "opencode/node_modules/.bin/opencode",
    "openhands": "openhands/bin/python",
}


@pytest.fixture(scope="session")
def clis_dir() -> Path:
    return Path(os.environ.get("LEGO_CLI_DIR") or REPO / ".lego" / "clis")


@pytest.fixture(scope="session")
def cli_path(clis_dir: Path) -> Callable[[str], Path]:
    def find(name: str) -> Path:
        part = CLI_BINARIES[name].split("/")[0]
        path = clis_dir / CLI_BINARIES[name]
        if not (clis_dir / part / ".lego-cli-stamp").is_file() or not path.exists():
            msg = f"{name} is not installed under {clis_dir}: run scripts/setup_clis.sh"
            if os.environ.get("LEGO_CLI_TESTS_OPTIONAL") == "1":
                pytest.skip(msg)
            pytest.fail(msg)
        return path

    return find


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    from lego_rl.serving.tiny_model import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture(scope="session")
def renderer(tiny_model_dir: Path) -> Any:
    from lego_rl.chat.render import ChatRenderer

    return ChatRenderer.from_pretrained(tiny_model_dir)


@dataclass
class RunningAdapter:
    socket: Path
    sessions: SessionRegistry
    core: AdapterCore
    engine: Any
    """The ScriptedPolicyEngine behind the adapter (None when the embedded tiny-model engine serves)."""
    url: str = f"http://127.0.0.1:{ADAPTER_PORT}"

    @property
    def forwards(self) -> dict[int, str]:
        return {ADAPTER_PORT: str(self.socket)}


@pytest.fixture
async def start_adapter(
    tmp_path: Path, tiny_model_dir: Path, renderer: Any
) -> AsyncIterator[Callable[..., Any]]:
    """Start an adapter on a unix socket, backed over HTTP (real ``ServingClient``) by either a
    scripted policy (``script`` given) or the embedded engine serving the tiny model (``script=None``)."""
    cleanups: list[Callable[[], Any]] = []

    async def start(script: Sequence[str] | Callable[[str, int], str] | None = None, *,
                    sessions: Sequence[str] = ("sess-1",), context_limit: int = 60000,
                    max_response_tokens: int = 256, keepalive_s: float = 0.05, score: bool = True,
                    **session_kw: Any) -> RunningAdapter:
        from lego_rl.serving.client import ServingClient

        policy = None
        if script is None:
            from lego_rl.serving.server import EmbeddedServer

            embedded = EmbeddedServer(tiny_model_dir)
            engine_url = await embedded.start()
            cleanups.append(embedded.stop)
        else:
            policy = ScriptedPolicyEngine(tiny_model_dir, script, score=score)
            engine_runner = web.AppRunner(policy.app(), access_log=None)
            await engine_runner.setup()
            cleanups.append(engine_runner.cleanup)
            site = web.TCPSite(engine_runner, "127.0.0.1", 0)
            await site.start()
            engine_url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        client = ServingClient([engine_url], vocab_size=renderer.vocab_size)
        cleanups.append(client.close)
        registry = SessionRegistry()
        for sid in sessions:
            registry.open(sid, **session_kw)
        core = AdapterCore(renderer, client, max_context_tokens=context_limit, max_response_tokens=max_response_tokens)
        # A short keepalive puts SSE comment lines into every real CLI's streams (each turn takes longer
        # than 50 ms to score), proving each client's SSE parser skips them.
        runner = web.AppRunner(AdapterServer(core, registry, keepalive_s=keepalive_s).app(), access_log=None)
        await runner.setup()
        cleanups.append(runner.cleanup)
        sock = tmp_path / f"adapter-{len(cleanups)}.sock"
        await web.UnixSite(runner, str(sock)).start()
        return RunningAdapter(sock, registry, core, policy)

    yield start
    for cleanup in reversed(cleanups):
        await cleanup()


def assert_records_match_engine(records: list[Any], engine: ScriptedPolicyEngine) -> None:
    """Each recorded main turn holds exactly the prompt, output ids and logprobs the engine produced."""
    assert len(records) == len(engine.calls), (len(records), [r.text for r in records])
    for record, call in zip(records, engine.calls):
        assert record.prompt_ids == call.prompt_ids
        assert record.output_ids == call.output_ids
        assert record.logprobs == call.logprobs
