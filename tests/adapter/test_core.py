"""AdapterCore.run_turn: bridging across turns, limits, parsing, and refusing bad engine replies.

The policy is the shared TEST DOUBLE ``ScriptedPolicyEngine`` (chosen text, real tokenizer, real tiny-model
logprobs); ``ReplyEngine`` below is a second double that returns one fixed engine reply, to drive the
failure paths a real engine cannot be made to produce on demand.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from support.scripted_engine import ScriptedPolicyEngine, tool_call_text

from lego_rl.adapter.canonical import CanonicalRequest, Message, ToolSpec
from lego_rl.adapter.core import AdapterCore, SamplingDefaults
from lego_rl.adapter.sessions import Session, SessionRegistry
from lego_rl.chat.render import ChatRenderer
from lego_rl.errors import ProtocolError, ProviderError
from lego_rl.serving.protocol import (
    LOGPROB_TOLERANCE,
    GenerateResult,
    NucleusEntry,
    SamplingParams,
    WeightVersionSpan,
)

BASH = ToolSpec(name="bash", parameters={"type": "object", "properties": {"cmd": {"type": "string"}}})
ASK = [
    Message(role="system", content="You are a coding agent."),
    Message(role="user", content="list the files"),
]


class Spy:
    """Records the sampling params the core sends, then delegates to the wrapped engine."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.params: list[SamplingParams] = []

    async def generate(
        self, token_ids: list[int], params: SamplingParams, *, session_id: str | None = None
    ) -> Any:
        self.params.append(params)
        return await self.inner.generate(token_ids, params, session_id=session_id)


class ReplyEngine:
    """TEST DOUBLE: answers every call with one fixed reply (to produce malformed engine replies)."""

    def __init__(self, reply: GenerateResult) -> None:
        self.reply = reply
        self.calls = 0
        self.extras: list[dict[str, bool]] = []

    async def generate(
        self, token_ids: list[int], params: SamplingParams, *, session_id: str | None = None, **extras: bool
    ) -> Any:
        self.calls += 1
        self.extras.append(extras)
        return self.reply


def make_core(renderer: ChatRenderer, engine: Any, **kw: Any) -> AdapterCore:
    kw.setdefault("max_context_tokens", 4096)
    return AdapterCore(renderer, engine, verify_bridges=True, **kw)


def req(messages: list[Message], **kw: Any) -> CanonicalRequest:
    kw.setdefault("protocol", "anthropic")
    return CanonicalRequest(messages=messages, tools=[BASH], **kw)


@pytest.fixture
def session() -> Session:
    return SessionRegistry().open("rollout-1", template_kwargs={"reasoning_effort": "medium"})


async def test_tool_loop_records_engine_ids_and_bridges(
    tiny_model_dir: Path, renderer: ChatRenderer, session: Session
) -> None:  # noqa: E501
    calls = tool_call_text("bash", {"cmd": "ls"}) + "\n" + tool_call_text("bash", {"cmd": "pwd"})
    engine = ScriptedPolicyEngine(
        tiny_model_dir, ["<think>\nlook first\n</think>\n\nChecking.\n" + calls, "Two files."]
    )
    core = make_core(renderer, engine)
    first = await core.run_turn(session, req(ASK))
    assert (first.stop, first.text, first.reasoning) == ("tool_use", "Checking.", "look first")
    assert [c.arguments for c in first.tool_calls] == [{"cmd": "ls"}, {"cmd": "pwd"}]
    assert all(c.id.startswith("toolu_") for c in first.tool_calls)
    # Results arrive in completion order; the prompt must show them in call order.
    echo = Message(role="assistant", content=first.text, tool_calls=first.tool_calls)
    results = [Message(role="tool", tool_call_id=first.tool_calls[i].id, content=f"out-{i}") for i in (1, 0)]
    second = await core.run_turn(session, req([*ASK, echo, *results]))
    assert (second.stop, second.text) == ("end_turn", "Two files.")

    r1, r2 = session.records
    for rec, call in zip(session.records, engine.calls, strict=True):
        assert (rec.prompt_ids, rec.output_ids, rec.logprobs) == (
            call.prompt_ids,
            call.output_ids,
            call.logprobs,
        )
        assert rec.weight_versions == [0] * len(rec.output_ids)
        assert rec.kind == "main" and rec.protocol == "anthropic" and rec.finish_reason == "stop"
    assert (r1.render_mode, r2.render_mode) == ("full", "bridged")
    assert r2.prompt_ids[: r2.bridge_prefix_len] == r1.prompt_ids + r1.output_ids
    assert (r1.bridge_from_turn, r2.bridge_from_turn) == (None, 0)
    assert (r1.fallback_reason, r2.fallback_reason) == ("no previous turn in this chain", None)
    assert (r1.tool_calls, r1.stop_reason, r2.stop_reason) == (2, "tool_use", "end_turn")
    prompt = renderer.decode(r2.prompt_ids)
    assert "look first" in prompt and "Reasoning effort: medium" in prompt
    assert prompt.index("out-0") < prompt.index("out-1")
    assert all(math.isfinite(x) and x <= 0 for x in r1.logprobs)
    assert r1.text.endswith("<|im_end|>") and r1.engine_s > 0 and r1.total_s >= r1.render_s


