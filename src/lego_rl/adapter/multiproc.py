"""Several standalone adapter processes behind one port, each session held by exactly one of them.

One adapter process does all of its Python work (HTTP, JSON, chat templates, records) under one GIL;
``lego adapter --workers N`` runs N worker processes (each a whole standalone adapter: core, sessions,
record journal) listening on Unix sockets in a private folder, and a front process on the public port
that only moves bytes. A session's state (its bridging chains, its records, its chain locks) lives in
one worker, so every request of a session must reach that worker: the front takes the session key the
same way the server does (the ``/s/{session}/`` path prefix, else the bearer token, else ``x-api-key``)
and sends the request to worker ``owner(key, N)``, a fixed hash. Sessions named with ``--session`` are
opened by their owner only. ``SO_REUSEPORT`` alone would spread connections, not sessions.

The front streams bodies both ways (a 10 MiB request is forwarded as it arrives, its Content-Length
kept, so the worker answers 413 in the protocol's shape; SSE keepalives pass as they are written) and
parses nothing. All workers write records into the same ``--open-sessions`` folder: files are per
session, so they never share one. If a worker dies the front stops every worker and exits 1 (the
records of answered turns are on disk already); nothing is restarted behind the operator's back. If
the front dies (even ``kill -9``), each worker notices within ``PARENT_POLL_S`` and stops, saving its
sessions' status.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from lego_rl.adapter.server import SESSION_PREFIX, header_token, log_event
from lego_rl.adapter.standalone import LISTEN_BACKLOG, StandaloneOptions, check_options, owner

log = logging.getLogger(__name__)

HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "host",
                         "proxy-connection", "proxy-authenticate", "proxy-authorization", "trailer"})
"""Hop-by-hop headers (RFC 9110 7.6.1): they describe one connection and are never forwarded."""
BODY_CHUNK_BYTES = 1024 * 1024
PARENT_POLL_S = 0.5
"""How often a worker checks that its front still lives (its parent pid changes when the front dies)."""
WORKER_START_S = 300.0
"""How long a worker may take to answer /health (it imports transformers and loads the tokenizer)."""


def session_key(path: str, headers: Mapping[str, str]) -> str | None:
    """The session a request names, by the server's rule: ``/s/{session}/`` path prefix, else headers."""
    prefix = SESSION_PREFIX.split("{", 1)[0]  # "/s/"
    if path.startswith(prefix):
        name = path[len(prefix):].split("/", 1)[0]
        if name:
            return name
    return header_token(headers)


class StickyFront:
    """The front process's app: forwards each request to the worker that owns its session."""

    def __init__(self, sockets: Sequence[Path]) -> None:
        if not sockets:
            raise ValueError("StickyFront needs at least one worker socket")
        self.sockets = list(sockets)
        self._clients: list[aiohttp.ClientSession] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        app.on_startup.append(self._open_clients)
        app.on_cleanup.append(self._close_clients)
        return app

    async def _open_clients(self, app: web.Application) -> None:
        # No total timeout: a turn waits on the engine for as long as the engine takes.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        self._clients = [aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(sock), limit=0),
                                               timeout=timeout, auto_decompress=False) for sock in self.sockets]

    async def _close_clients(self, app: web.Application) -> None:
        for client in self._clients:
            await client.close()

    async def _health(self, request: web.Request) -> web.Response:
        """Healthy when every worker is; ``open_sessions`` summed, per worker too."""
        counts: list[int] = []
        for i, client in enumerate(self._clients):
            try:
                async with client.get("http://worker/health") as r:
                    counts.append(int((await r.json())["open_sessions"]))
            except (aiohttp.ClientError, KeyError, ValueError) as exc:
                return web.json_response({"status": "down", "worker": i, "error": str(exc)}, status=503)
        return web.json_response({"status": "ok", "open_sessions": sum(counts), "workers": counts})

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        key = session_key(request.path, request.headers)
        index = owner(key, len(self._clients)) if key else 0  # no key: any worker answers the 401
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        body = request.content.iter_chunked(BODY_CHUNK_BYTES) if request.body_exists else None
        try:
            upstream = await self._clients[index].request(request.method, "http://worker" + request.path_qs,
                                                          headers=headers, data=body, allow_redirects=False)
        except aiohttp.ClientError as exc:
            log_event("worker_unreachable", level=logging.ERROR, worker=index, session=key, error=str(exc))
            return web.json_response({"error": {"type": "api_error", "message": f"adapter worker {index} is "
                                                f"unreachable: {exc}"}}, status=503)
        async with upstream:
            resp = web.StreamResponse(status=upstream.status, reason=upstream.reason,
                                      headers={k: v for k, v in upstream.headers.items()
                                               if k.lower() not in HOP_HEADERS})
            await resp.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():  # SSE keepalives pass as they come
                    await resp.write(chunk)
                await resp.write_eof()
            except ConnectionResetError:
                # The client left: closing the upstream connection tells the worker, which cancels the turn.
                log.info("adapter front: client of session %s disconnected", key)
        return resp


