"""The adapter on its own, in front of an already served model: for driving a CLI by hand.

``lego adapter --serving-url URL --model DIR`` calls ``serve_standalone``. Sessions are normally opened
by rollout code; here they come from ``--session ID`` (opened at start) or, with ``--open-sessions DIR``,
from any new key whose first request is valid. Each turn record is appended to
``DIR/<session>.turns.jsonl`` and fsynced as the turn ends, before its answer is sent, so a ``kill -9``
loses no answered turn; ``DIR/<session>.session.json`` holds the session's state and failure reason
(``RecordJournal``). With ``--session`` and no ``--open-sessions``, records go to ``./lego-adapter-records``.
Session ids must be safe file names (``runstore.safe_name``). Every answer with an error, engine error,
session open/close and record save is logged as one JSON line on stderr. ``--workers N`` runs N of these
behind one port, each session held by one of them (``lego_rl.adapter.multiproc``); a worker listens on
a Unix socket (``unix_socket``) and opens only the ``--session`` ids it owns (``owner``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from lego_rl.adapter.core import AdapterCore
from lego_rl.adapter.server import DEFAULT_MAX_BODY_BYTES, AdapterServer, log_event
from lego_rl.adapter.sessions import SessionRegistry
from lego_rl.chat.parser_names import BUILTIN_REASONING_PARSERS, vllm_importable
from lego_rl.chat.turn_parser import BuiltinTurnParser, TurnParser, check_parser_names, make_turn_parser
from lego_rl.errors import ConfigError
from lego_rl.runstore.layout import is_safe_name

DEFAULT_CONTEXT_LIMIT = 32768
LISTEN_BACKLOG = 1024
"""Connections the kernel queues before the adapter accepts them. aiohttp's default (128) is below what
hundreds of rollouts starting at once open: the excess SYNs are dropped and retried after 1, 3, 7 s."""
DEFAULT_RECORDS_DIR = Path("lego-adapter-records")
"""Where ``--session`` sessions' records go when no ``--open-sessions`` folder is given."""


@dataclass
class StandaloneOptions:
    serving_url: str
    model_dir: Path
    host: str = "127.0.0.1"
    port: int = 18091
    open_sessions: Path | None = None
    sessions: Sequence[str] = ()
    max_context_tokens: int | None = None
    """Prompt + output tokens per call; None reads ``max_position_embeddings`` from the model config."""
    max_response_tokens: int = 8192
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    unix_socket: Path | None = None
    """Listen on this Unix socket instead of ``host:port`` (a worker behind ``lego adapter --workers``)."""
    worker_index: int = 0
    workers: int = 1
    """This process is worker ``worker_index`` of ``workers``: it opens only the ``sessions`` it owns."""
    tool_call_parser: str | None = None
    """vLLM's name of the tool-call parser (``lego_rl.chat.turn_parser``); None: the built-in parser, calls in
    either qwen3_coder or hermes form."""
    reasoning_parser: str = "qwen3"


def owner(key: str, workers: int) -> int:
    """The worker (0..workers-1) that holds the session named ``key``: a fixed hash of the name, the same
    in every process, so the front and the workers agree without talking."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % workers


def log_to_stderr() -> None:
    """The adapter's structured lines (errors answered, engine errors, sessions, record saves) on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    adapter_log = logging.getLogger("lego_rl.adapter")
    adapter_log.addHandler(handler)
    adapter_log.setLevel(logging.INFO)


def model_max_context_tokens(model_dir: Path) -> int:
    """The model's own window (``max_position_embeddings`` of config.json), else a default."""
    cfg = Path(model_dir) / "config.json"
    if not cfg.is_file():
        raise ConfigError(f"{model_dir} has no config.json: is it a Hugging Face model directory?",
                          parameter="--model", value=str(model_dir))
    value = json.loads(cfg.read_text()).get("max_position_embeddings")
    return int(value) if isinstance(value, int) and value > 0 else DEFAULT_CONTEXT_LIMIT