async def test_side_requests_stay_out_of_the_main_chain(
    tiny_model_dir: Path, renderer: ChatRenderer, session: Session
) -> None:  # noqa: E501
    engine = ScriptedPolicyEngine(tiny_model_dir, ["First.", "A title", "Second."])
    core = make_core(renderer, engine)
    first = await core.run_turn(session, req(ASK))
    await core.run_turn(session, req([Message(role="user", content="title this")], side_label="title"))
    echo = Message(role="assistant", content=first.text)
    await core.run_turn(session, req([*ASK, echo, Message(role="user", content="go on")]))
    kinds = [(r.kind, r.side_label, r.render_mode) for r in session.records]
    assert kinds == [("main", None, "full"), ("side", "title", "full"), ("main", None, "bridged")]
    assert [r.turn for r in session.main_records()] == [0, 2]
    assert session.records[2].bridge_from_turn == 0  # bridged from the main turn, not the side one


async def test_max_tokens_clamped_to_remaining_context(tiny_model_dir: Path, renderer: ChatRenderer) -> None:
    spy = Spy(ScriptedPolicyEngine(tiny_model_dir, ["Short."] * 4, score=False))
    registry = SessionRegistry()
    prompt_len = len(renderer.render_ids(ASK, [BASH], renderer.merged_kwargs()))
    core = make_core(renderer, spy, max_context_tokens=prompt_len + 10, max_response_tokens=64)
    await core.run_turn(registry.open("a"), req(ASK, max_tokens=500))
    await core.run_turn(registry.open("b", max_response_tokens=7), req(ASK))
    await core.run_turn(registry.open("c", max_context_tokens=prompt_len + 3), req(ASK))
    await core.run_turn(registry.open("d"), req(ASK, max_tokens=5))
    assert [p.max_tokens for p in spy.params] == [10, 7, 3, 5]
    assert all(p.logprobs == 1 and p.stop_token_ids == sorted(renderer.eos_ids) for p in spy.params)


async def test_no_room_left_answers_context_limit_without_calling_the_engine(renderer: ChatRenderer) -> None:
    engine = ReplyEngine(GenerateResult(output_ids=[5], logprobs=[-1.0], finish_reason="stop"))
    prompt_len = len(renderer.render_ids(ASK, [BASH], renderer.merged_kwargs()))
    core = make_core(renderer, engine, max_context_tokens=prompt_len)
    session = SessionRegistry().open("s")
    resp = await core.run_turn(session, req(ASK))
    assert (resp.stop, resp.text, resp.tool_calls, resp.prompt_tokens) == (
        "context_limit",
        "",
        [],
        prompt_len,
    )
    assert engine.calls == 0
    (rec,) = session.records
    assert (rec.output_ids, rec.stop_reason, rec.finish_reason) == ([], "context_limit", "context_limit")
    assert session.termination == "context_limit" and session.infra_failure is None