def worker_argv(opts: StandaloneOptions, index: int, workers: int, sock: Path) -> list[str]:
    """The command line of worker ``index``: this module run with its options as JSON."""
    spec = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()}
    spec.update(sessions=list(opts.sessions), worker_index=index, workers=workers, unix_socket=str(sock))
    return [sys.executable, "-m", "lego_rl.adapter.multiproc", json.dumps(spec)]


def options_from_json(text: str) -> StandaloneOptions:
    spec: dict[str, Any] = json.loads(text)
    for name in ("model_dir", "open_sessions", "unix_socket"):
        if spec.get(name) is not None:
            spec[name] = Path(spec[name])
    return StandaloneOptions(**spec)


async def _wait_ready(sock: Path, proc: asyncio.subprocess.Process, index: int) -> None:
    deadline = asyncio.get_running_loop().time() + WORKER_START_S
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(sock))) as http:
        while asyncio.get_running_loop().time() < deadline:
            if proc.returncode is not None:
                raise RuntimeError(f"adapter worker {index} exited with {proc.returncode} while starting")
            with contextlib.suppress(aiohttp.ClientError, FileNotFoundError, ConnectionRefusedError):
                async with http.get("http://worker/health") as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"adapter worker {index} did not answer /health within {WORKER_START_S:g} s")


async def serve_workers(opts: StandaloneOptions, workers: int, *, ready: asyncio.Event | None = None,
                        stop: asyncio.Event | None = None) -> int:
    """Start ``workers`` worker processes and the front on ``opts.host:opts.port``; serve until
    SIGINT/SIGTERM (or ``stop``), then stop the workers (they save their records). The exit code: 0, or 1
    when a worker died on its own."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    check_options(opts)
    folder = Path(tempfile.mkdtemp(prefix="lego-adapter-"))  # private (0700): only we reach the workers
    sockets = [folder / f"worker-{i}.sock" for i in range(workers)]
    procs: list[asyncio.subprocess.Process] = []
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    died: list[int] = []
    runner: web.AppRunner | None = None
    try:
        for i, sock in enumerate(sockets):
            procs.append(await asyncio.create_subprocess_exec(*worker_argv(opts, i, workers, sock)))
        await asyncio.gather(*(_wait_ready(sock, proc, i) for i, (sock, proc) in enumerate(zip(sockets, procs))))
        runner = web.AppRunner(StickyFront(sockets).app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, opts.host, opts.port, backlog=LISTEN_BACKLOG).start()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)

        async def watch(i: int, proc: asyncio.subprocess.Process) -> None:
            code = await proc.wait()
            if not stop.is_set():
                died.append(i)
                log_event("worker_died", level=logging.ERROR, worker=i, pid=proc.pid, returncode=code)
                stop.set()

        watchers = [asyncio.ensure_future(watch(i, p)) for i, p in enumerate(procs)]
        log_event("workers_started", workers=workers, pids=[p.pid for p in procs])
        if ready is not None:
            ready.set()
        await stop.wait()
        for w in watchers:
            w.cancel()
    finally:
        if runner is not None:
            await runner.cleanup()
        for proc in procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)  # each saves its sessions' status on the way out
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), 60)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        shutil.rmtree(folder, ignore_errors=True)
    return 1 if died else 0


async def _serve_worker(opts: StandaloneOptions) -> None:
    """One worker: serve until the front sends SIGTERM, or until the front is gone (killed with -9, it
    could not stop us: a worker left behind would hold its sessions and the records folder)."""
    from lego_rl.adapter.standalone import serve_standalone

    stop = asyncio.Event()
    front = os.getppid()

    async def watch_front() -> None:
        while os.getppid() == front:
            await asyncio.sleep(PARENT_POLL_S)
        log_event("front_gone", level=logging.ERROR, worker=opts.worker_index, front_pid=front)
        stop.set()

    watcher = asyncio.ensure_future(watch_front())
    try:
        await serve_standalone(opts, stop=stop, handle_sigint=False)
    finally:
        watcher.cancel()


def _worker_main(spec: str) -> None:
    from lego_rl.adapter.standalone import log_to_stderr

    log_to_stderr()
    # SIGINT from a terminal reaches the whole process group: the front decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    asyncio.run(_serve_worker(options_from_json(spec)))


if __name__ == "__main__":
    _worker_main(sys.argv[1])


__all__: Sequence[str] = ("StickyFront", "owner", "serve_workers", "session_key")