def check_options(opts: StandaloneOptions) -> None:
    """Refuse options no worker could start with (checked once before ``--workers`` start any)."""
    if opts.open_sessions is not None and opts.open_sessions.exists() and not opts.open_sessions.is_dir():
        raise ConfigError(f"--open-sessions {opts.open_sessions} exists and is not a directory",
                          parameter="--open-sessions", value=str(opts.open_sessions))
    if opts.tool_call_parser is not None:
        check_parser_names(opts.tool_call_parser, opts.reasoning_parser, use_vllm=vllm_importable())
    elif opts.reasoning_parser not in BUILTIN_REASONING_PARSERS:
        raise ConfigError(f"--reasoning-parser {opts.reasoning_parser!r} without --tool-call-parser: the built-in "
                          f"parser reads {', '.join(BUILTIN_REASONING_PARSERS)}", parameter="--reasoning-parser",
                          value=opts.reasoning_parser)
    for sid in opts.sessions:
        if not is_safe_name(sid):
            raise ConfigError(f"session id {sid!r} must be a safe name: 1-200 of [A-Za-z0-9._-], not starting "
                              "or ending with '.'", parameter="--session", value=sid)


def turn_parser(opts: StandaloneOptions, tokenizer: Any) -> TurnParser:
    """The parser ``--tool-call-parser`` / ``--reasoning-parser`` name (a bad name is a ``ConfigError``)."""
    if opts.tool_call_parser is not None:
        return make_turn_parser(opts.tool_call_parser, opts.reasoning_parser, tokenizer)
    return BuiltinTurnParser("auto", opts.reasoning_parser)  # check_options refused any other reasoning name


def build_standalone(opts: StandaloneOptions) -> tuple[AdapterServer, Any]:
    """The server and its serving client (close the client when done)."""
    from lego_rl.chat.render import ChatRenderer
    from lego_rl.serving.client import ServingClient

    check_options(opts)
    context = opts.max_context_tokens or model_max_context_tokens(opts.model_dir)
    renderer = ChatRenderer.from_pretrained(opts.model_dir, template_kwargs=opts.template_kwargs)
    parser = turn_parser(opts, renderer.tokenizer)
    client = ServingClient([opts.serving_url], vocab_size=renderer.vocab_size)
    core = AdapterCore(renderer, client, max_context_tokens=context, parser=parser,
                       max_response_tokens=min(opts.max_response_tokens, context), model_name=opts.model_dir.name)
    registry = SessionRegistry()
    mine = [sid for sid in opts.sessions if owner(sid, opts.workers) == opts.worker_index]
    for sid in mine:
        try:
            registry.open(sid)
        except ValueError as exc:
            raise ConfigError(str(exc), parameter="--session", value=sid) from None
    server = AdapterServer(
        core, registry, max_body_bytes=opts.max_body_bytes,
        auto_open=registry.open if opts.open_sessions is not None else None,
        records_dir=opts.open_sessions or DEFAULT_RECORDS_DIR, body_limit_setting="lego adapter --max-body-mb",
    )
    assert server.journal is not None
    for sid in mine:
        server.journal.write_status(registry.get(sid))
        log_event("session_opened", session=sid, via="--session")
    return server, client


async def serve_standalone(opts: StandaloneOptions, *, ready: asyncio.Event | None = None,
                           stop: asyncio.Event | None = None, handle_sigint: bool = True) -> None:
    """Serve until SIGINT/SIGTERM (or ``stop`` is set); records are saved on the way out. A worker
    (``handle_sigint=False``) stops on SIGTERM only: its front decides when."""
    server, client = build_standalone(opts)
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    try:
        if opts.unix_socket is not None:
            await web.UnixSite(runner, str(opts.unix_socket), backlog=LISTEN_BACKLOG).start()
        else:
            await web.TCPSite(runner, opts.host, opts.port, backlog=LISTEN_BACKLOG).start()
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM) if handle_sigint else (signal.SIGTERM,):
            loop.add_signal_handler(sig, stop.set)
        if ready is not None:
            ready.set()
        await stop.wait()
    finally:
        await runner.cleanup()  # runs on_shutdown: closes sessions and writes their records
        await client.close()
