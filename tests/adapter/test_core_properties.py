"""Property: over random agent sessions, every prompt is either an exact bridge or the template's render.

The policy is a TEST DOUBLE that answers instantly with generated text (tool calls or prose) encoded by
the real tokenizer; the client is simulated: it echoes replies without reasoning, sends parallel tool
results in a random order, and sometimes compacts or edits its history.
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from lego_rl.adapter.canonical import CanonicalRequest, Message, ToolSpec
from lego_rl.adapter.core import AdapterCore
from lego_rl.adapter.sessions import SessionRegistry
from lego_rl.chat.parsers import restore_tool_order
from lego_rl.chat.render import ChatRenderer
from lego_rl.serving.protocol import GenerateResult, SamplingParams

TOOLS = [ToolSpec(name="run", parameters={"type": "object", "properties": {"cmd": {"type": "string"}}})]


class TextEngine:
    """TEST DOUBLE: emits ``texts`` in turn (ids from the real tokenizer), logprob -0.25 per token."""

    def __init__(self, renderer: ChatRenderer) -> None:
        self.renderer = renderer
        self.texts: list[str] = []

    async def generate(
        self, token_ids: list[int], params: SamplingParams, *, session_id: str | None = None
    ) -> Any:
        ids = self.renderer.encode(self.texts.pop(0))
        return GenerateResult(output_ids=ids, logprobs=[-0.25] * len(ids), finish_reason="stop")


def reply_text(n_calls: int, rng: random.Random) -> str:
    think = f"<think>\nplan {rng.randint(0, 99)}\n</think>\n\n" if rng.random() < 0.7 else ""
    calls = "".join(
        f"\n<tool_call>\n<function=run>\n<parameter=cmd>\necho {rng.randint(0, 999)}\n</parameter>\n"
        "</function>\n</tool_call>"
        for _ in range(n_calls)
    )
    return f"{think}Step {rng.randint(0, 99)}.{calls}<|im_end|>"


steps = st.lists(
    st.tuples(st.integers(0, 3), st.sampled_from(["continue"] * 4 + ["compact", "edit"])),
    min_size=1,
    max_size=6,
)


@settings(max_examples=25, deadline=None)
@given(plan=steps, seed=st.integers(0, 2**16))
async def test_random_sessions_bridge_exactly(
    renderer: ChatRenderer, plan: list[tuple[int, str]], seed: int
) -> None:
    rng = random.Random(seed)
    engine = TextEngine(renderer)
    core = AdapterCore(renderer, engine, max_context_tokens=1 << 16, verify_bridges=True)
    session = SessionRegistry().open(f"prop-{seed}", template_kwargs={"reasoning_effort": "low"})
    kwargs = core.template_kwargs(session, CanonicalRequest(protocol="chat", messages=[]))
    history = [Message(role="system", content="sys"), Message(role="user", content="task")]
    expected: list[str] = []
    sent: list[list[Message]] = []
    pending = "full"
    for n_calls, action in [(0, "continue"), *plan]:
        engine.texts.append(reply_text(n_calls, rng))
        sent.append(list(history))
        resp = await core.run_turn(session, CanonicalRequest(protocol="chat", messages=history, tools=TOOLS))
        expected.append(pending)
        history.append(Message(role="assistant", content=resp.text, tool_calls=resp.tool_calls))
        results = [
            Message(role="tool", tool_call_id=c.id, content=f"out {c.arguments}") for c in resp.tool_calls
        ]
        rng.shuffle(results)
        history += results or [Message(role="user", content=f"next {rng.randint(0, 9)}")]
        pending = "bridged"
        if action == "compact":
            history = [history[0], Message(role="user", content=f"summary {len(history)}")]
            pending = "full"
        elif action == "edit":
            history[1] = Message(role="user", content=f"task, edited at {len(history)}")
            pending = "full"

    assert [r.render_mode for r in session.records] == expected
    for rec in session.records:
        if rec.render_mode == "bridged":
            assert rec.bridge_from_turn is not None
            src = session.records[rec.bridge_from_turn]
            assert rec.prompt_ids[: rec.bridge_prefix_len] == src.prompt_ids + src.output_ids
        else:
            assert rec.bridge_prefix_len == 0 and rec.fallback_reason
    # A full record is exactly the template's render of what the client sent (tool results in call order).
    for rec, messages in zip(session.records, sent, strict=True):
        if rec.render_mode == "full":
            assert rec.prompt_ids == renderer.render_ids(restore_tool_order(messages), TOOLS, kwargs)
    assert [r.tool_calls for r in session.records] == [r.text.count("<tool_call>") for r in session.records]
