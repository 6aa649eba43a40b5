"""Production-size requests through every protocol: MB bodies (Content-Length and chunked), the body
limit (413 naming the setting), and a 64k-token multi-turn history with tool calls."""

from __future__ import annotations

import random
import string
from collections.abc import AsyncIterator
from typing import Any

import pytest
from test_server import GOOD, PROTOCOLS, assert_nothing_recorded, error_message

TOOL = {"name": "read_file", "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}


def file_text(n_chars: int, seed: int) -> str:
    """Source-like text (words, numbers, punctuation, newlines) that a BPE cannot squeeze into few tokens."""
    rng = random.Random(seed)
    words = ["def", "return", "self", "value", "import", "class", "for", "in", "if", "else", "None", "x", "y"]
    out: list[str] = []
    size = 0
    while size < n_chars:
        line = " ".join(rng.choice(words) if rng.random() < 0.6 else
                        "".join(rng.choices(string.ascii_letters + string.digits + "_(){}:.,=+-", k=rng.randint(2, 9)))
                        for _ in range(rng.randint(3, 12)))
        out.append(line)
        size += len(line) + 1
    return "\n".join(out)[:n_chars]


def one_message(protocol: str, text: str) -> dict[str, Any]:
    if protocol == "anthropic":
        return {"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": text}]}
    if protocol == "responses":
        return {"model": "m", "input": text, "store": False, "max_output_tokens": 20}
    return {"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": text}]}


def tool_history(protocol: str, results: list[str]) -> dict[str, Any]:
    """A coding-agent history: a task, then one read_file call and its (large) result per entry."""
    if protocol == "anthropic":
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "Fix the bug in the repository."}]
        for i, res in enumerate(results):
            msgs.append({"role": "assistant", "content": [
                {"type": "text", "text": f"Reading file {i}."},
                {"type": "tool_use", "id": f"toolu_{i}", "name": "read_file", "input": {"path": f"f{i}.py"}}]})
            msgs.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": res}]})
        return {"model": "m", "max_tokens": 20, "messages": msgs,
                "tools": [{"name": TOOL["name"], "description": TOOL["description"],
                           "input_schema": TOOL["parameters"]}]}
    if protocol == "responses":
        items: list[dict[str, Any]] = [{"type": "message", "role": "user",
                                        "content": [{"type": "input_text", "text": "Fix the bug in the repository."}]}]
        for i, res in enumerate(results):
            items.append({"type": "message", "role": "assistant",
                          "content": [{"type": "output_text", "text": f"Reading file {i}."}]})
            items.append({"type": "function_call", "call_id": f"call_{i}", "name": "read_file",
                          "arguments": f'{{"path": "f{i}.py"}}'})
            items.append({"type": "function_call_output", "call_id": f"call_{i}", "output": res})
        return {"model": "m", "input": items, "store": False, "max_output_tokens": 20,
                "tools": [dict(TOOL, type="function")]}
    chat: list[dict[str, Any]] = [{"role": "user", "content": "Fix the bug in the repository."}]
    for i, res in enumerate(results):
        chat.append({"role": "assistant", "content": f"Reading file {i}.", "tool_calls": [
            {"id": f"call_{i}", "type": "function",
             "function": {"name": "read_file", "arguments": f'{{"path": "f{i}.py"}}'}}]})
        chat.append({"role": "tool", "tool_call_id": f"call_{i}", "content": res})
    return {"model": "m", "max_tokens": 20, "messages": chat, "tools": [{"type": "function", "function": TOOL}]}


async def chunked(data: bytes, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    """A body sent with Transfer-Encoding: chunked (no Content-Length)."""
    for i in range(0, len(data), size):
        yield data[i : i + size]


def encoded(body: dict[str, Any]) -> bytes:
    import json

    return json.dumps(body).encode()


@pytest.mark.parametrize("transfer", ["content-length", "chunked"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_megabyte_bodies_are_read_whole(make_harness, renderer: Any, protocol: str, transfer: str) -> None:
    # Over the socket's first read (64-360 KiB): a single StreamReader.read() cut these bodies.
    # score=False: the tiny model cannot score a 400k-token prompt (65536 positions); not the point here.
    h = await make_harness(["Done."], max_context_tokens=4_000_000, score=False)
    text = file_text(1_200_000, seed=1) + "\nEND-OF-THE-BIG-MESSAGE"
    data = encoded(one_message(protocol, text))
    assert len(data) > 1_000_000
    payload: Any = chunked(data) if transfer == "chunked" else data
    r = await h.client.post(GOOD[protocol][0], data=payload,
                            headers={"Authorization": "Bearer sess-a", "Content-Type": "application/json"})
    assert r.status == 200, await r.text()
    (record,) = h.sessions.get("sess-a").records
    assert "END-OF-THE-BIG-MESSAGE" in renderer.decode(record.prompt_ids[-200:])
    assert len(record.prompt_ids) > 200_000


@pytest.mark.parametrize("transfer", ["content-length", "chunked"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_oversize_bodies_are_413_naming_the_setting(make_harness, protocol: str, transfer: str) -> None:
    h = await make_harness(max_body_bytes=300_000)
    data = encoded(one_message(protocol, file_text(700_000, seed=2)))
    payload: Any = chunked(data) if transfer == "chunked" else data
    r = await h.client.post(GOOD[protocol][0], data=payload,
                            headers={"Authorization": "Bearer sess-a", "Content-Type": "application/json"})
    assert r.status == 413
    msg = error_message(protocol, await r.json())
    assert "exceeds the adapter's limit of 300000 bytes" in msg and "adapter.max_body_mb" in msg
    if transfer == "content-length":
        assert f"of {len(data)} bytes" in msg
    assert_nothing_recorded(h)
    r = await h.client.post(GOOD[protocol][0], json=GOOD[protocol][1], headers={"Authorization": "Bearer sess-a"})
    assert r.status == 200  # the session is untouched by the refused body


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_64k_token_history_with_tool_results(make_harness, renderer: Any, protocol: str) -> None:
    # score=False: a teacher-forced forward over 64k positions of the tiny model on CPU takes minutes and
    # the logprobs are not what this test is about; the tokenizer, template and adapter are the real ones.
    h = await make_harness(["Fixed it."], max_context_tokens=80_000, score=False)
    engine = h.engine
    results = [file_text(5_300, seed=10 + i) for i in range(24)]
    r = await h.client.post(GOOD[protocol][0], json=tool_history(protocol, results),
                            headers={"Authorization": "Bearer sess-a"})
    assert r.status == 200, await r.text()
    (record,) = h.sessions.get("sess-a").records
    assert 64_000 <= len(record.prompt_ids) < 80_000, len(record.prompt_ids)
    assert record.output_ids == engine.calls[0].output_ids and record.stop_reason == "end_turn"
    prompt = renderer.decode(record.prompt_ids)
    assert all(res[-300:] in prompt for res in results)  # every tool result reached the prompt whole
