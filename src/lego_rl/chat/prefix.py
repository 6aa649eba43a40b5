"""Prefix reuse: build turn n+1's prompt from turn n's exact prompt and sampled ids.

When a client sends back an unchanged history, the prompt of the next turn is

    prompt_ids(n) + output_ids(n) + encode(suffix)

where ``output_ids(n)`` are the ids the engine sampled (reasoning the client dropped included) and
``suffix`` is the template's text after the end of that assistant message: the message boundary's
trailer (e.g. the newline after ``<|im_end|>``), the new tool results / user messages, and the
generation prompt. The training sequence thus continues token for token.

Conditions, each checked (the first that fails is the fallback reason and the turn is fully rendered):
the previous turn's history is a prefix of the new one (assistant messages compared by visible text
and tool-call ids, never by re-serialised arguments or tool names; reasoning ignored), the next message
is an assistant message matching what the previous turn answered, the tool schemas and template kwargs
are unchanged, no assistant message follows it, the previous output ended with the template's
end-of-message token, and the suffix starts with the template's boundary trailer. Two different
previous turns matching equally well is ambiguous and also falls back.

A template that closes assistant messages with nothing (GLM-4.x) has the model stop on the token that opens
the next message (``MessageBoundary.opens_next``): there the sampled stop token is the boundary, the suffix
starts after it, and a turn whose stop token is not the one the template opens the next message with falls back.

The suffix is rendered from a short window (that assistant message plus the new messages) when a probe
at start-up shows the template renders those messages the same way inside the full history; otherwise
the full history's text is rendered (still no tokenisation of the history) and the suffix cut from it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lego_rl.chat.messages import Message, ToolCall, ToolSpec
from lego_rl.chat.render import ChatRenderer, RenderError
from lego_rl.runstore.turns import HISTORY_CHANGED, KWARGS_CHANGED, NO_PREVIOUS_TURN, TOOLS_CHANGED
from lego_rl.trajectory.records import RenderMode

log = logging.getLogger(__name__)


class BridgeMiss(Exception):
    """Prefix reuse is not possible for this turn; the message is the recorded fallback reason."""


def _norm_text(text: str) -> str:
    return " ".join(text.split())


def _field(value: str | None) -> bytes:
    # Length-prefixed so that field boundaries can never be confused; surrogatepass because JSON
    # bodies may carry lone surrogates that plain UTF-8 refuses.
    if value is None:
        return b"\xff"
    data = value.encode("utf-8", "surrogatepass")
    return len(data).to_bytes(8, "little") + data


def message_key(msg: Message) -> bytes:
    """What must be unchanged for a message to count as the same. Assistant messages: visible text
    (whitespace-normalised) and tool-call ids, which we issued and are unique; names, namespaces,
    arguments (clients re-serialise them) and reasoning (clients drop it) are not compared."""
    if msg.role == "assistant":
        parts = [_field("assistant"), _field(_norm_text(msg.content))]
        parts += [_field(call.id) for call in msg.tool_calls]
    else:
        parts = [_field(msg.role), _field(msg.content), _field(msg.tool_call_id), _field(msg.name),
                 b"E" if msg.is_error else b"-"]  # fmt: skip
    return b"".join(parts)


def prefix_hashes(messages: Sequence[Message]) -> list[bytes]:
    """``out[i]`` identifies ``messages[:i]`` (so ``len(out) == len(messages) + 1``)."""
    out = [b""]
    for msg in messages:
        out.append(hashlib.blake2b(out[-1] + message_key(msg), digest_size=16).digest())
    return out


def tools_key(tools: Sequence[ToolSpec]) -> str:
    """Identity of the offered tool schemas (any change disables reuse)."""
    return hashlib.blake2b(
        json.dumps([t.model_dump() for t in tools], sort_keys=True).encode(), digest_size=16
    ).hexdigest()


def kwargs_key(kwargs: Mapping[str, Any]) -> str:
    return json.dumps(kwargs, sort_keys=True, default=str)


@dataclass
class ChainNode:
    """One answered turn that a later turn may extend."""

    n_messages: int
    history_hash: bytes
    tools_key: str
    kwargs_key: str
    prompt_ids: list[int]
    output_ids: list[int]
    ended_cleanly: bool
    """The output ended with the end-of-message token because the model stopped (not truncated)."""
    reply_key: bytes
    """``message_key`` of the assistant message the client should echo for this turn."""
    turn: int | None = None
    """The session's turn number of this answer (``TurnRecord.turn``), when known."""


