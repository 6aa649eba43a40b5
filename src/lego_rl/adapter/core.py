"""The adapter core: one model turn, whatever the wire protocol.

Front ends call ``AdapterCore.run_turn(session, request)`` with a ``CanonicalRequest`` and render the
returned ``CanonicalResponse`` in their protocol (JSON or SSE). One turn is:

1. wait for any turn still running on the same chain of the session, then admit the request
   (closed, failed or over-limit sessions are refused);
2. fold split assistant items into one message, restore parallel tool results to call order (by id),
   and merge template kwargs
   (operator defaults < client's ``template_kwargs``/``reasoning_effort`` < the session's per-sample kwargs);
3. plan the prompt: bridged from the previous turn's exact ids when the history is an unchanged
   extension, else a full render (``lego_rl.chat.prefix``);
4. clamp max output tokens to what is left of the context window; when nothing is left, answer with
   ``stop="context_limit"`` without calling the engine;
5. call the engine (``generate``) with ``logprobs=1`` and validate the reply: a count mismatch, a
   non-finite logprob or an unknown id fails the request with ``ProviderError`` and marks the session
   as an infrastructure failure;
6. end the output at the first client stop sequence (``lego_rl.adapter.stops``: the text is cut before
   it, the recorded tokens end with the one that completes it);
7. parse reasoning and tool calls from the sampled ids, record a ``TurnRecord``, remember the turn for
   the next bridge, and return the response.

For prefix reuse to match, the echoed assistant turn must carry the tool-call ids this core issued
(``CanonicalResponse.tool_calls[i].id``) and its visible text; arguments and reasoning may differ.
The engine call is not streamed: front ends emit their SSE events from the finished response.

Concurrent requests on one chain (the main chain, or one side label) of a session are serialised, not
refused: a client that sends its next request before the previous answer arrived (a retry after a
cut-off stream, a CLI firing two calls at once) gets each answered in arrival order, and the later one
is planned against the chain as the earlier one left it, so both cannot claim the same place on the
main chain. Different chains of a session (a title request beside the main turn) run concurrently.
A request identical to one already answered on its chain (same history, tools and template kwargs) is
still answered, and its record says which turn it repeats (``TurnRecord.repeat_of``).
Errors are raised, never returned: ``ProtocolError`` (client's fault, 4xx) and ``ProviderError``
(engine's fault, 5xx); the HTTP edge maps them into the protocol's error shape.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from lego_rl.adapter.canonical import CanonicalRequest, CanonicalResponse, StopKind
from lego_rl.adapter.sessions import Session
from lego_rl.adapter.stops import StopMatch, find_stop, keep_prefix
from lego_rl.chat.messages import Message
from lego_rl.chat.parsers import ParsedTurn, merge_assistant_runs, new_call_id, restore_tool_order
from lego_rl.chat.prefix import ChainState, PrefixBridge, PromptPlan
from lego_rl.chat.render import ChatRenderer, RenderError
from lego_rl.chat.turn_parser import BuiltinTurnParser, TurnParser
from lego_rl.errors import ProtocolError, ProviderError
from lego_rl.serving.output_checks import check_output
from lego_rl.serving.protocol import GenerateResult, SamplingParams
from lego_rl.trajectory.records import TurnRecord

log = logging.getLogger(__name__)
_T = TypeVar("_T")


class GenerateBackend(Protocol):
    """What the core needs from the serving client (``lego_rl.serving.client.ServingClient`` fits)."""

    async def generate(
        self, token_ids: list[int], params: SamplingParams, *, session_id: str | None = None
    ) -> GenerateResult:
        """Sample from ``token_ids``. The core also passes ``return_nucleus=True`` /
        ``return_routed_experts=True`` when ``SamplingDefaults`` asks for them (and only then)."""
        ...


@dataclass
class SamplingDefaults:
    """Sampling for training turns. Client-sent temperature/top_p/top_k are ignored unless
    ``honour_client`` is set, because the rollout policy, not the CLI, decides how tokens are sampled."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    honour_client: bool = False
    nucleus: bool = False
    """Ask the engine for the top-p nucleus of every token (kept on the turn record); a reply without it
    fails the request."""
    routed_experts: bool = False
    """Ask the engine for MoE routing (R3 replay); kept on the turn record."""
    engine_stop_strings: bool = False
    """Also send client stop sequences to the engine (vLLM's ``stop``; it matches them on its own
    detokenized output, so not with ``--skip-tokenizer-init``) so sampling ends there instead of running
    on to the end of the message. Off by default because lego's embedded engine refuses ``stop`` with a
    400. The adapter cuts the output at the stop sequence either way, and an engine that stopped on the
    string returns exactly the tokens the cut keeps, so both paths record the same thing."""