async def test_output_cut_by_the_window_marks_context_limit(renderer: ChatRenderer) -> None:
    ids = renderer.encode("partial answer")
    engine = ReplyEngine(GenerateResult(output_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="length"))
    prompt_len = len(renderer.render_ids(ASK, [BASH], renderer.merged_kwargs()))
    core = make_core(renderer, engine, max_context_tokens=prompt_len + len(ids))
    session = SessionRegistry().open("s")
    resp = await core.run_turn(session, req(ASK))
    assert resp.stop == "max_tokens" and resp.text == "partial answer"
    assert session.termination == "context_limit"
    # A truncated output cannot be bridged: the next turn is a full render.
    echo = Message(role="assistant", content=resp.text)
    core.max_context_tokens = 4096
    await core.run_turn(session, req([*ASK, echo, Message(role="user", content="continue")]))
    assert session.records[-1].render_mode == "full"


def _reply(ids: list[int], lps: list[float], **kw: Any) -> GenerateResult:
    return GenerateResult(output_ids=ids, logprobs=lps, finish_reason="stop", **kw)


@pytest.mark.parametrize(
    ("reply", "needle"),
    [
        (_reply([5, 6], [-0.1]), "1 logprobs for 2 output tokens"),
        (_reply([5], [float("nan")]), "invalid logprob nan"),
        (_reply([5], [float("-inf")]), "invalid logprob -inf"),
        (_reply([5], [0.7]), "invalid logprob 0.7"),
        (_reply([5], [math.nextafter(LOGPROB_TOLERANCE, 1)]), f"rounding up to {LOGPROB_TOLERANCE} allowed"),
        (_reply([10**6], [-0.1]), "token id 1000000 outside the vocabulary"),
        (_reply([], []), "no output tokens"),
        (
            _reply([5, 6], [-0.1, -0.2], weight_versions=[WeightVersionSpan(version=3, start=0, end=1)]),
            "weight_versions",
        ),
    ],
)
async def test_bad_engine_reply_fails_and_marks_infra_failure(
    renderer: ChatRenderer, reply: GenerateResult, needle: str
) -> None:  # noqa: E501
    core = make_core(renderer, ReplyEngine(reply))
    session = SessionRegistry().open("s")
    with pytest.raises(ProviderError, match=needle):
        await core.run_turn(session, req(ASK))
    assert session.records == []
    assert session.infra_failure is not None and needle in session.infra_failure
    assert session.termination == "infra_failure"
    with pytest.raises(ProviderError, match="already failed") as again:
        await core.run_turn(session, req(ASK))
    # An engine outage, as clients word it (overloaded / server error), never "Failed to authenticate".
    assert again.value.status_code == 503


async def test_parse_failure_is_counted_and_returned_as_text(renderer: ChatRenderer) -> None:
    text = 'I will call it: <tool_call>{"name": "bash", "arguments": {</tool_call>'
    ids = renderer.encode(text + "<|im_end|>")
    core = make_core(renderer, ReplyEngine(_reply(ids, [-0.3] * len(ids))))
    session = SessionRegistry().open("s")
    resp = await core.run_turn(session, req(ASK))
    assert (resp.stop, resp.parse_failures, resp.tool_calls) == ("end_turn", 1, [])
    assert resp.text == text
    assert session.records[0].parse_failures == 1 and session.records[0].tool_calls == 0


async def test_client_sampling_ignored_unless_honoured(tiny_model_dir: Path, renderer: ChatRenderer) -> None:
    spy = Spy(ScriptedPolicyEngine(tiny_model_dir, ["a", "b"], score=False))
    registry = SessionRegistry()
    await make_core(renderer, spy).run_turn(registry.open("x"), req(ASK, temperature=0.0, top_p=0.5))
    honour = SamplingDefaults(temperature=0.7, honour_client=True)
    await make_core(renderer, spy, sampling=honour).run_turn(registry.open("y"), req(ASK, temperature=0.2))
    assert [(p.temperature, p.top_p) for p in spy.params] == [(1.0, 1.0), (0.2, 1.0)]


