"""Tokenising one production-size prompt: the renderer's pieces-and-cache encoding against whole-text encoding.

The prompt is the load benchmark's: a ~6k-character system prompt, four tool schemas and a 140k-character
agent history (tool calls and ~4 KB tool results), ~62k tiny-model ids. Measured, best of ``--repeat``:

- baseline: the whole rendered text in one ``encode_batch`` call (what ``ChatRenderer.encode`` did before);
- whole, no offsets: one ``encode_batch_fast`` call;
- pieces, cold: ``ChatRenderer.encode`` with an empty segment cache (pieces cut at added tokens, one batch);
- pieces, warm: the same text again (every long piece cached: a re-render after a bridge miss);
- one new message: the history plus one more tool result (a full render where only that piece is new).

Wall time and CPU time (all threads of this process) are printed, each with its ratio to the baseline.

    .venv/bin/python benchmarks/render_tokenise_bench.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from adapter_load_bench import RESULT, SYSTEM, TOOLS, long_history

from lego_rl.adapter.chat_completions import ChatCompletionsDialect
from lego_rl.chat.render import ChatRenderer, SegmentCache
from lego_rl.serving.tiny_model import ensure_tiny_model


def best(fn: Callable[[], Any], repeat: int, before: Callable[[], None] = lambda: None) -> tuple[float, float, Any]:
    """(wall s, CPU s, result) of the fastest of ``repeat`` runs; ``before`` runs untimed before each."""
    runs = []
    for _ in range(repeat):
        before()
        w0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        runs.append((time.perf_counter() - w0, time.process_time() - c0, out))
    return min(runs, key=lambda r: r[0])


def main(repeat: int) -> None:
    renderer = ChatRenderer.from_pretrained(ensure_tiny_model())
    dialect = ChatCompletionsDialect()
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Fix the failing test."},
                *long_history("bench", 140_000)]
    req = dialect.parse_request({"model": "m", "messages": messages, "tools": TOOLS}, path="/v1/chat/completions",
                                query={}, headers={})
    longer = dialect.parse_request({"model": "m", "messages": [*messages, {"role": "user", "content": RESULT * 4}],
                                    "tools": TOOLS}, path="/v1/chat/completions", query={}, headers={})
    text = renderer.render_text(req.messages, req.tools)
    text2 = renderer.render_text(longer.messages, longer.tools)
    backend = renderer.tokenizer.backend_tokenizer

    def clear() -> None:
        renderer.segments = SegmentCache()

    base = best(lambda: list(backend.encode_batch([text], add_special_tokens=False)[0].ids), repeat)
    rows = [
        ("whole text, encode_batch [baseline]", base),
        ("whole text, encode_batch_fast", best(lambda: list(backend.encode_batch_fast([text], add_special_tokens=False)[0].ids),
                                               repeat)),
        ("pieces, cold cache", best(lambda: renderer.encode(text), repeat, clear)),
        ("pieces, warm cache", best(lambda: renderer.encode(text), repeat, lambda: renderer.encode(text))),
        ("pieces, one new message", best(lambda: renderer.encode(text2), repeat,
                                         lambda: (clear(), renderer.encode(text)))),
    ]
    for name, (_, _, ids) in rows[:4]:
        assert ids == base[2], f"{name}: ids differ from the baseline's"
    print(f"one prompt: {len(text)} characters, {len(base[2])} ids; best of {repeat}; segmented={renderer.segmented}")
    for name, (wall, cpu, _) in rows:
        print(f"{name:38s} wall {wall * 1e3:7.1f} ms ({wall / base[0]:5.2f}x)   CPU {cpu * 1e3:7.1f} ms "
              f"({cpu / base[1]:5.2f}x)")
    print("load average:", open("/proc/loadavg").read().split()[:3])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    main(parser.parse_args().repeat)
