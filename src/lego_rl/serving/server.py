"""aiohttp front of the embedded engine: vLLM's token-in/token-out and RL routes, same JSON shapes.

Routes: ``POST /inference/v1/generate``, ``POST /inference/v1/abort_requests`` (and ``/abort_requests``),
``GET /health``, ``POST /pause?mode=``, ``POST /resume``, ``GET /is_paused``, ``POST /collective_rpc``
(``reload_weights`` only), ``POST /update_weight_version``, ``GET /weight_info``, ``GET /load``,
``GET /v1/models``. Bad requests get vLLM's 400 body ``{"error": {"message", "type", "param", "code"}}``;
unknown fields are accepted and logged, as vLLM does. Lego extension: ``return_sampling_mask: true``
adds ``sampling_mask`` (nucleus ids) and ``sampling_mask_probs`` (their sampler probabilities).

``served_log``: every finished generation is appended as one JSON line (request id, prompt length, the sampled
token ids, their logprobs and weight-version spans, the wall-clock time it finished), the engine's own record for ``lego audit`` to hold the
trainer's tensors against.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Self

from aiohttp import web

from lego_rl.errors import ConfigError
from lego_rl.serving.engine import EmbeddedEngine, EngineBadRequest, EngineOutput
from lego_rl.serving.errors import ListenFailed, WeightUpdateRejected
from lego_rl.serving.protocol import SamplingParams
from lego_rl.serving.request_check import BadRequest, check_generate

log = logging.getLogger(__name__)
ENGINE_KEY = web.AppKey("engine", EmbeddedEngine)


class ServedLog:
    """Append-only JSON lines of what the engine sampled (see the module docstring). Appending, never truncating:
    a restarted engine adds to its earlier record."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def append(self, out: EngineOutput) -> None:
        row = {"ts": round(time.time(), 3), "request_id": out.request_id, "prompt_len": out.prompt_len,
               "token_ids": out.token_ids, "logprobs": out.logprobs, "weight_versions": _spans(out.versions)}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


SERVED_LOG_KEY = web.AppKey("served_log", ServedLog)
VLLM_ID_PREFIX = "generate-tokens-"


def error_response(message: str, *, param: str | None = None, status: int = 400,
                   kind: str = "BadRequestError") -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return web.json_response(body, status=status)


async def _json_body(request: web.Request) -> Any:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"JSON decode error: {exc}", "body") from None


def _engine(request: web.Request) -> EmbeddedEngine:
    return request.app[ENGINE_KEY]


def _spans(versions: list[str]) -> list[dict[str, Any]]:
    spans: list[dict[str, Any]] = []
    for pos, v in enumerate(versions):
        if spans and spans[-1]["version"] == v:
            spans[-1]["end"] = pos + 1
        else:
            spans.append({"version": v, "start": pos, "end": pos + 1})
    return spans


