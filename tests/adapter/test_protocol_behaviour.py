"""Protocol behaviour the real CLIs showed (issue 16): tool calls only when tools were offered, concurrent
requests on one session, repeated identical requests, for every protocol through the HTTP edge."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from support.scripted_engine import ScriptedPolicyEngine, tool_call_text
from support.sse import parse_sse

from lego_rl.serving.protocol import GenerateResult, SamplingParams

HI = [{"role": "user", "content": "hi"}]
REQUESTS = {
    "anthropic": ("/v1/messages", {"model": "m", "max_tokens": 200, "messages": HI}),
    "responses": ("/v1/responses", {"model": "m", "input": "hi", "store": False}),
    "chat": ("/v1/chat/completions", {"model": "m", "messages": HI}),
}
PROTOCOLS = list(REQUESTS)
CALL = tool_call_text("bash", {"command": "rm -rf /"})


def tool_calls_of(protocol: str, body: dict[str, Any]) -> list[Any]:
    if protocol == "anthropic":
        return [b for b in body["content"] if b["type"] == "tool_use"]
    if protocol == "responses":
        return [i for i in body["output"] if i["type"] in ("function_call", "custom_tool_call")]
    return body["choices"][0]["message"].get("tool_calls") or []


def text_of(protocol: str, body: dict[str, Any]) -> str:
    if protocol == "anthropic":
        return "".join(b["text"] for b in body["content"] if b["type"] == "text")
    if protocol == "responses":
        return "".join(i["content"][0]["text"] for i in body["output"] if i["type"] == "message")
    return body["choices"][0]["message"]["content"] or ""


def stop_of(protocol: str, body: dict[str, Any]) -> str:
    if protocol == "anthropic":
        return body["stop_reason"]
    if protocol == "responses":
        return body["status"]
    return body["choices"][0]["finish_reason"]


async def post(h: Any, protocol: str, body: dict[str, Any] | None = None, key: str = "sess-a",
               headers: dict[str, str] | None = None) -> Any:
    path, default = REQUESTS[protocol]
    return await h.client.post(path, json=body or default,
                               headers={"Authorization": f"Bearer {key}", **(headers or {})})


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_request_without_tools_never_gets_a_tool_call(make_harness, protocol: str) -> None:
    """OpenCode's title request offers no tools; a policy that answers it with a call must come back as
    text (end of turn), or the client receives a call to a tool it never offered."""
    h = await make_harness([f"Title {CALL}"])
    r = await post(h, protocol)
    assert r.status == 200, await r.text()
    body = await r.json()
    assert tool_calls_of(protocol, body) == []
    assert text_of(protocol, body) == f"Title {CALL}"
    assert stop_of(protocol, body) in ("end_turn", "completed", "stop")
    record = h.sessions.get("sess-a").records[0]
    assert record.tool_calls == 0 and record.parse_failures == 0 and record.stop_reason == "end_turn"


class InFlightEngine:
    """The scripted policy with a pause before each call, counting calls in flight per session."""

    def __init__(self, inner: ScriptedPolicyEngine, pause_s: float = 0.3) -> None:
        self.inner = inner
        self.pause_s = pause_s
        self.calls = inner.calls
        self.in_flight: dict[str | None, int] = {}
        self.most: dict[str | None, int] = {}

    async def generate(self, token_ids: list[int], params: SamplingParams, *, session_id: str | None = None
                       ) -> GenerateResult:
        self.in_flight[session_id] = self.in_flight.get(session_id, 0) + 1
        self.most[session_id] = max(self.most.get(session_id, 0), self.in_flight[session_id])
        try:
            await asyncio.sleep(self.pause_s)
            return await self.inner.generate(token_ids, params, session_id=session_id)
        finally:
            self.in_flight[session_id] -= 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("stream", [False, True])
async def test_concurrent_identical_requests_on_one_session_are_serialised(
    make_harness, tiny_model_dir: Path, protocol: str, stream: bool
) -> None:
    """Two requests on one session's main chain at once (a retry racing the original): both are answered,
    one after the other, and the second is recorded as a repeat of the first instead of both being
    planned against the same chain state."""
    engine = InFlightEngine(ScriptedPolicyEngine(tiny_model_dir, ["One.", "Two."]))
    h = await make_harness(backend=engine)
    body = dict(REQUESTS[protocol][1], stream=stream)
    first, second = await asyncio.gather(post(h, protocol, body), post(h, protocol, body))
    assert first.status == second.status == 200
    if stream:
        for r in (first, second):
            assert parse_sse(await r.text())
    assert engine.most["sess-a"] == 1, "two turns of one chain ran on the engine at once"
    records = h.sessions.get("sess-a").records
    assert [r.turn for r in records] == [0, 1]
    assert [r.repeat_of for r in records] == [None, 0]
    assert [r.kind for r in records] == ["main", "main"]


async def test_different_chains_of_one_session_still_run_concurrently(make_harness, tiny_model_dir: Path) -> None:
    """OpenCode's title request runs beside its first main turn: side chains are not held up by main."""
    engine = InFlightEngine(ScriptedPolicyEngine(tiny_model_dir, lambda p, i: "ok"))
    h = await make_harness(backend=engine)
    title = {"model": "m", "messages": [{"role": "system", "content": "You are a title generator. Be brief."},
                                        {"role": "user", "content": "hi"}]}
    a, b = await asyncio.gather(post(h, "chat"), post(h, "chat", title))
    assert a.status == b.status == 200
    assert engine.most["sess-a"] == 2
    assert sorted((r.kind, r.side_label) for r in h.sessions.get("sess-a").records) == [
        ("main", None), ("side", "title")]