_CALL_PREFIX = {"anthropic": "toolu_", "responses": "call_", "chat": "call_"}


class AdapterCore:
    """Runs turns for every session of one served model.

    ``max_context_tokens`` is the model's window (prompt + output tokens); ``max_response_tokens`` caps
    one call's output (``--rollout-max-response-len``). Sessions may lower both. ``render_threads``: the
    render pool's size (default: the CPU count, at most 8). ``parser`` reads the sampled turns (vLLM's parsers
    or the built-in ones: ``chat.turn_parser.make_turn_parser``).
    """

    def __init__(
        self,
        renderer: ChatRenderer,
        backend: GenerateBackend,
        *,
        max_context_tokens: int,
        max_response_tokens: int = 8192,
        parser: TurnParser | None = None,
        sampling: SamplingDefaults | None = None,
        model_name: str = "lego",
        model_aliases: Sequence[str] = (),
        verify_bridges: bool = False,
        render_threads: int | None = None,
    ) -> None:
        if max_context_tokens <= 0 or max_response_tokens <= 0:
            raise ValueError(
                f"max_context_tokens ({max_context_tokens}) and max_response_tokens ({max_response_tokens}) "
                "must be positive"
            )
        self.renderer = renderer
        self.backend = backend
        self.bridge = PrefixBridge(renderer, verify=verify_bridges)
        self.max_context_tokens = max_context_tokens
        self.max_response_tokens = max_response_tokens
        self.parser: TurnParser = parser or BuiltinTurnParser()
        """Reads sampled turns (``chat.turn_parser``); default: the built-in parsers, calls in either format."""
        self.sampling = sampling or SamplingDefaults()
        self.model_name = model_name
        self.known_models = frozenset({model_name, *model_aliases})
        """Names a request may carry without a warning (``adapter.model_aliases`` plus the served name)."""
        self._chain_locks: dict[tuple[str, str | None], _ChainLock] = {}
        self._render_pool = ThreadPoolExecutor(max_workers=render_threads or min(8, os.cpu_count() or 1),
                                               thread_name_prefix="lego-render")

    def template_kwargs(self, session: Session | None, req: CanonicalRequest) -> dict[str, Any]:
        """Kwargs for this turn: operator defaults < client's < the session's per-sample kwargs."""
        client = dict(req.template_kwargs)
        if req.reasoning_effort:
            client["reasoning_effort"] = req.reasoning_effort
        return self.renderer.merged_kwargs(client, session.template_kwargs if session else None)

    def count_tokens(self, session: Session | None, req: CanonicalRequest) -> int:
        """Prompt length of a full render of ``req`` (for ``count_tokens``; records nothing)."""
        messages = restore_tool_order(merge_assistant_runs(req.messages))
        try:
            return len(self.renderer.render_ids(messages, req.tools, self.template_kwargs(session, req)))
        except RenderError as exc:
            raise ProtocolError(f"cannot render this request with the model's chat template: {exc}") from exc

    def window(self, session: Session | None) -> int:
        """Prompt plus output tokens one call of ``session`` may use: the core's window, or the session's
        smaller one."""
        limit = session.max_context_tokens if session is not None else None
        return min(self.max_context_tokens, limit or self.max_context_tokens)

    def too_long(self, session: Session | None, messages: Sequence[Message], req: CanonicalRequest) -> int | None:
        """A lower bound on the prompt tokens of a request whose text alone cannot fit the context window
        (checked before any rendering, so a 10 MiB message costs no tokenisation and records no ids); None when
        it may fit."""
        window = self.window(session)
        floor = self.renderer.min_prompt_tokens(messages, req.tools)
        return floor if floor >= window else None

    async def in_render_pool(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` on the core's own render threads (rendering and tokenising: CPU work that releases
        the GIL in Rust). Not the loop's default pool: there, a burst of long renders would queue the
        record fsyncs that hold every answer, and the decoding of a 10 MiB body that a size check would
        refuse at once, behind seconds of other sessions' renders."""
        return await asyncio.get_running_loop().run_in_executor(self._render_pool, functools.partial(fn, *args))

    def refuse_if_failed(self, session: Session) -> None:
        """Refuse a request on a session the engine already failed, as the outage it was.

        503 (the protocols' overloaded / server error), not the session's own refusal (403): Claude Code
        words a 403 as "Failed to authenticate", OpenCode's retries would end on it, and every CLI's
        error then names an engine failure, which the harnesses classify as the adapter's, not the
        policy's. The HTTP edge calls this before it starts a stream, so the status reaches the client
        as an HTTP status (OpenCode reads an error inside a 200 stream as ``UnknownError``)."""
        if session.state == "open" and session.infra_failure is not None:
            raise ProviderError(
                f"session {session.id!r} already failed ({session.infra_failure}); no further requests are "
                "served", status_code=503,
            )

    async def run_turn(self, session: Session, req: CanonicalRequest) -> CanonicalResponse:
        """Run one model turn for ``session``; see the module docstring for the steps."""
        async with self._serialised(session.id, req.side_label):
            return await self._run_turn(session, req)

    @asynccontextmanager
    async def _serialised(self, session_id: str, label: str | None) -> AsyncIterator[None]:
        """Hold the lock of one chain of one session; the entry is dropped when nobody holds or waits."""
        key = (session_id, label)
        entry = self._chain_locks.get(key)
        if entry is None:
            entry = self._chain_locks[key] = _ChainLock()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._chain_locks[key]

    async def _run_turn(self, session: Session, req: CanonicalRequest) -> CanonicalResponse:
        clock = _Clock()
        messages = self._admit(session, req)
        chain = session.chain(req.side_label)
        floor = self.too_long(session, messages, req)
        if floor is not None:
            return self._refuse_unrendered(session, req, floor)
        plan = await self._plan(session, req, chain, messages, clock)
        repeat_of = self._repeat_of(session, req, chain, plan)
        remaining = self.window(session) - len(plan.prompt_ids)
        cap = self._output_cap(session, req)
        if remaining <= 0 or cap <= 0:
            if remaining <= 0:
                session.termination = "context_limit"
            return self._no_call(
                session, req, plan, clock, "context_limit" if remaining <= 0 else "max_tokens", repeat_of
            )
        params = self._sampling_params(req, min(cap, remaining))
        result, versions = await self._generate(session, plan, params, clock)
        turn = self._read_output(req, result, versions, plan, self.template_kwargs(session, req))
        if turn.stop == "max_tokens" and params.max_tokens == remaining:
            session.termination = "context_limit"  # the window, not the cap, cut this output short
        self._commit(session, req, chain, plan, clock, turn, repeat_of)
        return CanonicalResponse(
            id=_response_id(req),
            model=req.model or self.model_name,
            text=turn.parsed.text,
            reasoning=turn.parsed.reasoning,
            tool_calls=turn.parsed.tool_calls,
            stop=turn.stop,
            stop_sequence=turn.matched.sequence if turn.matched and turn.stop == "stop_sequence" else None,
            prompt_tokens=len(plan.prompt_ids),
            completion_tokens=len(turn.result.output_ids),
            parse_failures=turn.parsed.parse_failures,
        )

    def _admit(self, session: Session, req: CanonicalRequest) -> list[Message]:
        """Admit the request on its session (checked again once the chain is ours: a request that waited
        behind the failing turn is refused); its messages, split assistant items folded, tool results in call
        order."""
        self.refuse_if_failed(session)
        session.admit_request()
        self._notice_model(session, req)
        messages = restore_tool_order(merge_assistant_runs(req.messages))
        if not messages:
            raise ProtocolError("the request has no messages", param="messages")
        return messages

    def _refuse_unrendered(self, session: Session, req: CanonicalRequest, floor: int) -> CanonicalResponse:
        """The answer to a request whose text alone is over the window: the same as a window used up after
        rendering (a context_limit stop, no engine call), so every CLI ends the way it does on a full window;
        nothing is recorded: no ids were made, none to train."""
        session.termination = "context_limit"
        log.warning("adapter: session %s: request text alone is at least %d tokens, over the context window; "
                    "answered with a context_limit stop before rendering", session.id, floor)
        return CanonicalResponse(id=_response_id(req), model=req.model or self.model_name, stop="context_limit",
                                 prompt_tokens=floor, context_window=self.window(session))

    async def _plan(self, session: Session, req: CanonicalRequest, chain: ChainState, messages: list[Message],
                    clock: _Clock) -> PromptPlan:
        """The turn's prompt (bridged or rendered), on the render pool; a template that cannot render it is the
        client's error."""
        try:
            plan = await self.in_render_pool(self.bridge.plan, chain, messages, req.tools,
                                             self.template_kwargs(session, req))
        except RenderError as exc:
            raise ProtocolError(f"cannot render this request with the model's chat template: {exc}") from exc
        clock.render_s = clock.elapsed()
        return plan

    def _repeat_of(self, session: Session, req: CanonicalRequest, chain: ChainState, plan: PromptPlan) -> int | None:
        """The answered turn this request repeats (None when new), logged: it is answered and recorded again."""
        repeat_of = _repeated_turn(chain, plan)
        if repeat_of is not None:
            log.warning(
                "adapter: session %s: request repeats turn %d on chain %s (the client sent it again, "
                "e.g. a stream retry); answered and recorded with repeat_of=%d",
                session.id, repeat_of, req.side_label or "main", repeat_of,
            )
        return repeat_of

    def _output_cap(self, session: Session, req: CanonicalRequest) -> int:
        """Output tokens this call may sample before the window is counted: the adapter's cap, the session's,
        and the client's ``max_tokens``, the smallest."""
        cap = min(self.max_response_tokens, session.max_response_tokens or self.max_response_tokens)
        if req.max_tokens is None:
            return cap
        if req.max_tokens > cap and "output_cap" not in session.notices:
            # The client will word a cut at our cap with its own number ("exceeded the 128000 output
            # token maximum" in Claude Code): say once which cap applies and how to tell the client.
            session.notices.add("output_cap")
            log.warning(
                "adapter: session %s: the client asked for up to %d output tokens, this adapter caps a "
                "reply at %d; a client that reports the limit itself names its own number (tell it the "
                "cap, e.g. CLAUDE_CODE_MAX_OUTPUT_TOKENS=%d for Claude Code)",
                session.id, req.max_tokens, cap, cap,
            )
        return min(cap, req.max_tokens)

    def _read_output(self, req: CanonicalRequest, result: GenerateResult, versions: list[int], plan: PromptPlan,
                     kwargs: dict[str, Any]) -> _Output:
        """The sampled output cut at the client's first stop sequence, its reasoning and tool calls parsed, and
        the stop it ends with."""
        prefix = _CALL_PREFIX.get(req.protocol, "call_")
        visible_ids = self.renderer.strip_end_of_message(result.output_ids)
        visible = self.renderer.decode(visible_ids)
        matched = find_stop(visible_ids, visible, req.stop, self.renderer.decode) if req.stop else None
        if matched is not None:
            result, versions = keep_prefix(result, matched.n_tokens), versions[: matched.n_tokens]
            # The kept ids end with the token that completes the stop text, the text ends before it: the
            # parser gets the text alone (vLLM's parsers read ids where they are given, and these would lie).
            visible, visible_ids = matched.text, []
        parsed = self.parser.parse(visible, req.tools, new_id=lambda: new_call_id(prefix), template_kwargs=kwargs,
                                   prompt_ids=plan.prompt_ids, output_ids=visible_ids)
        stop: StopKind = "end_turn"
        if parsed.tool_calls:
            stop = "tool_use"  # complete calls before a stop sequence must still be answered by the client
        elif matched is not None:
            stop = "stop_sequence"
        elif result.finish_reason == "length":
            stop = "max_tokens"
        return _Output(result=result, versions=versions, parsed=parsed, matched=matched, stop=stop)

    def _commit(self, session: Session, req: CanonicalRequest, chain: ChainState, plan: PromptPlan,
                clock: _Clock, turn: _Output, repeat_of: int | None) -> None:
        """Record the turn on the session and remember it on its chain for the next turn's bridge."""
        record = self._record(session, req, plan, clock, turn.stop, result=turn.result, versions=turn.versions)
        record.parse_failures, record.tool_calls = turn.parsed.parse_failures, len(turn.parsed.tool_calls)
        record.repeat_of = repeat_of
        session.records.append(record)
        # The chain node shares the record's id lists: long sessions keep one copy of each prompt.
        plan.prompt_ids = record.prompt_ids
        # An output cut at a stop sequence lacks the end-of-message token, so the bridge will not
        # extend it: the next turn is rendered from the echoed (cut) text and starts a new segment.
        self.bridge.commit(
            chain,
            plan,
            record.output_ids,
            stopped=turn.result.finish_reason == "stop",
            reply_text=turn.parsed.text,
            reply_calls=turn.parsed.tool_calls,
            turn=record.turn,
        )

    def _notice_model(self, session: Session, req: CanonicalRequest) -> None:
        """Log, once per session, a model name that is neither the served model nor an alias: the served
        model answers anyway, but a CLI configured for another model is usually a setup mistake."""
        if not req.model or req.model in self.known_models or "model:" + req.model in session.notices:
            return
        session.notices.add("model:" + req.model)
        log.warning(
            "adapter: session %s: request names model %r, not the served model %r; the served model answers "
            "it (add the name to adapter.model_aliases if it is expected)",
            session.id, req.model, self.model_name,
        )

    async def _generate(
        self, session: Session, plan: PromptPlan, params: SamplingParams, clock: _Clock
    ) -> tuple[GenerateResult, list[int]]:
        """Call the engine and validate its reply; any failure marks the session (infrastructure)."""
        extras: dict[str, bool] = {}
        if self.sampling.nucleus:
            extras["return_nucleus"] = True
        if self.sampling.routed_experts:
            extras["return_routed_experts"] = True
        t_engine = time.perf_counter()
        try:
            result = await self.backend.generate(plan.prompt_ids, params, session_id=session.id, **extras)
            self._validate(result, params)
            versions = _versions(result)
        except ProviderError as exc:
            session.mark_infra_failure(f"engine: {exc}")
            raise
        clock.engine_s = time.perf_counter() - t_engine
        return result, versions

    # -- helpers -------------------------------------------------------------------------------------

    def _sampling_params(self, req: CanonicalRequest, max_tokens: int) -> SamplingParams:
        s = self.sampling
        use_client = s.honour_client
        # vLLM's own ``stop`` field (SamplingParams passes unknown fields through); only when asked for.
        engine_stop: dict[str, Any] = {"stop": list(req.stop)} if s.engine_stop_strings and req.stop else {}
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=req.temperature if use_client and req.temperature is not None else s.temperature,
            top_p=req.top_p if use_client and req.top_p is not None else s.top_p,
            top_k=req.top_k if use_client and req.top_k is not None else s.top_k,
            stop_token_ids=sorted(self.renderer.eos_ids),
            logprobs=1,
            skip_special_tokens=False,
            **engine_stop,
        )

    def _validate(self, result: GenerateResult, params: SamplingParams) -> None:
        """Refuse a reply we could not train on (the serving client checks too; this is the last gate, with the
        same checks: ``serving.output_checks``)."""
        n = len(result.output_ids)
        if n == 0:
            raise ProviderError("engine returned no output tokens")
        if n > params.max_tokens:
            raise ProviderError(f"engine returned {n} tokens, more than max_tokens={params.max_tokens}")
        if self.sampling.nucleus and result.nucleus is None:
            raise ProviderError(f"engine returned no usable nucleus (none for {n} output tokens)")
        if self.sampling.routed_experts and result.routed_experts is None:
            raise ProviderError(f"engine returned no usable routed_experts (none for {n} output tokens)")
        nucleus = result.nucleus if self.sampling.nucleus else None
        check_output(result.output_ids, result.logprobs, vocab_size=self.renderer.vocab_size,
                     nucleus=None if nucleus is None else ([e.ids for e in nucleus], [e.probs for e in nucleus]),
                     routed_experts=result.routed_experts if self.sampling.routed_experts else None)

    def _no_call(self, session: Session, req: CanonicalRequest, plan: PromptPlan, clock: _Clock, stop: StopKind,
                 repeat_of: int | None) -> CanonicalResponse:
        """Answer without calling the engine: the context window (or the output cap) is used up."""
        record = self._record(session, req, plan, clock, stop)
        record.repeat_of = repeat_of
        session.records.append(record)
        return CanonicalResponse(
            id=_response_id(req),
            model=req.model or self.model_name,
            stop=stop,
            prompt_tokens=len(plan.prompt_ids),
            context_window=self.window(session) if stop == "context_limit" else None,
        )

    def _record(
        self,
        session: Session,
        req: CanonicalRequest,
        plan: PromptPlan,
        clock: _Clock,
        stop: StopKind,
        *,
        result: GenerateResult | None = None,
        versions: list[int] | None = None,
    ) -> TurnRecord:
        """The turn record; without ``result`` the turn made no engine call (empty output)."""
        nucleus = result.nucleus if result is not None else None
        return TurnRecord(
            session_id=session.id,
            turn=len(session.records),
            kind="side" if req.side_label else "main",
            side_label=req.side_label,
            protocol=req.protocol,
            prompt_ids=plan.prompt_ids,
            output_ids=result.output_ids if result is not None else [],
            logprobs=result.logprobs if result is not None else [],
            render_mode=plan.mode,
            bridge_prefix_len=plan.bridge_prefix_len,
            bridge_from_turn=plan.bridge_from_turn,
            fallback_reason=plan.fallback_reason,
            finish_reason=result.finish_reason if result is not None else stop,
            stop_reason=stop,
            weight_versions=versions or [],
            nucleus_ids=[e.ids for e in nucleus] if nucleus is not None else None,
            nucleus_probs=[e.probs for e in nucleus] if nucleus is not None else None,
            routed_experts=result.routed_experts if result is not None else None,
            prompt_routed_experts=result.prompt_routed_experts if result is not None else None,
            started_at=clock.started,
            render_s=clock.render_s,
            engine_s=clock.engine_s,
            total_s=clock.elapsed(),
            text=self.renderer.decode(result.output_ids) if result is not None else "",
        )


@dataclass
class _ChainLock:
    """The lock of one session chain and how many requests hold or wait for it."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


@dataclass
class _Output:
    """One sampled output as the turn answers it: cut at a stop sequence (``matched``), parsed, its stop."""

    result: GenerateResult
    versions: list[int]
    parsed: ParsedTurn
    matched: StopMatch | None
    stop: StopKind


def _repeated_turn(chain: ChainState, plan: PromptPlan) -> int | None:
    """The latest answered turn of ``chain`` whose request was exactly this one (None when none was).

    Compared by the bridge's own identities: the hash of the whole history, the tool schemas and the
    template kwargs. Turns answered without an engine call are not in the chain and are not matched."""
    n_messages = len(plan.history_hashes) - 1
    for node in reversed(chain.nodes):
        if (node.n_messages == n_messages and node.history_hash == plan.history_hashes[-1]
                and node.tools_key == plan.tools_key and node.kwargs_key == plan.kwargs_key):
            return node.turn
    return None


@dataclass
class _Clock:
    """Timings of one turn (wall-clock start, then monotonic durations)."""

    started: float = field(default_factory=time.time)
    t0: float = field(default_factory=time.perf_counter)
    render_s: float = 0.0
    engine_s: float = 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0


def _versions(result: GenerateResult) -> list[int]:
    if not result.weight_versions:
        return []
    out = [result.version_of(i) for i in range(len(result.output_ids))]
    if any(v is None for v in out):
        raise ProviderError("engine weight_versions do not cover every output token")
    return [v for v in out if v is not None]


def _response_id(req: CanonicalRequest) -> str:
    prefix = {"anthropic": "msg_", "responses": "resp_", "chat": "chatcmpl-"}.get(req.protocol, "")
    return prefix + secrets.token_hex(12)


__all__: Sequence[str] = ("AdapterCore", "GenerateBackend", "SamplingDefaults")
