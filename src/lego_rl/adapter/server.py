"""The adapter's HTTP edge: one aiohttp app serving every dialect in ``DIALECTS`` over one core.

Per request: resolve the session, read the body under a size limit, let the dialect parse it into a
``CanonicalRequest``, run the turn on the core, and render the reply in the dialect's protocol. Every
exception is mapped once, here, into a ``WireError`` that the dialect shapes.

Sessions: the ``/s/{session}/`` path prefix names the session when present (headers are then ignored,
so a harness may keep a dummy API key); otherwise the bearer token or ``x-api-key`` does. A request
never touches any session but the one it names.

Records (``records_dir``, the standalone adapter; or a session's own ``records_dir``, a rollout's folder):
each session's turn records are appended and fsynced as each turn ends, before its answer is sent
(``RecordJournal``), with a status file holding the failure reason; with ``auto_open``, a request for a new key is validated before its session is opened.
Logs: one JSON line (logger ``lego_rl.adapter.server``) per 4xx/5xx answer, engine error, session
open/close and record save.

Streams: a request with ``stream: true`` is answered with ``text/event-stream`` as soon as it is
parsed and admitted; SSE comments keep the connection alive while the engine works, then the dialect's
complete event sequence follows, or its error events if the turn failed. A client that asked for a
stream never gets a JSON body with status 200. Requests refused before the stream starts (malformed
body, unknown session, unsupported feature) get the protocol's JSON error with a 4xx status, which
every client SDK reads as a final, non-retryable error.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from lego_rl.adapter.anthropic import AnthropicDialect
from lego_rl.adapter.canonical import CanonicalRequest
from lego_rl.adapter.chat_completions import ChatCompletionsDialect
from lego_rl.adapter.core import AdapterCore
from lego_rl.adapter.dialect import Dialect, Route, WireError
from lego_rl.adapter.responses import ResponsesDialect
from lego_rl.adapter.sessions import RecordJournal, Session, SessionRegistry, turn_records_path
from lego_rl.errors import ProtocolError, ProviderError

log = logging.getLogger(__name__)

DIALECTS: tuple[Dialect, ...] = (AnthropicDialect(), ResponsesDialect(), ChatCompletionsDialect())
"""Every protocol the adapter speaks; the route table is built from this tuple."""

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
DEFAULT_BODY_LIMIT_SETTING = "adapter.max_body_mb"
"""The setting an operator raises when a body is refused (the 413 text names it)."""
BODY_CHUNK_BYTES = 1024 * 1024
OFF_LOOP_BYTES = 256 * 1024
"""Bodies larger than this are JSON-decoded and parsed on a worker thread (smaller: the hop costs more)."""
DEFAULT_KEEPALIVE_S = 5.0
SESSION_PREFIX = "/s/{session}"
NO_RETRY = {"x-should-retry": "false"}

CORE_KEY = web.AppKey("core", AdapterCore)
SESSIONS_KEY = web.AppKey("sessions", SessionRegistry)


def to_wire_error(exc: BaseException) -> WireError:
    """Map any exception to (status, type, message, param): the one place errors are translated."""
    if isinstance(exc, ProtocolError):
        return WireError(exc.status, exc.kind, str(exc), exc.param)
    if isinstance(exc, ProviderError):
        status = exc.status_code if exc.status_code >= 500 else 502
        return WireError(status, "api_error", f"model engine error: {exc}")
    log.exception("adapter: unexpected error", exc_info=exc)
    return WireError(500, "api_error", f"internal adapter error: {type(exc).__name__}: {exc}")


class AdapterServer:
    """Builds the aiohttp application; ``auto_open`` opens unknown sessions on first use (standalone)."""

    def __init__(
        self,
        core: AdapterCore,
        sessions: SessionRegistry,
        *,
        dialects: Sequence[Dialect] = DIALECTS,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        keepalive_s: float = DEFAULT_KEEPALIVE_S,
        auto_open: Callable[[str], Session] | None = None,
        records_dir: Path | None = None,
        body_limit_setting: str = DEFAULT_BODY_LIMIT_SETTING,
    ) -> None:
        if max_body_bytes <= 0 or keepalive_s <= 0:
            raise ValueError(f"max_body_bytes ({max_body_bytes}) and keepalive_s ({keepalive_s}) must be positive")
        self.core = core
        self.sessions = sessions
        self.dialects = tuple(dialects)
        self.max_body_bytes = max_body_bytes
        self.keepalive_s = keepalive_s
        self.auto_open = auto_open
        self.records_dir = records_dir
        # Always there: a session opened with its own records_dir (a rollout's folder) is journaled too.
        self.journal = RecordJournal(records_dir)
        self.body_limit_setting = body_limit_setting

    def app(self) -> web.Application:
        # aiohttp's own limit sits above ours so that our check answers first, in the protocol's shape.
        app = web.Application(client_max_size=self.max_body_bytes + 1024)
        app[CORE_KEY] = self.core
        app[SESSIONS_KEY] = self.sessions
        for dialect in self.dialects:
            for route in dialect.routes:
                handler = self._handler(dialect, route)
                app.router.add_route(route.method, route.path, handler)
                app.router.add_route(route.method, SESSION_PREFIX + route.path, handler)
        app.router.add_get("/health", self._health)
        if self.records_dir is not None:
            app.on_shutdown.append(self._save_all)
        return app

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "open_sessions": len(self.sessions.open_ids())})

    async def _save_all(self, app: web.Application) -> None:
        for session in self.sessions.close_all():
            await self.after_turn(session)
            log_event("session_closed", session=session.id, records=len(session.records),
                      infra_failure=session.infra_failure, termination=session.termination)

    async def after_turn(self, session: Session) -> None:
        """Make the session's new records and status durable, on a worker thread (a session with a records
        folder: its own ``records_dir``, else the server's ``records_dir``)."""
        folder = self.journal.folder(session)
        if folder is None:
            return
        turns = await asyncio.to_thread(self.journal.sync, session)
        if turns:
            log_event("records_saved", session=session.id, turns=turns,
                      path=str(turn_records_path(folder, session.id)))

    def _handler(self, dialect: Dialect, route: Route) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.StreamResponse:
            return await self.handle(request, dialect, route)

        return handle

    # -- one request ---------------------------------------------------------------------------------

    async def handle(self, request: web.Request, dialect: Dialect, route: Route) -> web.StreamResponse:
        session: Session | None = None
        try:
            if route.operation == "unsupported":
                raise ProtocolError(f"{route.feature} is not supported by this adapter", status=400)
            session, unknown = self.known_session(request)
            body, size = await self.read_json_sized(request)
            parse = functools.partial(dialect.parse_request, body, path=request.path, query=request.query,
                                      headers=request.headers)
            # Large bodies are decoded on a worker thread: the event loop serves every other session.
            req = await asyncio.to_thread(parse) if size > OFF_LOOP_BYTES else parse()
            if session is None:  # only a valid request opens a session (no empty record files)
                session = self.open_unknown(request, unknown)
            if route.operation == "count_tokens":
                count = await self.core.in_render_pool(self.core.count_tokens, session, req)
                return web.json_response(dialect.count_tokens_body(count))
            self.core.refuse_if_failed(session)  # before a stream starts: the client gets the HTTP status
            if req.stream:
                return await self.stream(request, dialect, session, req)
            resp = await self.core.run_turn(session, req)
            await self.after_turn(session)
            refusal = dialect.answer_as_error(resp, req)
            if refusal is not None:  # the turn is over and recorded: an answer in the error's shape
                log_answer(refusal, session, request.path)
                return web.json_response(dialect.error_body(refusal), status=refusal.status, headers=NO_RETRY)
            return web.json_response(dialect.render_response(resp, req))
        except Exception as exc:  # noqa: BLE001 - the edge maps every error once
            err = to_wire_error(exc)
            log_answer(err, session, request.path)
            if session is not None:
                await self.after_turn(session)
            # Every refusal here is final (a failed session refuses all later calls too): the header
            # stops the Anthropic/OpenAI SDKs' automatic retries, which Claude Code applies even to 401.
            return web.json_response(dialect.error_body(err), status=err.status, headers=NO_RETRY)

    def known_session(self, request: web.Request) -> tuple[Session | None, ProtocolError | None]:
        """The open session the request names, or (None, the 401) when ``auto_open`` may open it once
        the request is known to be valid; other refusals are raised."""
        token = request.match_info.get("session") or header_token(request.headers)
        try:
            return self.sessions.get(token), None
        except ProtocolError as exc:
            if self.auto_open is None or not token:
                raise
            return None, exc

    def open_unknown(self, request: web.Request, refusal: ProtocolError | None) -> Session:
        token = request.match_info.get("session") or header_token(request.headers)
        assert self.auto_open is not None and token and refusal is not None
        try:
            session = self.auto_open(token)
        except ValueError as exc:  # closed (ids are single use) or not a safe name: keep the 401
            raise ProtocolError(f"{refusal} ({exc})", status=401, kind="authentication_error") from None
        log_event("session_opened", session=session.id, via="first request")
        return session

    async def read_json(self, request: web.Request) -> Any:
        """The request's JSON body, read to its end (Content-Length or chunked) under ``max_body_bytes``."""
        return (await self.read_json_sized(request))[0]

    async def read_json_sized(self, request: web.Request) -> tuple[Any, int]:
        """``read_json`` and the body's size. ``StreamReader.read(n)`` returns as soon as *some* bytes
        are buffered, so one call would cut a large body wherever the socket's first buffer ended: read
        until EOF instead. Bodies over ``OFF_LOOP_BYTES`` are decoded on a worker thread."""
        limit = self.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise self._too_large(request.content_length)
        chunks: list[bytes] = []
        size = 0
        while chunk := await request.content.read(BODY_CHUNK_BYTES):
            size += len(chunk)
            if size > limit:  # chunked (or lying) bodies: stop reading at the limit
                raise self._too_large(None)
            chunks.append(chunk)
        if not size:
            raise ProtocolError("request body is empty: expected a JSON object")
        raw = b"".join(chunks)
        try:
            return (await asyncio.to_thread(json.loads, raw) if size > OFF_LOOP_BYTES else json.loads(raw)), size
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ProtocolError(f"request body is not valid JSON: {exc}") from exc

    def _too_large(self, size: int | None) -> ProtocolError:
        limit = self.max_body_bytes
        got = f"{size} bytes" if size is not None else f"more than {limit} bytes"
        return ProtocolError(f"request body of {got} exceeds the adapter's limit of {limit} bytes "
                             f"(raise {self.body_limit_setting})", status=413, kind="request_too_large")

    async def stream(
        self, request: web.Request, dialect: Dialect, session: Session, req: CanonicalRequest
    ) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream",
                                                       "Cache-Control": "no-cache"})
        await resp.prepare(request)
        turn = asyncio.ensure_future(self.core.run_turn(session, req))
        try:
            while not turn.done():
                await asyncio.wait({turn}, timeout=self.keepalive_s)
                if not turn.done():
                    await resp.write(b": keepalive\n\n")
        except ConnectionResetError:
            # The client went away mid-stream (a CLI killed at its time budget): normal, not an error.
            turn.cancel()
            log.info("adapter: session %s: client disconnected while its turn was running", session.id)
            return resp
        except BaseException:
            turn.cancel()
            raise
        await self.after_turn(session)
        try:
            refusal = dialect.answer_as_error(turn.result(), req)
            if refusal is not None:
                log_answer(refusal, session, request.path, in_stream=True)
                events = dialect.stream_error_events(refusal, req.model)
            else:
                events = dialect.stream_events(turn.result(), req)
        except Exception as exc:  # noqa: BLE001 - becomes the protocol's in-stream error
            err = to_wire_error(exc)
            log_answer(err, session, request.path, in_stream=True)
            events = dialect.stream_error_events(err, req.model)
        try:
            await resp.write(b"".join(event.encode() for event in events))
            await resp.write_eof()
        except ConnectionResetError:
            log.info("adapter: session %s: client disconnected before its reply was written", session.id)
        return resp


def header_token(headers: Mapping[str, str]) -> str | None:
    """The session a request's headers name: the bearer token, else ``x-api-key``."""
    auth = headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return headers.get("x-api-key") or None



def log_event(event: str, **fields: Any) -> None:
    """One structured log line: a JSON object with ``event`` first (errors at WARNING/ERROR, else INFO)."""
    level = fields.pop("level", logging.INFO)
    log.log(level, "%s", json.dumps({"event": event, **fields}, default=str))


def log_answer(err: WireError, session: Session | None, path: str, *, in_stream: bool = False) -> None:
    """The log line of a 4xx/5xx answer; engine errors (502/503...) are logged as ``engine_error``."""
    engine = err.status >= 500 and err.message.startswith("model engine error")
    level = logging.ERROR if err.status >= 500 else logging.WARNING
    log_event("engine_error" if engine else "error_answer", level=level, status=err.status, type=err.kind,
              session=session.id if session else None, path=path, in_stream=in_stream, message=err.message[:500])