async def test_a_request_waiting_behind_a_failing_turn_is_refused_not_run(make_harness) -> None:
    """The first turn fails the session (engine fault); the request queued behind it must not reach
    the engine of a failed session."""

    class FailOnce:
        calls = 0

        async def generate(self, token_ids: list[int], params: SamplingParams, *,
                           session_id: str | None = None) -> GenerateResult:
            FailOnce.calls += 1
            await asyncio.sleep(0.2)
            return GenerateResult(output_ids=[1, 2], logprobs=[-0.1], finish_reason="stop")

    h = await make_harness(backend=FailOnce())
    first, second = await asyncio.gather(post(h, "chat"), post(h, "chat"))
    assert first.status >= 500 and second.status >= 400
    assert "already failed" in (await second.json())["error"]["message"]
    assert FailOnce.calls == 1
    session = h.sessions.get("sess-a")
    assert session.infra_failure is not None and session.records == []


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_repeated_identical_request_is_labelled(make_harness, protocol: str) -> None:
    """A client retry of an answered request (Codex's stream retries) is answered again and labelled
    with the turn it repeats; a different request in between does not hide it."""
    h = await make_harness(["A.", "B.", "C."])
    other = {**REQUESTS[protocol][1]}
    if protocol == "responses":
        other["input"] = "something else"
    else:
        other["messages"] = [{"role": "user", "content": "something else"}]
    for body in (None, other, None):
        r = await post(h, protocol, body)
        assert r.status == 200
    records = h.sessions.get("sess-a").records
    assert [r.repeat_of for r in records] == [None, None, 0]
    assert len(h.engine.calls) == 3