def test_template_kwargs_precedence(renderer: ChatRenderer) -> None:
    core = AdapterCore(ChatRenderer(renderer.tokenizer, template_kwargs={"reasoning_effort": "high", "x": 1}),
                       ReplyEngine(_reply([5], [-1.0])), max_context_tokens=100)  # fmt: skip
    session = SessionRegistry().open("s", template_kwargs={"reasoning_effort": "medium"})
    r = req(ASK, reasoning_effort="low", template_kwargs={"y": 2})
    assert core.template_kwargs(session, r) == {"reasoning_effort": "medium", "x": 1, "y": 2}
    assert core.template_kwargs(None, r) == {"reasoning_effort": "low", "x": 1, "y": 2}
    assert core.count_tokens(session, r) == len(
        renderer.render_ids(ASK, [BASH], {"reasoning_effort": "medium"})
    )


@pytest.mark.parametrize(
    ("messages", "needle"),
    [
        ([], "no messages"),
        (
            [*ASK, Message(role="tool", tool_call_id="nope", content="x")],
            "does not follow an assistant tool call",
        ),
    ],
)
async def test_bad_requests_record_nothing(
    renderer: ChatRenderer, messages: list[Message], needle: str
) -> None:
    engine = ReplyEngine(_reply([5], [-1.0]))
    session = SessionRegistry().open("s")
    with pytest.raises(ProtocolError, match=needle):
        await make_core(renderer, engine).run_turn(session, req(messages))
    assert session.records == [] and engine.calls == 0 and session.infra_failure is None


async def test_request_limit(renderer: ChatRenderer) -> None:
    ids = renderer.encode("ok<|im_end|>")
    core = make_core(renderer, ReplyEngine(_reply(ids, [-0.1] * len(ids))))
    session = SessionRegistry().open("s", max_requests=2)
    for _ in range(2):
        await core.run_turn(session, req(ASK))
    with pytest.raises(ProtocolError, match="limit of 2 model requests"):
        await core.run_turn(session, req(ASK))
    assert len(session.records) == 2 and session.termination == "request_limit"


async def test_nucleus_and_routing_are_requested_kept_and_required(renderer: ChatRenderer) -> None:
    ids = renderer.encode("ok<|im_end|>")
    nucleus = [NucleusEntry(ids=[t, 7], probs=[0.9, 0.1]) for t in ids]
    routes = [[[1, 2]] for _ in ids]
    full = _reply(ids, [-0.1] * len(ids), nucleus=nucleus, routed_experts=routes)
    engine = ReplyEngine(full)
    core = make_core(renderer, engine, sampling=SamplingDefaults(nucleus=True, routed_experts=True))
    session = SessionRegistry().open("s")
    await core.run_turn(session, req(ASK))
    assert engine.extras == [{"return_nucleus": True, "return_routed_experts": True}]
    rec = session.records[0]
    assert rec.nucleus_ids == [[t, 7] for t in ids] and rec.nucleus_probs == [[0.9, 0.1]] * len(ids)
    assert rec.routed_experts == routes
    # Without the extras asked for, nothing is requested.
    plain = ReplyEngine(full)
    await make_core(renderer, plain).run_turn(SessionRegistry().open("p"), req(ASK))
    assert plain.extras == [{}]
    # Asked for but missing: the request fails and the session is an infrastructure failure.
    bare = make_core(
        renderer, ReplyEngine(_reply(ids, [-0.1] * len(ids))), sampling=SamplingDefaults(nucleus=True)
    )
    failed = SessionRegistry().open("f")
    with pytest.raises(ProviderError, match="no usable nucleus"):
        await bare.run_turn(failed, req(ASK))
    assert failed.infra_failure and failed.records == []


# -- client stop sequences -----------------------------------------------------------------------------


def first_prefix_containing(renderer: ChatRenderer, ids: list[int], needle: str) -> int:
    """Oracle for the kept length, by linear scan: the shortest prefix whose text contains ``needle``."""
    return next(k for k in range(1, len(ids) + 1) if needle in renderer.decode(ids[:k]))


