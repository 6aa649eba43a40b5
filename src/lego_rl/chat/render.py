"""Render canonical messages and tools with the served model's own chat template.

``ChatRenderer`` wraps the model's HF tokenizer. It maps canonical messages onto the template's message
dicts, merges template kwargs (the operator's ``CHAT_TEMPLATE_KWARGS`` under the per-sample and
per-request ones) on every call, tokenises text without adding special tokens, and learns the template's
end-of-message boundary (e.g. ``<|im_end|>`` then a newline) from a probe render, which prefix reuse
needs to join a previous turn's sampled ids to a newly rendered suffix.

Control tokens come only from the template. Text a client supplies (system and user messages, tool
results, tool names, descriptions and schemas) may contain the literal text of an added token such as
``<|im_end|>``, ``<|im_start|>`` or ``<tool_call>`` (a file the agent read, a crafted tool output); encoded
naively, that text would become the real control ids and could forge turn boundaries in the training
prompt. So ``render_text`` escapes every added-token string in client text (``_Escaper``: a private-use
code point, the token's index, a terminator) before the template runs, and ``encode`` splits the rendered
text at the template's own added tokens and encodes the text between them with added-token extraction
off (HF's ``split_special_tokens``, extended to the non-special added tokens such as ``<think>``), the
escapes turned back into the plain characters they stand for. Text without escapes encodes exactly as
before. Assistant messages are not escaped: their text is the model's own output, and a control token
the model sampled is re-encoded as the id it was.

Tokenising a long history is the adapter's largest cost (a 62k-token render: ~10 ms of template, 50-170 ms
of tokenisation). Added tokens are always token boundaries, so ``encode`` cuts the rendered text there
and tokenises the pieces in one batch (Rust works on them in parallel, without the GIL, and without
computing offsets), and keeps the ids of long pieces in a bounded cache (``SegmentCache``): a message
tokenised once (a rollout group's shared system prompt and task, a history rendered again after a bridge
miss, ``count_tokens`` before the turn) is not tokenised again. A probe at start-up checks that this
tokenizer encodes the pieces exactly as the whole text; if not, whole texts are encoded as before.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lego_rl.chat.messages import Message, ToolCall, ToolSpec
from lego_rl.chat.parsers import model_tool_name

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MessageBoundary:
    """How the template ends a message: ``marker`` (one special token, ``marker_id``) then ``trailer``.

    ``opens_next``: the template closes an assistant message with nothing, and the model stops by sampling the
    token that opens the next message (GLM-4.x: ``<|observation|>`` before tool results, ``<|user|>`` before the
    user's next message), a stop token the template renders there. ``marker`` is then empty, ``marker_id`` -1,
    and the sampled stop token is the boundary (``openers``: the stop tokens' texts)."""

    marker: str
    marker_id: int
    trailer: str
    opens_next: bool = False
    openers: tuple[str, ...] = ()


Encoder = Callable[[str], list[int]]
BatchEncoder = Callable[[list[str]], list[list[int]]]


class RenderError(ValueError):
    """The chat template could not render the history (names the template's complaint)."""


def tool_to_template(spec: ToolSpec) -> dict[str, Any]:
    """An OpenAI-style function schema for the template. Custom (free-text) tools take one ``input``."""
    if spec.kind == "custom":
        fmt = spec.format or {}
        hint = "Free-form text input."
        if fmt.get("type") == "grammar":
            syntax, definition = fmt.get("syntax", ""), fmt.get("definition", "")
            hint = f"Text input that must follow this {syntax} grammar:\n{definition}"
        params: dict[str, Any] = {
            "type": "object",
            "properties": {"input": {"type": "string", "description": hint}},
            "required": ["input"],
        }
    else:
        params = spec.parameters or {"type": "object", "properties": {}}
    return {
        "type": "function",
        "function": {"name": model_tool_name(spec), "description": spec.description, "parameters": params},
    }


def _call_to_template(call: ToolCall) -> dict[str, Any]:
    name = f"{call.namespace}.{call.name}" if call.namespace else call.name
    return {"id": call.id, "type": "function", "function": {"name": name, "arguments": call.arguments}}


def message_to_template(msg: Message) -> dict[str, Any]:
    """The template's message dict for one canonical message."""
    out: dict[str, Any] = {"role": msg.role, "content": msg.content}
    if msg.role == "assistant":
        if msg.reasoning is not None:
            out["reasoning_content"] = msg.reasoning
        if msg.tool_calls:
            out["tool_calls"] = [_call_to_template(c) for c in msg.tool_calls]
    elif msg.role == "tool":
        out["tool_call_id"] = msg.tool_call_id
        if msg.name:
            out["name"] = msg.name
    return out


ESCAPE_OPEN = "\ue000"
ESCAPE_CLOSE = "\ue001"
"""An escape is OPEN, a decimal index into the added tokens (empty for a literal OPEN), CLOSE. Private-use
code points: templates pass them through untouched (``strip``, ``tojson``, ``split`` do not alter them)."""


class _Escaper:
    """Escapes added-token text in client strings before rendering, and unescapes the rendered text."""

    def __init__(self, added: Sequence[str]) -> None:
        # Longest first, so that a token that contains another (``<|im_end|>`` vs ``<|im_end``) wins.
        self.tokens = sorted({t for t in added if t}, key=len, reverse=True)
        self._index = {t: str(i) for i, t in enumerate(self.tokens)}
        alternatives = [ESCAPE_OPEN] + self.tokens
        self._find = re.compile("|".join(re.escape(t) for t in alternatives))
        self._split = re.compile("(" + "|".join(re.escape(t) for t in self.tokens) + ")") if self.tokens else None
        self._undo = re.compile(re.escape(ESCAPE_OPEN) + r"(\d*)" + re.escape(ESCAPE_CLOSE))

    def needed(self, text: str) -> bool:
        # ``in`` scans run at C speed; most texts contain no added token and skip the regex entirely.
        return ESCAPE_OPEN in text or any(t in text for t in self.tokens)

    def escape(self, text: str) -> str:
        if not self.needed(text):
            return text
        return self._find.sub(lambda m: ESCAPE_OPEN + self._index.get(m.group(0), "") + ESCAPE_CLOSE, text)

    def escape_value(self, value: Any) -> Any:
        """``escape`` applied to every string (keys included) of a JSON-like value."""
        if isinstance(value, str):
            return self.escape(value)
        if isinstance(value, dict):
            return {self.escape(k) if isinstance(k, str) else k: self.escape_value(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.escape_value(v) for v in value]
        return value

    def unescape(self, text: str) -> str:
        def undo(m: re.Match[str]) -> str:
            i = m.group(1)
            return self.tokens[int(i)] if i and int(i) < len(self.tokens) else ESCAPE_OPEN

        return self._undo.sub(undo, text)

    def split_template_tokens(self, text: str) -> list[str]:
        """``text`` cut at (and keeping) every added-token string in it: after escaping, only the
        template's own tokens are left there."""
        return self._split.split(text) if self._split is not None else [text]


SEGMENT_CACHE_BYTES = 64 * 1024 * 1024
"""Memory the segment cache may hold (piece text plus its ids at 4 bytes each)."""
SEGMENT_MIN_CHARS = 256
"""Shorter pieces are not cached: re-tokenising them costs less than the bookkeeping."""


class SegmentCache:
    """Token ids of rendered text pieces (between two template tokens), least recently used first out.

    Bounded by ``max_bytes`` (a piece's text length plus 4 bytes per id, ids kept as a 32-bit array); a
    piece bigger than an eighth of that is never kept. Thread-safe: renders run on worker threads."""

    def __init__(self, max_bytes: int = SEGMENT_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._items: OrderedDict[str, array[int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, text: str) -> array[int] | None:
        with self._lock:
            ids = self._items.get(text)
            if ids is None:
                self.misses += 1
                return None
            self._items.move_to_end(text)
            self.hits += 1
            return ids

    def put(self, text: str, ids: Sequence[int]) -> None:
        cost = len(text) + 4 * len(ids)
        if cost > self.max_bytes // 8:
            return
        packed = array("i", ids)
        with self._lock:
            if text in self._items:
                return
            self._items[text] = packed
            self.bytes += cost
            while self.bytes > self.max_bytes:
                old, old_ids = self._items.popitem(last=False)
                self.bytes -= len(old) + 4 * len(old_ids)


class ChatRenderer:
    """Chat-template rendering and tokenisation for one served model.

    ``template_kwargs`` are the operator-level defaults (``CHAT_TEMPLATE_KWARGS``); every render call may
    add per-sample / per-request kwargs on top. ``boundary`` is None when the template's end of message
    is not one special token followed by whitespace: prefix reuse is then disabled (full renders only).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        chat_template: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        extra_stop_ids: Sequence[int] = (),
    ) -> None:
        self.tokenizer = tokenizer
        # The core enforces the context window itself; silence the tokenizer's own length warning.
        tokenizer.model_max_length = 1 << 40
        self._extra_stop_ids = tuple(extra_stop_ids)
        self.chat_template = chat_template or tokenizer.chat_template
        if not self.chat_template:
            raise RenderError("the tokenizer has no chat template and none was given")
        self.template_kwargs = dict(template_kwargs or {})
        self.vocab_size = len(tokenizer)
        self.added_tokens: dict[str, int] = {
            str(getattr(tok, "content", tok)): int(i)
            for i, tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items()
        }
        self.escaper = _Escaper(list(self.added_tokens))
        self._fast, self._plain, self._fast_many, self._plain_many = self._encoders()
        self.segments = SegmentCache()
        self.segmented = self._probe_segmenting()
        self.max_token_bytes = self._longest_token_bytes()
        self.boundary = self._probe_boundary()
        self.eos_ids = self._stop_ids()

    @classmethod
    def from_pretrained(
        cls, model_dir: str | Path, *, template_kwargs: Mapping[str, Any] | None = None
    ) -> ChatRenderer:
        """Load the tokenizer (and its chat template) of the model served from ``model_dir``."""
        from transformers import AutoTokenizer  # heavy import, only when a renderer is built

        # generation_config.json may list more stop ids than the tokenizer's eos (Qwen3: <|endoftext|>).
        stops: list[int] = []
        gen_cfg = Path(model_dir) / "generation_config.json"
        if gen_cfg.is_file():
            eos = json.loads(gen_cfg.read_text()).get("eos_token_id")
            stops = [eos] if isinstance(eos, int) else [e for e in eos or [] if isinstance(e, int)]
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        return cls(tokenizer, template_kwargs=template_kwargs, extra_stop_ids=stops)

    # -- rendering -----------------------------------------------------------------------------------

    def merged_kwargs(self, *overrides: Mapping[str, Any] | None) -> dict[str, Any]:
        """Operator defaults, then each override in turn (later wins)."""
        merged = dict(self.template_kwargs)
        for extra in overrides:
            merged.update(extra or {})
        return merged

    def render_text(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        add_generation_prompt: bool = True,
    ) -> str:
        """The template's text for ``messages`` (kwargs are used as given: merge them first)."""
        extra = {k: v for k, v in (kwargs or {}).items() if k not in ("tools", "add_generation_prompt")}
        try:
            return self.tokenizer.apply_chat_template(
                [self._escaped(message_to_template(m)) for m in messages],
                tools=[self.escaper.escape_value(tool_to_template(t)) for t in tools] or None,
                chat_template=self.chat_template,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **extra,
            )
        except Exception as exc:  # jinja raises many types (TemplateError, TypeError...)
            raise RenderError(f"chat template failed: {type(exc).__name__}: {exc}") from exc

    def _escaped(self, msg: dict[str, Any]) -> dict[str, Any]:
        """A template message with the client's text escaped (assistant messages: the model's own text)."""
        if msg["role"] == "assistant":
            return msg
        return {k: self.escaper.escape(v) if isinstance(v, str) and k != "role" else v for k, v in msg.items()}

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered ``text``, nothing added. Added-token strings in it become their ids;
        escaped client text (see the module docstring) is encoded as the plain characters it stands for."""
        if self.segmented:
            return self._encode_pieces(text)
        return self._encode_whole(text)

    def _encode_whole(self, text: str) -> list[int]:
        """``encode`` without cutting the text at template tokens (no cache; the probe's reference)."""
        if ESCAPE_OPEN not in text:
            return self._fast(text)
        ids: list[int] = []
        for i, piece in enumerate(self.escaper.split_template_tokens(text)):
            if i % 2:  # the template's own added token
                ids.append(self.added_tokens[piece])
            elif piece:
                ids.extend(self._plain(self.escaper.unescape(piece)) if ESCAPE_OPEN in piece else self._fast(piece))
        return ids

    def _encode_pieces(self, text: str) -> list[int]:
        """``encode`` as pieces between template tokens: cached pieces are reused, the rest tokenised in
        one batch per encoder (in parallel, offsets not computed) and cached when long enough."""
        pieces = self.escaper.split_template_tokens(text)
        parts: list[Sequence[int]] = [()] * len(pieces)
        fast: list[int] = []  # indexes of pieces to tokenise as they are
        plain: list[int] = []  # indexes of pieces holding escaped client text
        for i, piece in enumerate(pieces):
            if i % 2:  # the template's own added token
                parts[i] = (self.added_tokens[piece],)
            elif piece:
                cached = self.segments.get(piece) if len(piece) >= SEGMENT_MIN_CHARS else None
                if cached is not None:
                    parts[i] = cached
                else:
                    (plain if ESCAPE_OPEN in piece else fast).append(i)
        for todo, many, prepare in ((fast, self._fast_many, None), (plain, self._plain_many, self.escaper.unescape)):
            if not todo:
                continue
            texts = [prepare(pieces[i]) if prepare else pieces[i] for i in todo]
            for i, ids in zip(todo, many(texts), strict=True):
                parts[i] = ids
                if len(pieces[i]) >= SEGMENT_MIN_CHARS:
                    self.segments.put(pieces[i], ids)
        out: list[int] = []
        for part in parts:
            out.extend(part)
        return out

    def _probe_segmenting(self) -> bool:
        """True when cutting text at added tokens leaves its ids unchanged for this tokenizer (an added
        token that strips the whitespace beside it, or a normaliser working across it, would not)."""
        sample = "def f(x):\n    return x  # done\n\n"
        probe = "".join(f"{sample}{token} {sample} {token}\n\n {token}{token}x" for token in self.added_tokens)
        # Against the whole text in one call (escaped text was always encoded in pieces: no need to probe it).
        if self._encode_pieces(probe) == self._fast(probe):
            self.segments = SegmentCache()  # nothing from the probe stays
            return True
        log.warning("tokenising whole texts: this tokenizer encodes text cut at added tokens differently")
        return False

    def _encoders(self) -> tuple[Encoder, Encoder, BatchEncoder, BatchEncoder]:
        """Two encoders of the fast tokenizer's backend, each for one text and for a batch: as configured,
        and with no added-token extraction at all (special or not). All call ``encode_batch_fast`` (or
        ``encode_batch`` before tokenizers 0.21), which releases the GIL while Rust works, so a long prompt
        tokenised on a worker thread does not stall the event loop, and encodes a batch in parallel.

        HF's ``split_special_tokens`` leaves non-special added tokens (Qwen's ``<think>``, ``<tool_call>``)
        extracted, so a copy of the fast tokenizer is made in which every added token is special, with
        special-token extraction off. The result is checked: no added token's text may encode to an added id.
        """
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise RenderError(f"{type(self.tokenizer).__name__} is not a fast tokenizer: client text cannot be "
                              "encoded without control tokens")
        from tokenizers import Tokenizer

        spec = json.loads(backend.to_str())
        for tok in spec.get("added_tokens") or []:
            tok["special"] = True
        plain = Tokenizer.from_str(json.dumps(spec))
        plain.no_truncation()
        plain.no_padding()
        plain.encode_special_tokens = True

        # Offsets are never read here; computing them costs ~40% of a long text's tokenisation.
        plain_batch = getattr(plain, "encode_batch_fast", plain.encode_batch)
        fast_batch = getattr(backend, "encode_batch_fast", backend.encode_batch)

        def plain_many(texts: list[str]) -> list[list[int]]:
            return [list(e.ids) for e in plain_batch(texts, add_special_tokens=False)]

        def fast_many(texts: list[str]) -> list[list[int]]:
            return [list(e.ids) for e in fast_batch(texts, add_special_tokens=False)]

        def encode_plain(text: str) -> list[int]:
            return plain_many([text])[0]

        def encode_fast(text: str) -> list[int]:
            return fast_many([text])[0]

        added_ids = set(self.added_tokens.values())
        for token in self.added_tokens:
            leaked = added_ids.intersection(encode_plain(f"a{token}b"))
            if leaked:
                raise RenderError(f"the tokenizer encodes the plain text {token!r} to control ids {sorted(leaked)}: "
                                  "client text could forge control tokens")
        return encode_fast, encode_plain, fast_many, plain_many

    def min_prompt_tokens(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> int:
        """A lower bound of the prompt's length, from the size of its text alone (no rendering).

        No token covers more than ``max_token_bytes`` bytes, so ``n`` bytes of text take at least
        ``n / max_token_bytes`` tokens; halved, because normalisation (NFC) may shorten the text. Cheap
        enough to refuse a 10 MiB request before rendering and tokenising it costs seconds and GBs."""
        texts = [m.content for m in messages] + [m.reasoning or "" for m in messages] + [t.description for t in tools]
        size = sum(len(text.encode("utf-8", "surrogatepass")) for text in texts)
        return size // (2 * self.max_token_bytes)

    def _longest_token_bytes(self) -> int:
        ids = [[i] for i in range(self.vocab_size)]
        texts = self.tokenizer.batch_decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return max(1, max(len(t.encode("utf-8", "surrogatepass")) for t in texts))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with special tokens kept (the parsers need ``<think>`` / ``<tool_call>``)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def render_ids(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Full render with a generation prompt, tokenised."""
        return self.encode(self.render_text(messages, tools, kwargs))

    def strip_end_of_message(self, ids: Sequence[int]) -> list[int]:
        """``ids`` without a trailing stop token (for decoding the visible output)."""
        out = list(ids)
        while out and out[-1] in self.eos_ids:
            out.pop()
        return out

    # -- template probing ----------------------------------------------------------------------------

    def _probe_boundary(self) -> MessageBoundary | None:
        """Find the end-of-message marker: the text the template puts after a probe assistant reply."""
        probe = "lego-probe-reply"
        try:
            text = self.render_text(
                [Message(role="user", content="lego-probe-ask"), Message(role="assistant", content=probe)],
                add_generation_prompt=False,
            )
        except RenderError as exc:
            log.warning("prefix reuse disabled: probe render failed (%s)", exc)
            return None
        at = text.rfind(probe)
        tail = text[at + len(probe) :] if at >= 0 else ""
        ids = self.encode(tail)
        if not ids:
            return self._probe_opening_boundary(probe)
        marker = self.decode(ids[:1])
        special = set(getattr(self.tokenizer, "all_special_ids", [])) | set(
            getattr(self.tokenizer, "added_tokens_decoder", {}) or {}
        )
        trailer = tail[len(marker) :]
        if ids[0] not in special or not tail.startswith(marker) or trailer.strip():
            log.warning(
                "prefix reuse disabled: assistant messages end with %r, not <special token><space>", tail
            )
            return None
        return MessageBoundary(marker=marker, marker_id=ids[0], trailer=trailer)

    def _probe_opening_boundary(self, probe: str) -> MessageBoundary | None:
        """For a template that ends assistant messages with nothing: the boundary is the stop token the model
        samples when the next message opens with it (checked on a user message following the reply)."""
        try:
            text = self.render_text(
                [Message(role="user", content="lego-probe-ask"), Message(role="assistant", content=probe),
                 Message(role="user", content="lego-probe-next")],
                add_generation_prompt=False,
            )
        except RenderError as exc:
            log.warning("prefix reuse disabled: probe render failed (%s)", exc)
            return None
        at = text.rfind(probe)
        tail = text[at + len(probe) :] if at >= 0 else ""
        ids = self.encode(tail)
        stops = set(self._extra_stop_ids)
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if isinstance(eos, int):
            stops.add(eos)
        if not ids or ids[0] not in stops:
            log.warning("prefix reuse disabled: the template ends assistant messages with nothing, and the next "
                        "message does not open with a stop token (%r)", tail[:40])
            return None
        openers = tuple(sorted({self.decode([i]) for i in stops}))
        return MessageBoundary(marker="", marker_id=-1, trailer="", opens_next=True, openers=openers)

    def _stop_ids(self) -> frozenset[int]:
        ids = set(self._extra_stop_ids)
        if self.boundary is not None and not self.boundary.opens_next:
            ids.add(self.boundary.marker_id)
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        return frozenset(ids)