def _chat(model: str, max_tokens: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": HI}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


async def test_unknown_model_name_is_logged_once_per_session(
    make_harness, renderer: Any, tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The served model answers whatever name a request carries; a name that is neither the served one
    nor in ``adapter.model_aliases`` is logged once per session (not once per request)."""
    from lego_rl.adapter.core import AdapterCore

    h = await make_harness(["a"] * 8, sessions=("sess-a", "sess-b"))
    h.core.known_models = AdapterCore(renderer, h.engine, max_context_tokens=4096, model_name="lego",
                                      model_aliases=["claude-haiku-4-5"]).known_models
    caplog.set_level("WARNING", logger="lego_rl.adapter.core")
    for key, model in [("sess-a", "gpt-9"), ("sess-a", "gpt-9"), ("sess-a", "lego"), ("sess-a", "claude-haiku-4-5"),
                       ("sess-b", "gpt-9")]:
        r = await h.client.post("/v1/chat/completions", json=_chat(model), headers={"Authorization": f"Bearer {key}"})
        assert r.status == 200
    warned = [rec.getMessage() for rec in caplog.records if "served model" in rec.getMessage()]
    assert len(warned) == 2, warned
    assert all("'gpt-9'" in w and "adapter.model_aliases" in w for w in warned)
    assert ["sess-a" in warned[0], "sess-b" in warned[1]] == [True, True]


async def test_client_output_limit_above_the_cap_is_logged_once(make_harness, caplog: pytest.LogCaptureFixture
                                                                ) -> None:
    """Claude Code asks for 128000 output tokens; the adapter's cap (here the core's 1024) cuts first and the
    CLI then reports its own number. The operator is told once per session which cap applies."""
    h = await make_harness(["a"] * 4)
    caplog.set_level("WARNING", logger="lego_rl.adapter.core")
    for limit in (128000, 128000, 10):
        r = await post(h, "chat", _chat("lego", limit))
        assert r.status == 200
    warned = [rec.getMessage() for rec in caplog.records if "caps a reply" in rec.getMessage()]
    assert len(warned) == 1 and "128000" in warned[0] and "CLAUDE_CODE_MAX_OUTPUT_TOKENS=1024" in warned[0]


CAPTURES = Path("/work/shared/captures")


def _claude_main_body() -> dict[str, Any]:
    """Claude Code 2.1.332's first main request, as captured from the real CLI (or a reduced copy of its
    shape where the capture folder is absent)."""
    import json

    path = CAPTURES / "claude" / "01-request.json"
    if path.is_file():
        return json.loads(path.read_text())["body"]
    return {"model": "claude-opus-5-5", "max_tokens": 128000, "stream": True,
            "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332"},
                       {"type": "text", "text": "You are a Claude agent."}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}],
            "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}]}


TITLE_SCHEMA = {"type": "json_schema", "schema": {"type": "object", "properties": {"title": {"type": "string"}},
                                                  "required": ["title"], "additionalProperties": False}}


@pytest.mark.parametrize(
    ("change", "headers", "label"),
    [
        ({}, {}, None),  # the main turn
        ({"messages": [{"role": "user", "content": "quota"}], "max_tokens": 1, "tools": None}, {}, "quota"),
        ({"tools": None, "output_config": {"effort": "low", "format": TITLE_SCHEMA}}, {}, "title"),
        ({"tools": None, "output_format": TITLE_SCHEMA}, {}, "title"),  # the SDK's deprecated spelling
        ({"tools": None, "output_format": {"type": "json_schema", "schema": {
            "type": "object", "properties": {"selected_memories": {"type": "array"}}}}}, {},
         "structured:selected_memories"),
        ({}, {"x-claude-code-request-class": "compaction"}, "compaction"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello."}, {"type": "text", "text":
            "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\n\nYour task is to create a detailed "
            "summary of the conversation so far, paying close attention to the user's explicit requests"}]}]}, {},
         "compaction"),  # Claude Code 2.1 in -p mode: no header, the ask appended to the last user message
        ({"messages": [{"role": "user", "content": [{"type": "text", "text":
            "Please create a detailed summary of the conversation so far."}]}]}, {}, None),  # a task, not the ask
        ({}, {"x-claude-code-request-class": "auxiliary", "x-claude-code-auxiliary-type": "generate_session_title"},
         "generate_session_title"),
        ({}, {"x-claude-code-request-class": "subagent", "x-claude-code-agent-type": "Explore"}, "subagent:Explore"),
        ({}, {"x-claude-code-request-class": "main"}, None),
        ({"messages": [{"role": "user", "content": "quota"}], "max_tokens": 1}, {}, None),  # tools offered: a turn
    ],
    ids=["main", "quota", "title", "title-deprecated", "structured", "compaction", "compaction-text",
         "summary-task", "auxiliary", "subagent", "main-header", "quota-with-tools"],
)
def test_claude_code_side_request_shapes_are_labelled(change: dict[str, Any], headers: dict[str, str],
                                                      label: str | None) -> None:
    from lego_rl.adapter.anthropic import AnthropicDialect

    body = {k: v for k, v in {**_claude_main_body(), **change}.items() if v is not None}
    req = AnthropicDialect().parse_request(body, path="/v1/messages", query={}, headers=headers)
    assert req.side_label == label


async def test_quota_probe_is_a_side_request_off_the_main_chain(make_harness) -> None:
    h = await make_harness(["Hello.", "x", "Again."])
    main = {"model": "m", "max_tokens": 50, "messages": HI,
            "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}]}
    quota = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "quota"}]}
    for body in (main, quota):
        r = await post(h, "anthropic", body)
        assert r.status == 200
    records = h.sessions.get("sess-a").records
    assert [(r.kind, r.side_label) for r in records] == [("main", None), ("side", "quota")]
    assert set(h.sessions.get("sess-a").chains) == {"main", "side:quota"}