@pytest.mark.parametrize(
    ("stop", "text_before", "kept_text"),
    [
        ("a be", "alph", "alpha be"),  # ends at a token boundary, spanning two tokens ("a" + " be")
        ("a gam", "alpha bet", "alpha beta gamm"),  # ends inside the token "mm", which is kept whole
    ],
)
async def test_stop_sequence_spanning_tokens_cuts_text_and_keeps_the_completing_token(
    tiny_model_dir: Path, renderer: ChatRenderer, stop: str, text_before: str, kept_text: str
) -> None:
    engine = ScriptedPolicyEngine(tiny_model_dir, ["alpha beta gamma delta"])
    core = make_core(renderer, engine)
    session = SessionRegistry().open("s")
    resp = await core.run_turn(session, req(ASK, stop=[stop, "never printed"]))
    assert (resp.text, resp.stop, resp.stop_sequence) == (text_before, "stop_sequence", stop)

    (call,) = engine.calls
    k = first_prefix_containing(renderer, call.output_ids, stop)
    assert stop not in renderer.decode(call.output_ids[: k - 1])
    assert stop[0] not in renderer.decode(call.output_ids[k - 1 : k])  # the match spans several tokens
    (rec,) = session.records
    # Kept: exactly the sampled tokens with their logprobs and versions, up to the completing token.
    assert (rec.output_ids, rec.logprobs) == (call.output_ids[:k], call.logprobs[:k])
    assert rec.weight_versions == [0] * k and resp.completion_tokens == k < len(call.output_ids)
    assert renderer.decode(rec.output_ids) == rec.text == kept_text
    assert (rec.finish_reason, rec.stop_reason) == ("stop", "stop_sequence")
    assert session.termination is None


async def test_earliest_completed_stop_sequence_wins(tiny_model_dir: Path, renderer: ChatRenderer) -> None:
    engine = ScriptedPolicyEngine(tiny_model_dir, ["one two three"] * 2)
    core = make_core(renderer, engine)
    # "two three" starts first, but "o t" completes first: an engine watching its output stops there.
    resp = await core.run_turn(SessionRegistry().open("a"), req(ASK, stop=["two three", "o t"]))
    assert (resp.text, resp.stop_sequence) == ("one tw", "o t")
    # Two matches completing at the same character: the longer one (starting earlier) is reported.
    resp = await core.run_turn(SessionRegistry().open("b"), req(ASK, stop=["wo", "two"]))
    assert (resp.text, resp.stop_sequence) == ("one", "two")


async def test_complete_tool_calls_before_a_stop_sequence_are_still_answered(
    tiny_model_dir: Path, renderer: ChatRenderer
) -> None:
    text = tool_call_text("bash", {"cmd": "ls"}, before="Looking.") + "\nOBSERVATION: invented output"
    core = make_core(renderer, ScriptedPolicyEngine(tiny_model_dir, [text]))
    session = SessionRegistry().open("s")
    resp = await core.run_turn(session, req(ASK, stop=["OBSERVATION:"]))
    assert (resp.stop, resp.stop_sequence, resp.text) == ("tool_use", None, "Looking.")
    assert [c.arguments for c in resp.tool_calls] == [{"cmd": "ls"}]
    assert "invented" not in session.records[0].text  # tokens after the stop are not kept


async def test_stop_sequence_inside_an_output_cut_by_the_window_is_not_a_context_limit(
    renderer: ChatRenderer,
) -> None:
    ids = renderer.encode("partial END and more")
    engine = ReplyEngine(GenerateResult(output_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="length"))
    prompt_len = len(renderer.render_ids(ASK, [BASH], renderer.merged_kwargs()))
    core = make_core(renderer, engine, max_context_tokens=prompt_len + len(ids))
    session = SessionRegistry().open("s")
    resp = await core.run_turn(session, req(ASK, stop=["END"]))
    assert (resp.stop, resp.text) == ("stop_sequence", "partial")  # the parser trims the visible text
    assert session.termination is None and session.records[0].finish_reason == "stop"


