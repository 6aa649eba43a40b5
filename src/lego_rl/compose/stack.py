"""The serving side of a run: the engine (embedded or vLLM), the client, and the adapter in front of it.

``serving_stack(cfg)`` starts whatever the config asks for and yields a ``Stack``; leaving the context
stops the adapter, then the embedded engine. Rollouts only need ``stack.sessions`` (to open sessions)
and ``stack.adapter_url`` (to tell the CLI where to go).
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from lego_rl.adapter.core import AdapterCore, SamplingDefaults
from lego_rl.adapter.server import AdapterServer
from lego_rl.adapter.sessions import SessionRegistry
from lego_rl.adapter.standalone import LISTEN_BACKLOG
from lego_rl.chat.render import ChatRenderer
from lego_rl.chat.turn_parser import make_turn_parser
from lego_rl.config.schema import LegoConfig
from lego_rl.errors import ConfigError
from lego_rl.runstore.layout import RunLayout
from lego_rl.serving.client import ServingClient
from lego_rl.serving.errors import ListenFailed

if TYPE_CHECKING:
    from lego_rl.serving.engine import EmbeddedEngine


def model_dir(checkpoint: str) -> Path:
    """The checkpoint directory; ``lego:tiny`` builds (once) and returns the offline tiny model."""
    if checkpoint == "lego:tiny":
        from lego_rl.serving.tiny_model import ensure_tiny_model

        return ensure_tiny_model()
    if checkpoint.startswith("lego:"):
        raise ConfigError(f"unknown built-in model {checkpoint!r} (only lego:tiny)", parameter="model.checkpoint")
    return Path(checkpoint)


def routable_ip() -> str:
    """This node's address as other nodes see it (the source address of a route to a public IP).

    Connecting a UDP socket sends nothing; inside a loopback-only namespace there is no route, and the
    answer is 127.0.0.1, which is right there.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


@dataclass
class Stack:
    sessions: SessionRegistry
    adapter_url: str
    """Adapter root as advertised to sandboxes."""
    serving_urls: list[str]
    client: ServingClient
    core: AdapterCore


@dataclass
class Engines:
    """The engine side alone: what an environment rollout (no adapter, no CLI) samples from."""

    urls: list[str]
    client: ServingClient
    renderer: ChatRenderer
    model_dir: Path
    embedded: EmbeddedEngine | None = None
    """The in-process embedded engine, when lego serves the model itself (weights are then synced in place)."""


@contextlib.asynccontextmanager
async def serving_engines(cfg: LegoConfig) -> AsyncIterator[Engines]:
    """Start the embedded engine (or take the configured vLLM URLs) and a client for it; stops on exit."""
    directory = model_dir(cfg.model.checkpoint)
    async with contextlib.AsyncExitStack() as stack:
        if cfg.serving.backend == "embedded":
            from lego_rl.serving.engine import engine_precision
            from lego_rl.serving.server import EmbeddedServer

            device = cfg.serving.device
            if device == "auto":
                import torch

                device = "cuda" if torch.cuda.is_available() else "cpu"
            # true_on_policy: the engine computes what the trainer computes (lego validate refuses "weights").
            precision = "trainer" if cfg.train.true_on_policy else cfg.serving.precision
            dtype, compute = engine_precision(device, cfg.model.dtype, precision,
                                              trainer_precision=cfg.train.precision)
            engine = EmbeddedServer(directory, host=cfg.serving.host, port=cfg.serving.port, device=device,
                                    dtype=dtype, compute_dtype=compute, max_batch=cfg.serving.max_batch_size,
                                    max_model_len=cfg.model.max_context_tokens,
                                    # R3: the embedded engine returns routes only when started to record them.
                                    return_routed_experts=cfg.rollout.use_rollout_routing_replay,
                                    true_on_policy=cfg.train.true_on_policy,
                                    served_log=(RunLayout(Path(cfg.paths.run_root or "runs/unnamed")).audit
                                                / "engine-0.jsonl" if cfg.train.audit else None))
            try:
                await stack.enter_async_context(engine)
            except ListenFailed as exc:
                raise ConfigError(f"the embedded engine {exc}; another process (another run?) holds that "
                                  "port: pick another serving.port, or 0 (the default) for a free one",
                                  parameter="serving.port", value=cfg.serving.port) from None
            urls = [engine.url]  # the port it got: recorded in the run's serving_ready event
            embedded = engine.engine
        else:
            urls = list(cfg.serving.urls)
            embedded = None
        renderer = ChatRenderer.from_pretrained(directory, template_kwargs=cfg.model.chat_template_kwargs)
        client = await stack.enter_async_context(
            ServingClient(urls, vocab_size=len(renderer.tokenizer), request_timeout_s=cfg.serving.request_timeout_s,
                          model=cfg.model.served_name)
        )
        yield Engines(urls=urls, client=client, renderer=renderer, model_dir=directory, embedded=embedded)


@contextlib.asynccontextmanager
async def serving_stack(cfg: LegoConfig) -> AsyncIterator[Stack]:
    async with contextlib.AsyncExitStack() as stack:
        engines = await stack.enter_async_context(serving_engines(cfg))
        urls, client, renderer = engines.urls, engines.client, engines.renderer
        ro = cfg.rollout
        core = AdapterCore(
            renderer, client, max_context_tokens=cfg.model.max_context_tokens, max_response_tokens=cfg.model.max_response_tokens,
            parser=make_turn_parser(cfg.serving.tool_call_parser, cfg.serving.reasoning_parser, renderer.tokenizer),
            sampling=SamplingDefaults(temperature=ro.temperature, top_p=ro.top_p, top_k=ro.top_k,
                                      nucleus=ro.capture_nucleus, routed_experts=ro.use_rollout_routing_replay),
            model_name=cfg.model.served_name, model_aliases=cfg.adapter.model_aliases,
        )
        sessions = SessionRegistry()
        server = AdapterServer(core, sessions, max_body_bytes=int(cfg.adapter.max_body_mb * 1024 * 1024))
        runner = web.AppRunner(server.app(), access_log=None)
        await runner.setup()
        stack.push_async_callback(runner.cleanup)
        site = web.TCPSite(runner, cfg.adapter.bind_host, cfg.adapter.port, backlog=LISTEN_BACKLOG)
        try:
            await site.start()
        except OSError as exc:
            raise ConfigError(f"the adapter cannot listen on {cfg.adapter.bind_host}:{cfg.adapter.port}: "
                              f"{exc.strerror}", parameter="adapter.port", value=cfg.adapter.port) from None
        port = runner.addresses[0][1]
        host = cfg.adapter.public_host
        if host == "auto":
            host = "127.0.0.1" if cfg.adapter.bind_host.startswith("127.") else routable_ip()
        yield Stack(sessions=sessions, adapter_url=f"http://{host}:{port}", serving_urls=urls, client=client,
                    core=core)