def _routing_b64(out: EngineOutput) -> str | None:
    """vLLM's encoding of routed experts: base64 of a ``.npy`` array ``[tokens - 1, layers, k]``."""
    if out.routing is None or not out.routing:
        return None
    import numpy as np
    import torch

    buf = io.BytesIO()
    np.save(buf, torch.cat(out.routing).numpy(), allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode()


def render_reply(out: EngineOutput, *, model: str, want_logprobs: bool) -> dict[str, Any]:
    """An ``EngineOutput`` as vLLM's ``GenerateTokensResponse`` JSON."""
    content = None
    if want_logprobs:
        content = [
            {"token_id": t, "logprob": lp, "rank": rank,
             "top_logprobs": [{"token_id": t, "logprob": lp, "rank": rank}]
             + [{"token_id": i, "logprob": v, "rank": k + 1} for k, (i, v) in enumerate(top) if i != t]}
            for t, lp, rank, top in zip(out.token_ids, out.logprobs, out.ranks, out.top, strict=True)
        ]
    choice: dict[str, Any] = {
        "index": 0, "finish_reason": out.finish_reason, "stop_reason": out.stop_reason,
        "token_ids": out.token_ids, "routed_experts": _routing_b64(out), "sampling_mask": out.nucleus_ids,
        "weight_versions": _spans(out.versions),
        "logprobs": {"content": content} if content is not None else None,
    }
    if out.nucleus_probs is not None:
        choice["sampling_mask_probs"] = out.nucleus_probs
    n = len(out.token_ids)
    return {
        "request_id": f"{VLLM_ID_PREFIX}{out.request_id}", "model": model, "created": int(time.time()),
        "usage": {"prompt_tokens": out.prompt_len, "completion_tokens": n, "total_tokens": out.prompt_len + n},
        "output_mode": "tokens", "choices": [choice],
    }


async def generate(request: web.Request) -> web.Response:
    engine = _engine(request)
    try:
        body = await _json_body(request)
        checked = check_generate(body, vocab_size=engine.vocab_size, max_model_len=engine.max_model_len)
    except BadRequest as exc:
        return error_response(str(exc), param=exc.param)
    for name in checked.unknown:
        log.warning("generate: ignoring unknown field %r", name)
    try:
        out = await engine.generate(checked.token_ids, checked.sampling, request_id=checked.request_id,
                                    want_nucleus=checked.want_nucleus, ignore_eos=checked.ignore_eos)
    except EngineBadRequest as exc:
        return error_response(str(exc), param=exc.param)
    except Exception as exc:
        log.exception("generate %s failed", checked.request_id)
        return error_response(f"{type(exc).__name__}: {exc}", status=500, kind="InternalServerError")
    served = request.app.get(SERVED_LOG_KEY)
    if served is not None:
        served.append(out)
    return web.json_response(render_reply(out, model=engine.name, want_logprobs=checked.want_logprobs))


async def abort_requests(request: web.Request) -> web.Response:
    try:
        body = await _json_body(request)
    except BadRequest as exc:
        return error_response(str(exc), param=exc.param)
    ids = body.get("request_ids") if isinstance(body, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        return error_response("Missing 'request_ids' (a list of strings) in request body", param="request_ids")
    # vLLM names requests "generate-tokens-<id>" inside its engine; accept both spellings.
    names = [i.removeprefix(VLLM_ID_PREFIX) for i in ids]
    n = _engine(request).abort(names)
    return web.json_response({"status": "aborted", "aborted": n})


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def pause(request: web.Request) -> web.Response:
    mode = request.query.get("mode", "abort")
    if mode not in ("abort", "wait", "keep"):
        return error_response(f"mode must be abort, wait or keep, got {mode!r}", param="mode")
    await _engine(request).pause(mode)
    return web.json_response({"status": "paused"})


async def resume(request: web.Request) -> web.Response:
    try:
        await _engine(request).resume()
    except WeightUpdateRejected as exc:
        return error_response(str(exc), param=exc.parameter, status=409, kind="ConflictError")
    return web.json_response({"status": "resumed"})


async def is_paused(request: web.Request) -> web.Response:
    return web.json_response({"is_paused": _engine(request).paused})


async def collective_rpc(request: web.Request) -> web.Response:
    try:
        body = await _json_body(request)
    except BadRequest as exc:
        return error_response(str(exc), param=exc.param)
    method = body.get("method") if isinstance(body, dict) else None
    kwargs = body.get("kwargs") or {} if isinstance(body, dict) else {}
    if method != "reload_weights":
        return error_response(f"collective_rpc method {method!r} is not supported by the embedded engine "
                              "(only reload_weights)", param="method")
    path = kwargs.get("weights_path") if isinstance(kwargs, dict) else None
    if not isinstance(path, str):
        return error_response("reload_weights needs kwargs.weights_path (a checkpoint directory)",
                              param="kwargs.weights_path")
    try:
        await _engine(request).reload_weights(Path(path))
    except ConfigError as exc:
        return error_response(str(exc), param="kwargs.weights_path")
    return web.json_response({"results": [None]})


async def update_weight_version(request: web.Request) -> web.Response:
    try:
        body = await _json_body(request)
    except BadRequest as exc:
        return error_response(str(exc), param=exc.param)
    version = body.get("new_version") if isinstance(body, dict) else None
    if not isinstance(version, str) or not version:
        return error_response("new_version must be a non-empty string", param="new_version")
    await _engine(request).set_version(version)
    return web.json_response({"success": True, "new_version": version})


async def weight_info(request: web.Request) -> web.Response:
    return web.json_response({"weight_version": _engine(request).version})


async def server_load(request: web.Request) -> web.Response:
    return web.json_response({"server_load": _engine(request).load})


async def models(request: web.Request) -> web.Response:
    e = _engine(request)
    card = {"id": e.name, "object": "model", "owned_by": "lego", "root": str(e.model_dir),
            "max_model_len": e.max_model_len}
    return web.json_response({"object": "list", "data": [card]})


ROUTES: tuple[tuple[str, str, Any], ...] = (
    ("POST", "/inference/v1/generate", generate),
    ("POST", "/inference/v1/abort_requests", abort_requests),
    ("POST", "/abort_requests", abort_requests),
    ("GET", "/health", health),
    ("POST", "/pause", pause),
    ("POST", "/resume", resume),
    ("GET", "/is_paused", is_paused),
    ("POST", "/collective_rpc", collective_rpc),
    ("POST", "/update_weight_version", update_weight_version),
    ("GET", "/weight_info", weight_info),
    ("GET", "/load", server_load),
    ("GET", "/v1/models", models),
)


def build_app(engine: EmbeddedEngine, *, served_log: ServedLog | None = None) -> web.Application:
    app = web.Application(client_max_size=256 * 1024**2)
    app[ENGINE_KEY] = engine
    if served_log is not None:
        app[SERVED_LOG_KEY] = served_log
    for method, path, handler in ROUTES:
        app.router.add_route(method, path, handler)
    return app


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _probe_listen(host: str, port: int) -> None:
    """Whether ``host:port`` can be bound now, as the server will bind it (``SO_REUSEADDR``, as asyncio's
    listening sockets on Unix: a port in TIME_WAIT is free, one another process listens on is not)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as exc:
        raise ListenFailed(host, port, exc.strerror or str(exc)) from None


class EmbeddedServer:
    """The engine plus its HTTP server; ``await start()`` / ``await stop()`` or ``async with``."""

    def __init__(self, model_dir: str | Path, *, host: str = "127.0.0.1", port: int = 0,
                 served_log: Path | None = None, **engine_kw: Any):
        self.model_dir, self.host, self.port, self.engine_kw = Path(model_dir), host, port, engine_kw
        self.served_log_path = served_log
        self._served: ServedLog | None = None
        self.engine: EmbeddedEngine | None = None
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> str:
        """Load the model and listen; the URL. A fixed ``port`` that cannot be bound is a ``ListenFailed``,
        found before the model loads (a probe) and again by the bind itself (taken meanwhile). Port 0 lets the
        kernel pick a free port at the bind, so two engines on one host never race for one."""
        if self.port:
            _probe_listen(self.host, self.port)
        loop = asyncio.get_running_loop()
        # Model loading is blocking I/O and compute: keep the event loop free meanwhile.
        self.engine = await loop.run_in_executor(None, lambda: EmbeddedEngine(self.model_dir, **self.engine_kw))
        await self.engine.start()
        # handler_cancellation: a client that hangs up aborts its request (vLLM's with_cancellation).
        if self.served_log_path is not None:
            self._served = ServedLog(self.served_log_path)
        self._runner = web.AppRunner(build_app(self.engine, served_log=self._served), access_log=None,
                                     handler_cancellation=True)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self.host, self.port).start()
        except OSError as exc:
            await self.stop()
            raise ListenFailed(self.host, self.port, exc.strerror or str(exc)) from None
        self.port = int(self._runner.addresses[0][1])
        return self.url

    async def stop(self) -> None:
        if self.engine is not None:
            await self.engine.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._served is not None:
            self._served.close()
            self._served = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


@asynccontextmanager
async def embedded_server(model_dir: str | Path, **kw: Any) -> AsyncIterator[str]:
    """Serve ``model_dir`` on 127.0.0.1 at a free port; yields the base URL; stops everything on exit."""
    server = EmbeddedServer(model_dir, **kw)
    try:
        yield await server.start()
    finally:
        await server.stop()


__all__ = ["EmbeddedServer", "SamplingParams", "ServedLog", "build_app", "embedded_server", "render_reply"]