async def test_stop_strings_go_to_the_engine_only_when_it_supports_them(
    tiny_model_dir: Path, renderer: ChatRenderer
) -> None:
    spy = Spy(ScriptedPolicyEngine(tiny_model_dir, ["a b", "a b", "a b"], score=False))
    registry = SessionRegistry()
    await make_core(renderer, spy).run_turn(registry.open("x"), req(ASK, stop=["b"]))
    vllm = SamplingDefaults(engine_stop_strings=True)
    await make_core(renderer, spy, sampling=vllm).run_turn(registry.open("y"), req(ASK, stop=["b"]))
    await make_core(renderer, spy, sampling=vllm).run_turn(registry.open("z"), req(ASK))
    sent = [p.model_dump(exclude_none=True) for p in spy.params]  # what the serving client puts on the wire
    assert ["stop" in s for s in sent] == [False, True, False]  # the embedded engine refuses `stop`
    assert sent[1]["stop"] == ["b"] and sent[1]["include_stop_str_in_output"] is True


async def test_an_engine_that_stopped_on_the_string_is_recorded_unchanged(renderer: ChatRenderer) -> None:
    # What vLLM returns for `stop`: sampling ended with the token completing the string, no end-of-message.
    ids = renderer.encode("Hello world. END")
    engine = ReplyEngine(_reply(ids, [-0.25] * len(ids)))
    core = make_core(renderer, engine, sampling=SamplingDefaults(engine_stop_strings=True))
    session = SessionRegistry().open("s")
    resp = await core.run_turn(session, req(ASK, stop=["END"]))
    assert (resp.text, resp.stop, resp.stop_sequence) == ("Hello world.", "stop_sequence", "END")
    assert session.records[0].output_ids == ids and resp.completion_tokens == len(ids)


async def test_after_a_stop_the_next_turn_is_rendered_from_the_echo_and_starts_a_new_segment(
    tiny_model_dir: Path, renderer: ChatRenderer
) -> None:
    from lego_rl.trajectory.manager import build_samples

    engine = ScriptedPolicyEngine(tiny_model_dir, ["Hello world. END and more", "Fine."])
    core = make_core(renderer, engine)
    session = SessionRegistry().open("s")
    first = await core.run_turn(session, req(ASK, stop=["END"]))
    echo = Message(role="assistant", content=first.text)
    await core.run_turn(session, req([*ASK, echo, Message(role="user", content="go on")]))
    r1, r2 = session.records
    assert r2.render_mode == "full" and "end-of-message" in (r2.fallback_reason or "")
    prompt = renderer.decode(r2.prompt_ids)
    assert "Hello world.<|im_end|>" in prompt and "END" not in prompt  # the model sees what the client saw
    samples, _ = build_samples(session.records, rollout_id="r", group_index=0, index=0, reward=1.0)
    assert len(samples) == 2
    for sample, rec in zip(samples, (r1, r2), strict=True):
        trained = [t for t, m in zip(sample.tokens, sample.loss_mask, strict=True) if m]
        assert trained == rec.output_ids and sample.tokens == rec.prompt_ids + rec.output_ids


@pytest.mark.parametrize(("tool", "reasoning"), [("qwen3_coder", "qwen3"), ("hermes", "none")])
async def test_the_configured_parsers_read_the_turn(renderer: ChatRenderer, tiny_model_dir: Path,
                                                    session: Session, tool: str, reasoning: str) -> None:
    """The core reads turns with the parser it is given (serving.tool_call_parser / reasoning_parser): a hermes
    parser does not take a qwen3_coder call, and reasoning ``none`` leaves <think> in the text."""
    from lego_rl.chat.turn_parser import make_turn_parser

    text = "<think>\nlook first\n</think>\n\n" + tool_call_text("bash", {"cmd": "ls"})
    core = make_core(renderer, ScriptedPolicyEngine(tiny_model_dir, [text]),
                     parser=make_turn_parser(tool, reasoning, renderer.tokenizer, use_vllm=False))
    out = await core.run_turn(session, req(ASK))
    if tool == "qwen3_coder":
        assert out.reasoning == "look first" and [c.arguments for c in out.tool_calls] == [{"cmd": "ls"}]
        assert out.stop == "tool_use" and out.parse_failures == 0
    else:
        assert out.reasoning is None and out.tool_calls == [] and out.parse_failures == 1
        assert out.text.startswith("<think>\nlook first\n</think>") and out.stop == "end_turn"
    assert session.records[-1].parse_failures == out.parse_failures
