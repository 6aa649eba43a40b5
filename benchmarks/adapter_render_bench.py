"""Per-turn adapter overhead (everything but the engine): bridged prompt vs full re-render.

For histories of about 8k, 32k and 64k tokens (a coding-agent transcript: tool calls and tool outputs
built from the tiny model's corpus), one turn adds an assistant tool call and its ~200-token result.
The turn runs through ``AdapterCore.run_turn`` twice:

* bridged: in a session whose previous turn produced the history's prompt ids (prefix reuse);
* full (baseline): in a fresh session, so the whole history is rendered and tokenised again.

The engine is a TEST DOUBLE that answers instantly with fixed ids, and the figure is the turn's
``total_s - engine_s`` (render, clamp, parse, validation, turn record). Printed as medians and as the
ratio full / bridged. Target: >= 10x at 64k.

Run: ``nice .venv/bin/python benchmarks/adapter_render_bench.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from importlib import resources
from typing import Any

from lego_rl.adapter.canonical import CanonicalRequest, CanonicalResponse, Message, ToolSpec
from lego_rl.adapter.core import AdapterCore
from lego_rl.adapter.sessions import Session, SessionRegistry
from lego_rl.chat.parsers import parse_turn
from lego_rl.chat.render import ChatRenderer
from lego_rl.serving.protocol import GenerateResult, SamplingParams
from lego_rl.serving.tiny_model import ensure_tiny_model

TOOLS = [
    ToolSpec(
        name="bash",
        description="Run a shell command in the repository and return its output.",
        parameters={"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    )
]
CALL = (
    "Running it.\n<tool_call>\n<function=bash>\n<parameter=cmd>\n{cmd}\n</parameter>\n</function>\n"
    "</tool_call><|im_end|>"
)


class InstantEngine:
    """TEST DOUBLE: answers each call at once with the next scripted text's ids (logprob -0.5 each)."""

    def __init__(self, renderer: ChatRenderer) -> None:
        self.renderer = renderer
        self.n = 0

    async def generate(
        self, token_ids: list[int], params: SamplingParams, *, session_id: str | None = None
    ) -> Any:
        self.n += 1
        ids = self.renderer.encode(CALL.format(cmd=f"pytest -x tests/test_{self.n}.py"))
        return GenerateResult(output_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop")


def build_history(renderer: ChatRenderer, corpus: str, target_tokens: int) -> list[Message]:
    """A transcript of tool calls and outputs whose full render is about ``target_tokens`` long."""
    msgs = [
        Message(role="system", content="You are a coding agent."),
        Message(role="user", content="Fix the bug."),
    ]
    chunk, pos, n = 1200, 0, 0
    while True:
        n += 1
        call = CALL.format(cmd=f"cat src/mod_{n}.py")
        call_id = f"call_{n}"
        turn = parse_turn(call.removesuffix("<|im_end|>"), TOOLS, new_id=lambda cid=call_id: cid)
        out = corpus[pos : pos + chunk] or corpus[:chunk]
        pos = (pos + chunk) % max(1, len(corpus) - chunk)
        msgs += [Message(role="assistant", content=turn.text, tool_calls=turn.tool_calls),
                 Message(role="tool", tool_call_id=f"call_{n}", content=out)]  # fmt: skip
        if n % 8 == 0 and len(renderer.render_ids(msgs, TOOLS)) >= target_tokens:
            return msgs


def next_turn(history: list[Message], resp: CanonicalResponse, corpus: str) -> list[Message]:
    echo = Message(role="assistant", content=resp.text, tool_calls=resp.tool_calls)
    result = Message(role="tool", tool_call_id=resp.tool_calls[0].id, content=corpus[:700])
    return [*history, echo, result]


async def overhead(core: AdapterCore, session: Session, messages: list[Message]) -> tuple[float, str]:
    await core.run_turn(session, CanonicalRequest(protocol="anthropic", messages=messages, tools=TOOLS))
    rec = session.records[-1]
    return rec.total_s - rec.engine_s, rec.render_mode


async def main(sizes: list[int], repeats: int) -> None:
    renderer = ChatRenderer.from_pretrained(ensure_tiny_model())
    corpus = resources.files("lego_rl.serving").joinpath("data/corpus.txt").read_text()
    core = AdapterCore(renderer, InstantEngine(renderer), context_limit=1 << 20, max_response_tokens=512)
    registry = SessionRegistry()
    print(f"{'history':>9} {'prompt ids':>10} {'full ms':>9} {'bridged ms':>11} {'full/bridged':>13}")
    for size in sizes:
        history = build_history(renderer, corpus, size)
        full_t, bridged_t, prompt_len = [], [], 0
        for rep in range(repeats):
            session = registry.open(f"bench-{size}-{rep}")
            first = await core.run_turn(
                session, CanonicalRequest(protocol="anthropic", messages=history, tools=TOOLS)
            )
            messages = next_turn(history, first, corpus)
            t, mode = await overhead(core, session, messages)
            assert mode == "bridged", "the benchmark's second turn must be bridged"
            bridged_t.append(t)
            prompt_len = len(session.records[-1].prompt_ids)
            t, mode = await overhead(core, registry.open(f"bench-{size}-{rep}-fresh"), messages)
            assert mode == "full"
            full_t.append(t)
        full, bridged = statistics.median(full_t) * 1e3, statistics.median(bridged_t) * 1e3
        print(f"{size // 1024:>8}k {prompt_len:>10} {full:>9.2f} {bridged:>11.2f} {full / bridged:>12.1f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8192, 32768, 65536])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    asyncio.run(main(args.sizes, args.repeats))
