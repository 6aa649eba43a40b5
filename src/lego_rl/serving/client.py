"""One async client for vLLM's token-in/token-out API, spoken to real vLLM and to lego's embedded engine.

Routing: a session (``session_id``) sticks to the replica that served it first, so that replica's prefix
cache keeps paying off; a new session goes to the replica with the fewest requests in flight from this
client. Connection failures (refused, reset, 502/503/504) are retried on any replica with exponential
backoff until ``retry_deadline_s``; a 4xx is the caller's fault and is raised at once (``EngineRejected``).
Replies are validated strictly by ``validate.parse_reply``.

Weight updates use vLLM's RL routes, which the embedded engine answers too: ``/pause?mode=keep``, then
``/collective_rpc`` ``reload_weights(weights_path=...)``, ``/update_weight_version``, ``/resume``. vLLM
needs ``VLLM_SERVER_DEV_MODE=1`` for ``/collective_rpc`` (see ``vllm_launch.py``).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Any, Self

import aiohttp

from lego_rl.serving.errors import EngineFailed, EngineRejected, EngineUnavailable, InvalidReply
from lego_rl.serving.protocol import GenerateResult, SamplingParams
from lego_rl.serving.validate import parse_reply, parse_version

log = logging.getLogger(__name__)

GENERATE_PATH = "/inference/v1/generate"
ABORT_PATH = "/inference/v1/abort_requests"
VLLM_ID_PREFIX = "generate-tokens-"
_RETRY_STATUS = {502, 503, 504}


class ServingClient:
    """Async client over one or more engine replicas (base URLs like ``http://127.0.0.1:8000``).

    ``vocab_size`` enables the out-of-vocabulary check on output ids (pass ``len(tokenizer)``).
    Use as ``async with ServingClient([...]) as client`` or call ``close()``.
    """

    def __init__(
        self,
        base_urls: list[str],
        *,
        vocab_size: int | None = None,
        request_timeout_s: float = 600.0,
        retry_deadline_s: float = 30.0,
        backoff_initial_s: float = 0.05,
        backoff_max_s: float = 2.0,
        api_key: str | None = None,
        model: str | None = None,
        max_sticky_sessions: int = 100_000,
    ) -> None:
        if not base_urls:
            raise ValueError("ServingClient needs at least one base URL")
        self.base_urls = [u.rstrip("/") for u in base_urls]
        self.vocab_size = vocab_size
        self.request_timeout_s = request_timeout_s
        self.retry_deadline_s = retry_deadline_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.model = model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._inflight: dict[str, int] = dict.fromkeys(self.base_urls, 0)
        self._sticky: OrderedDict[str, str] = OrderedDict()
        self._max_sticky = max_sticky_sessions
        self._request_replica: dict[str, str] = {}
        self._active: set[str] = set()
        self._aborted: set[str] = set()
        self._rr = 0
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            # limit=0: the engine, not the connection pool, decides how many requests run at once.
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), headers=self._headers
            )
        return self._http

    # -- routing ---------------------------------------------------------------------------------

    def replica_for(self, session_id: str | None, *, avoid: set[str] | frozenset[str] = frozenset()) -> str:
        """The replica a request of ``session_id`` goes to (sticky; least loaded for new sessions)."""
        if session_id is not None:
            url = self._sticky.get(session_id)
            if url is not None and url not in avoid:
                self._sticky.move_to_end(session_id)
                return url
        candidates = [u for u in self.base_urls if u not in avoid] or self.base_urls
        least = min(self._inflight[u] for u in candidates)
        tied = [u for u in candidates if self._inflight[u] == least]
        self._rr += 1
        url = tied[self._rr % len(tied)]
        if session_id is not None:
            self._sticky[session_id] = url
            self._sticky.move_to_end(session_id)
            while len(self._sticky) > self._max_sticky:
                self._sticky.popitem(last=False)
        return url

    def inflight(self) -> dict[str, int]:
        """Requests in flight per replica, from this client."""
        return dict(self._inflight)

    # -- generate --------------------------------------------------------------------------------

    async def generate(
        self,
        token_ids: list[int],
        sampling: SamplingParams,
        *,
        session_id: str | None = None,
        request_id: str | None = None,
        return_nucleus: bool = False,
        return_routed_experts: bool = False,
    ) -> GenerateResult:
        """Generate from ``token_ids``; the result is validated (see ``validate.parse_reply``)."""
        rid = request_id or f"lego-{uuid.uuid4().hex}"
        params = sampling.model_dump(exclude_none=True)
        params["logprobs"] = max(int(params.get("logprobs") or 0), 0)  # we always need the sampled one
        body: dict[str, Any] = {"request_id": rid, "token_ids": token_ids, "sampling_params": params}
        if self.model:
            body["model"] = self.model
        if return_nucleus:
            body["return_sampling_mask"] = True  # lego extension; vLLM ignores unknown top-level fields
        deadline = asyncio.get_running_loop().time() + self.retry_deadline_s
        self._active.add(rid)
        try:
            return await self._generate_loop(rid, body, token_ids, session_id, set(), deadline,
                                             return_nucleus, return_routed_experts)
        finally:
            self._active.discard(rid)
            self._aborted.discard(rid)

    async def _generate_loop(self, rid: str, body: dict[str, Any], token_ids: list[int], session_id: str | None,
                             avoid: set[str], deadline: float, return_nucleus: bool,
                             return_routed_experts: bool) -> GenerateResult:
        loop = asyncio.get_running_loop()
        attempt = 0
        while True:
            if rid in self._aborted:  # aborted while waiting to retry: it never reached an engine
                return GenerateResult(output_ids=[], logprobs=[], finish_reason="abort")
            url = self.replica_for(session_id, avoid=avoid)
            self._inflight[url] += 1
            self._request_replica[rid] = url
            try:
                data = await self._post_once(url, GENERATE_PATH, body)
            except _Retryable as exc:
                avoid.add(url)
                attempt += 1
                if loop.time() >= deadline:
                    raise EngineUnavailable(
                        f"generate {rid}: no replica answered within {self.retry_deadline_s:.0f}s "
                        f"after {attempt} attempt(s); last error on {url}: {exc}",
                        url=url, attempts=attempt,
                    ) from None
                if len(avoid) >= len(self.base_urls):
                    avoid.clear()  # every replica failed once: try them all again after the backoff
                await asyncio.sleep(min(self.backoff_initial_s * 2 ** (attempt - 1), self.backoff_max_s,
                                        max(deadline - loop.time(), 0.0)))
                continue
            finally:
                self._inflight[url] -= 1
                self._request_replica.pop(rid, None)
            return parse_reply(
                data, vocab_size=self.vocab_size, prompt_len=len(token_ids), want_nucleus=return_nucleus,
                want_routed_experts=return_routed_experts, request_id=rid, url=url,
            )

    async def _post_once(self, url: str, path: str, body: Any, *, params: dict[str, str] | None = None) -> Any:
        timeout = aiohttp.ClientTimeout(total=self.request_timeout_s, sock_connect=10.0)
        try:
            async with self._session().post(url + path, json=body, params=params, timeout=timeout) as resp:
                text = await resp.text()
                status = resp.status
        except (aiohttp.ClientConnectionError, ConnectionError) as exc:
            raise _Retryable(f"{type(exc).__name__}: {exc}") from None
        except TimeoutError:
            # A whole-request timeout is not retried: the engine may still be working on it.
            raise EngineUnavailable(f"{url}{path} did not answer within {self.request_timeout_s:.0f}s",
                                    url=url) from None
        if status in _RETRY_STATUS:
            raise _Retryable(f"HTTP {status}: {text[:200]}")
        data = _json_or_none(text)
        if status >= 400:
            err = data.get("error") if isinstance(data, dict) else None
            if isinstance(err, dict):
                message, param = str(err.get("message")), err.get("param")
            else:
                message, param = (str(data.get("detail")) if isinstance(data, dict) else text[:500]), None
            if status >= 500:
                raise EngineFailed(f"{url}{path} answered {status}: {message}", status=status, body=data)
            raise EngineRejected(f"{url}{path} answered {status}: {message}", status=status, param=param,
                                 body=data)
        if data is None and text.strip():
            raise InvalidReply(f"{url}{path} answered {status} with non-JSON body {text[:200]!r}", url=url)
        return data

    # -- control routes --------------------------------------------------------------------------

    async def _each(self, method: str, path: str, body: Any = None, params: dict[str, str] | None = None,
                    urls: list[str] | None = None) -> dict[str, Any]:
        async def one(url: str) -> Any:
            if method == "GET":
                return await self._get(url, path)
            try:
                return await self._post_once(url, path, body if body is not None else {}, params=params)
            except _Retryable as exc:
                raise EngineUnavailable(f"{url}{path}: {exc}", url=url) from None

        targets = urls or self.base_urls
        results = await asyncio.gather(*(one(u) for u in targets))
        return dict(zip(targets, results, strict=True))

    async def _get(self, url: str, path: str) -> Any:
        timeout = aiohttp.ClientTimeout(total=30.0, sock_connect=10.0)
        try:
            async with self._session().get(url + path, timeout=timeout) as resp:
                text = await resp.text()
                if resp.status >= 400:
                    raise EngineRejected(f"{url}{path} answered {resp.status}: {text[:300]}", status=resp.status)
                return _json_or_none(text)
        except (TimeoutError, aiohttp.ClientConnectionError, ConnectionError) as exc:
            raise EngineUnavailable(f"{url}{path}: {type(exc).__name__}: {exc}", url=url) from None

    async def health(self) -> dict[str, bool]:
        """``GET /health`` on every replica: True where it answered 200."""
        async def one(url: str) -> bool:
            try:
                async with self._session().get(url + "/health", timeout=aiohttp.ClientTimeout(total=10)) as r:
                    return r.status == 200
            except (TimeoutError, aiohttp.ClientError, ConnectionError):
                return False

        results = await asyncio.gather(*(one(u) for u in self.base_urls))
        return dict(zip(self.base_urls, results, strict=True))

    async def abort(self, request_ids: list[str]) -> None:
        """Abort requests by id; each goes to the replica serving it (all replicas when unknown).

        The aborted ``generate`` call returns normally with ``finish_reason="abort"`` and the ids
        sampled so far. vLLM names a generate request ``generate-tokens-<request_id>`` inside its
        engine and aborts by that name, so both spellings are sent (an unknown id is a no-op).
        """
        by_url: dict[str, list[str]] = {}
        self._aborted.update(r for r in request_ids if r in self._active)
        for rid in request_ids:
            targets = [self._request_replica[rid]] if rid in self._request_replica else self.base_urls
            for url in targets:
                by_url.setdefault(url, []).extend([rid, f"{VLLM_ID_PREFIX}{rid}"])
        await asyncio.gather(*(self._each("POST", ABORT_PATH, {"request_ids": ids}, urls=[u])
                               for u, ids in by_url.items()))

    async def pause(self, mode: str = "keep") -> None:
        """Pause generation on every replica (``keep``: freeze in-flight requests; ``abort``; ``wait``)."""
        if mode not in ("keep", "abort", "wait"):
            raise ValueError(f"pause mode must be keep, abort or wait, got {mode!r}")
        await self._each("POST", "/pause", params={"mode": mode})

    async def resume(self) -> None:
        """Resume generation on every replica."""
        await self._each("POST", "/resume")

    async def update_weights(self, weights_path: str | Path, version: int, *, pause_mode: str = "keep") -> None:
        """Load new weights from a checkpoint directory on every replica and label them ``version``.

        ``pause_mode`` says what happens to requests in flight: ``keep`` freezes them and they continue on
        the new weights (their KV is recomputed: vLLM preempts them when it clears its cache, the embedded
        engine prefills them again), ``wait`` lets them finish on the old weights first (what weight sync
        uses), ``abort`` ends them. Either way every token is produced by exactly one labelled version, and
        the replicas' prefix caches are emptied. The directory must be readable by each replica (same path).
        """
        if version < 0:
            raise ValueError(f"weight version must be >= 0, got {version}")
        await self.pause(pause_mode)
        try:
            await self._each("POST", "/collective_rpc",
                             {"method": "reload_weights", "kwargs": {"weights_path": str(weights_path)}})
            await self._each("POST", "/update_weight_version", {"new_version": str(version)})
        finally:
            await self.resume()

    async def weight_versions(self) -> dict[str, int]:
        """``GET /weight_info`` on every replica, as lego versions."""
        raw = await self._each("GET", "/weight_info")
        return {u: parse_version((d or {}).get("weight_version")) for u, d in raw.items()}

    async def weight_version(self) -> int:
        """The weight version all replicas serve; raises if they disagree."""
        versions = await self.weight_versions()
        distinct = set(versions.values())
        if len(distinct) != 1:
            raise InvalidReply(f"replicas serve different weight versions: {versions}")
        return distinct.pop()


class _Retryable(Exception):
    """Internal: a failure worth trying again (connection trouble, 502/503/504)."""


def _json_or_none(text: str) -> Any:
    import json

    try:
        return json.loads(text) if text.strip() else None
    except ValueError:
        return None