@dataclass
class ChainState:
    """The answered turns of one chain (a session's main chain, or one side label)."""

    nodes: list[ChainNode] = field(default_factory=list)


@dataclass
class PromptPlan:
    """The prompt for one turn and how it was made."""

    prompt_ids: list[int]
    mode: RenderMode
    bridge_prefix_len: int = 0
    bridge_from_turn: int | None = None
    """Turn number of the answer whose prompt+output ids were copied (bridged plans)."""
    fallback_reason: str | None = None
    history_hashes: list[bytes] = field(default_factory=list)
    tools_key: str = ""
    kwargs_key: str = ""


class PrefixBridge:
    """Plans each turn's prompt (bridged or full) and remembers answered turns in a ``ChainState``.

    ``verify=True`` additionally renders the whole history for every bridged turn and checks that the
    suffix is exactly the tail of the full render (slow; for tests and diagnosis).
    """

    def __init__(self, renderer: ChatRenderer, *, verify: bool = False) -> None:
        self.renderer = renderer
        self.verify = verify
        self.windowed = renderer.boundary is not None and self._probe_windowing()

    # -- public API ----------------------------------------------------------------------------------

    def plan(
        self,
        chain: ChainState,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        kwargs: Mapping[str, Any],
    ) -> PromptPlan:
        """The prompt for ``messages``: bridged from a matching previous turn when possible, else full."""
        hashes = prefix_hashes(messages)
        tkey, kkey = tools_key(tools), kwargs_key(kwargs)
        try:
            node = self._match(chain, messages, hashes, tkey, kkey)
            suffix = self.suffix_text(messages, node.n_messages, tools, kwargs)
            boundary = self.renderer.boundary
            if boundary is not None and boundary.opens_next:
                # The sampled stop token opened the next message: the suffix goes on after it, when it is the
                # token the template opens the next message with (a model that stopped with <|user|> where
                # tool results follow would be rendered <|observation|>: no bridge).
                opener = self.renderer.decode(node.output_ids[-1:])
                if not suffix.startswith(opener):
                    raise BridgeMiss(f"the model stopped with {opener!r}; the template opens the next message "
                                     f"with {suffix[:20]!r}")
                suffix = suffix[len(opener) :]
            prefix = node.prompt_ids + node.output_ids
            return PromptPlan(
                prompt_ids=prefix + self.renderer.encode(suffix),
                mode="bridged",
                bridge_prefix_len=len(prefix),
                bridge_from_turn=node.turn,
                history_hashes=hashes,
                tools_key=tkey,
                kwargs_key=kkey,
            )
        except BridgeMiss as miss:
            reason = str(miss)
        log.debug("full render: %s", reason)
        return PromptPlan(
            prompt_ids=self.renderer.render_ids(messages, tools, kwargs),
            mode="full",
            fallback_reason=reason,
            history_hashes=hashes,
            tools_key=tkey,
            kwargs_key=kkey,
        )

    async def plan_in_thread(
        self,
        chain: ChainState,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        kwargs: Mapping[str, Any],
    ) -> PromptPlan:
        """``plan`` on a worker thread: rendering and tokenising a long history takes up to seconds, and
        the adapter's event loop must keep serving other sessions meanwhile. The chain is only read."""
        return await asyncio.to_thread(self.plan, chain, messages, tools, kwargs)

    def commit(
        self,
        chain: ChainState,
        plan: PromptPlan,
        output_ids: Sequence[int],
        *,
        stopped: bool,
        reply_text: str,
        reply_calls: Sequence[ToolCall],
        turn: int | None = None,
    ) -> None:
        """Remember an answered turn. ``stopped``: the engine finished because the model stopped;
        ``turn``: its turn number in the session (copied into later bridged plans)."""
        boundary = self.renderer.boundary
        ends = (lambda i: i in self.renderer.eos_ids) if boundary is not None and boundary.opens_next else (
            lambda i: boundary is not None and i == boundary.marker_id)
        clean = stopped and boundary is not None and bool(output_ids) and ends(output_ids[-1])
        chain.nodes.append(
            ChainNode(
                n_messages=len(plan.history_hashes) - 1,
                history_hash=plan.history_hashes[-1],
                tools_key=plan.tools_key,
                kwargs_key=plan.kwargs_key,
                prompt_ids=plan.prompt_ids,
                output_ids=output_ids if isinstance(output_ids, list) else list(output_ids),
                ended_cleanly=clean,
                reply_key=message_key(
                    Message(role="assistant", content=reply_text, tool_calls=list(reply_calls))
                ),
                turn=turn,
            )
        )

    # -- matching ------------------------------------------------------------------------------------

    def _match(
        self,
        chain: ChainState,
        messages: Sequence[Message],
        hashes: list[bytes],
        tkey: str,
        kkey: str,
    ) -> ChainNode:
        if self.renderer.boundary is None:
            raise BridgeMiss("the chat template has no verifiable end-of-message boundary")
        if not chain.nodes:
            raise BridgeMiss(NO_PREVIOUS_TURN)
        best: list[ChainNode] = []
        near: str | None = None
        for node in chain.nodes:
            k = node.n_messages
            if k >= len(messages) or hashes[k] != node.history_hash:
                continue
            if message_key(messages[k]) != node.reply_key:
                near = near or f"messages[{k}] is not the assistant reply of the turn it follows"
                continue
            if best and best[0].n_messages > k:
                continue
            if best and best[0].n_messages < k:
                best = []
            best.append(node)
        if not best:
            raise BridgeMiss(near or HISTORY_CHANGED)
        node = best[-1]
        if any(n.output_ids != node.output_ids or n.prompt_ids != node.prompt_ids for n in best[:-1]):
            raise BridgeMiss(f"ambiguous: {len(best)} previous turns with different ids match this history")
        if node.tools_key != tkey:
            raise BridgeMiss(TOOLS_CHANGED)
        if node.kwargs_key != kkey:
            raise BridgeMiss(KWARGS_CHANGED)
        if not node.ended_cleanly:
            raise BridgeMiss("the previous output did not end with the end-of-message token")
        tail = messages[node.n_messages + 1 :]
        if not tail:
            raise BridgeMiss("no new message after the previous reply")
        if any(m.role == "assistant" for m in tail):
            raise BridgeMiss("an assistant message follows the previous reply")
        return node

    # -- suffix rendering ----------------------------------------------------------------------------

    def suffix_text(
        self, messages: Sequence[Message], k: int, tools: Sequence[ToolSpec], kwargs: Mapping[str, Any]
    ) -> str:
        """Template text after the end of assistant message ``messages[k]`` (generation prompt included)."""
        start = k if self.windowed else 0
        window = [*messages[start:k], messages[k].model_copy(update={"reasoning": None}), *messages[k + 1 :]]
        suffix = self._cut_after(window, k - start, tools, kwargs)
        if self.verify and self.windowed:
            full = self._cut_after([*messages[:k], window[0], *messages[k + 1 :]], k, tools, kwargs)
            if full != suffix:
                raise BridgeMiss("windowed suffix differs from the full render's suffix")
        return suffix

    def _cut_after(
        self, messages: Sequence[Message], k: int, tools: Sequence[ToolSpec], kwargs: Mapping[str, Any]
    ) -> str:
        boundary = self.renderer.boundary
        assert boundary is not None
        if boundary.opens_next:
            return self._cut_at_opener(messages, k, tools, kwargs, boundary.openers)
        marker = boundary.marker
        for msg in messages:
            # Client text is escaped by the renderer (its marker text is not the marker); only the
            # model's own assistant text is rendered as it is and could shift the boundary count.
            if msg.role != "assistant":
                continue
            if marker in msg.content or any(marker in json.dumps(c.arguments) for c in msg.tool_calls):
                raise BridgeMiss("a message contains the end-of-message marker text")
        try:
            head = self.renderer.render_text(messages[: k + 1], tools, kwargs, add_generation_prompt=False)
            full = self.renderer.render_text(messages, tools, kwargs, add_generation_prompt=True)
        except RenderError as exc:
            raise BridgeMiss(str(exc)) from exc
        count = head.count(marker)
        if count == 0 or not head.endswith(marker + boundary.trailer):
            raise BridgeMiss("the assistant message does not end at the template's message boundary")
        pos = -1
        for _ in range(count):
            pos = full.find(marker, pos + 1)
            if pos < 0:
                raise BridgeMiss("the full render has fewer message boundaries than its prefix")
        suffix = full[pos + len(marker) :]
        if not suffix.startswith(boundary.trailer):
            raise BridgeMiss(f"the boundary after the reply is not {marker + boundary.trailer!r}")
        return suffix

    def _cut_at_opener(
        self, messages: Sequence[Message], k: int, tools: Sequence[ToolSpec], kwargs: Mapping[str, Any],
        openers: Sequence[str],
    ) -> str:
        """``_cut_after`` for a template whose messages open with a stop token (``MessageBoundary.opens_next``):
        the suffix starts at the first opener after the reply, found by counting the openers before it (a
        template that drops earlier reasoning changes the text before the reply, not the count)."""
        for msg in messages:
            if msg.role == "assistant" and any(o in msg.content or any(o in json.dumps(c.arguments)
                                                                       for c in msg.tool_calls) for o in openers):
                raise BridgeMiss("a message contains the text of a stop token that opens messages")
        try:
            head = self.renderer.render_text(messages[: k + 1], tools, kwargs, add_generation_prompt=False)
            full = self.renderer.render_text(messages, tools, kwargs, add_generation_prompt=True)
        except RenderError as exc:
            raise BridgeMiss(str(exc)) from exc
        pattern = "|".join(re.escape(o) for o in openers)
        count = len(re.findall(pattern, head))
        found = list(re.finditer(pattern, full))
        if len(found) <= count:
            raise BridgeMiss("no message opens with a stop token after the reply")
        return full[found[count].start() :]

    def _probe_windowing(self) -> bool:
        """True when rendering a short window yields the same suffix as the full history, on probes."""
        tool = ToolSpec(
            name="probe_tool", parameters={"type": "object", "properties": {"x": {"type": "string"}}}
        )
        calls = [ToolCall(id="p1", name="probe_tool", arguments={"x": "a"}),
                 ToolCall(id="p2", name="probe_tool", arguments={"x": "b"})]  # fmt: skip
        probes: list[tuple[list[Message], int, list[ToolSpec]]] = [
            (
                [Message(role="system", content="sys"), Message(role="user", content="u1"),
                 Message(role="assistant", content="t", tool_calls=calls),
                 Message(role="tool", tool_call_id="p1", content="r1"),
                 Message(role="tool", tool_call_id="p2", content="r2")],
                2, [tool],
            ),
            (
                [Message(role="user", content="u1"), Message(role="assistant", content="a1", reasoning="r"),
                 Message(role="user", content="u2"), Message(role="assistant", content="a2", reasoning="r"),
                 Message(role="system", content="s2"), Message(role="user", content="u3")],
                3, [],
            ),
            (  # a template that numbers calls across the conversation (Kimi K2) renders results by context
                [Message(role="user", content="u1"), Message(role="assistant", content="", tool_calls=calls[:1]),
                 Message(role="tool", tool_call_id="p1", content="r1"),
                 Message(role="assistant", content="", tool_calls=calls[1:]),
                 Message(role="tool", tool_call_id="p2", content="r2")],
                3, [tool],
            ),
        ]  # fmt: skip
        kwargs = self.renderer.template_kwargs
        for messages, k, tools in probes:
            stripped = [*messages[:k], messages[k].model_copy(update={"reasoning": None}), *messages[k + 1 :]]
            try:
                full = self._cut_after(stripped, k, tools, kwargs)
                short = self._cut_after(stripped[k:], 0, tools, kwargs)
            except BridgeMiss as miss:
                log.warning("suffix windowing disabled: probe failed (%s)", miss)
                return False
            if full != short:
                log.warning("suffix windowing disabled: the template renders messages context-dependently")
                return False
        return True
