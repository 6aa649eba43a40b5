"""Prefix reuse: exact bridging of turn n+1 onto turn n's ids, and every fallback to a full render."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lego_rl.chat.messages import Message, ToolSpec
from lego_rl.chat.parsers import parse_turn
from lego_rl.chat.prefix import ChainState, PrefixBridge, PromptPlan
from lego_rl.chat.render import ChatRenderer

TOOLS = [ToolSpec(name="bash", parameters={"type": "object", "properties": {"cmd": {"type": "string"}}})]
KW = {"reasoning_effort": "medium"}
START = [Message(role="system", content="You fix bugs."), Message(role="user", content="fix it")]
REPLY = (
    "<think>\nread first\n</think>\n\nLooking.\n"
    "<tool_call>\n<function=bash>\n<parameter=cmd>\ncat a.py\n</parameter>\n</function>\n</tool_call>\n"
    "<tool_call>\n<function=bash>\n<parameter=cmd>\nls\n</parameter>\n</function>\n</tool_call><|im_end|>"
)


@pytest.fixture(scope="module")
def bridge(renderer: ChatRenderer) -> PrefixBridge:
    return PrefixBridge(renderer, verify=True)


def answer(
    bridge: PrefixBridge, chain: ChainState, plan: PromptPlan, sampled: str, *, stopped: bool = True
) -> tuple[list[int], Message]:
    """Play the engine (sampled text encoded with the real tokenizer) and the client's echo of the reply."""
    out = bridge.renderer.encode(sampled)
    turn = parse_turn(bridge.renderer.decode(bridge.renderer.strip_end_of_message(out)), TOOLS)
    bridge.commit(chain, plan, out, stopped=stopped, reply_text=turn.text, reply_calls=turn.tool_calls)
    # The client echoes text and calls but drops the reasoning (as Claude Code may).
    return out, Message(role="assistant", content=turn.text, tool_calls=turn.tool_calls)


def results(echo: Message, order: Sequence[int] = (0, 1)) -> list[Message]:
    return [Message(role="tool", tool_call_id=echo.tool_calls[i].id, content=f"out {i}") for i in order]


def two_turns(bridge: PrefixBridge, **kw: object) -> tuple[ChainState, PromptPlan, list[int], list[Message]]:
    chain = ChainState()
    plan = bridge.plan(chain, START, TOOLS, KW)
    out, echo = answer(bridge, chain, plan, REPLY, **kw)  # type: ignore[arg-type]
    return chain, plan, out, [*START, echo, *results(echo)]


def test_second_turn_is_bridged_exactly(bridge: PrefixBridge, renderer: ChatRenderer) -> None:
    chain, first, out, history = two_turns(bridge)
    assert first.mode == "full" and first.fallback_reason == "no previous turn in this chain"
    plan = bridge.plan(chain, history, TOOLS, KW)
    assert plan.mode == "bridged", plan.fallback_reason
    prefix = first.prompt_ids + out
    assert plan.prompt_ids[: len(prefix)] == prefix
    assert plan.bridge_prefix_len == len(prefix)
    suffix = renderer.decode(plan.prompt_ids[len(prefix) :])
    assert suffix == (
        "\n<|im_start|>user\n<tool_response>\nout 0\n</tool_response>\n<tool_response>\nout 1\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    # The dropped reasoning survives in the ids; a full render of the echo would have lost it.
    assert "read first" in renderer.decode(plan.prompt_ids)
    assert "read first" not in renderer.render_text(history, TOOLS, KW)


def test_chain_of_turns_keeps_extending(bridge: PrefixBridge) -> None:
    chain, _, _, history = two_turns(bridge)
    prev = bridge.plan(chain, history, TOOLS, KW)
    for n in range(3):
        out, echo = answer(bridge, chain, prev, f"step {n} done<|im_end|>")
        history = [*history, echo, Message(role="user", content=f"continue {n}")]
        plan = bridge.plan(chain, history, TOOLS, KW)
        assert plan.mode == "bridged", plan.fallback_reason
        assert plan.prompt_ids[: len(prev.prompt_ids) + len(out)] == prev.prompt_ids + out
        prev = plan


def test_tool_arguments_reserialised_by_the_client_still_bridge(bridge: PrefixBridge) -> None:
    chain, _, _, history = two_turns(bridge)
    echo = history[2]
    changed = echo.model_copy(
        update={
            "tool_calls": [
                c.model_copy(update={"arguments": {"cmd": c.arguments["cmd"] + " "}}) for c in echo.tool_calls
            ]
        }
    )  # noqa: E501
    plan = bridge.plan(chain, [*START, changed, *history[3:]], TOOLS, KW)
    assert plan.mode == "bridged"


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (
            lambda h: [h[0], Message(role="user", content="fix it now"), *h[2:]],
            "does not extend any previous turn",
        ),
        (lambda h: [h[1], *h[2:]], "does not extend any previous turn"),  # compacted: system dropped
        (
            lambda h: [*h[:2], h[2].model_copy(update={"content": "Different."}), *h[3:]],
            "not the assistant reply",
        ),
        (
            lambda h: [
                *h[:2],
                h[2].model_copy(
                    update={"tool_calls": [c.model_copy(update={"id": "other"}) for c in h[2].tool_calls]}
                ),
                *h[3:],
            ],  # noqa: E501
            "not the assistant reply",
        ),
        (lambda h: h[:3], "no new message after the previous reply"),
        (lambda h: [*h, Message(role="assistant", content="prefill")], "an assistant message follows"),
    ],
)
def test_changed_histories_fall_back_to_full_render(bridge: PrefixBridge, mutate, reason: str) -> None:  # type: ignore[no-untyped-def]
    chain, _, _, history = two_turns(bridge)
    plan = bridge.plan(chain, mutate(history), TOOLS, KW)
    assert plan.mode == "full"
    assert reason in (plan.fallback_reason or "")
    assert plan.prompt_ids == bridge.renderer.render_ids(mutate(history), TOOLS, KW)


def test_marker_text_in_a_tool_result_still_bridges(bridge: PrefixBridge) -> None:
    # Client text is escaped by the renderer, so its "<|im_end|>" is plain text, not a message boundary.
    chain, _, _, history = two_turns(bridge)
    changed = [*history[:3], history[3].model_copy(update={"content": "has <|im_end|> inside"}), *history[4:]]
    plan = bridge.plan(chain, changed, TOOLS, KW)
    assert plan.mode == "bridged", plan.fallback_reason
    suffix = plan.prompt_ids[plan.bridge_prefix_len :]
    clean = bridge.plan(chain, history, TOOLS, KW)
    marker = bridge.renderer.boundary.marker_id  # type: ignore[union-attr]
    assert suffix.count(marker) == clean.prompt_ids[clean.bridge_prefix_len :].count(marker)
    assert "has <|im_end|> inside" in bridge.renderer.decode(suffix)


def test_changed_tools_or_kwargs_fall_back(bridge: PrefixBridge) -> None:
    chain, _, _, history = two_turns(bridge)
    more = [*TOOLS, ToolSpec(name="read")]
    assert bridge.plan(chain, history, more, KW).fallback_reason == "the tool schemas changed"
    assert bridge.plan(chain, history, TOOLS, {"reasoning_effort": "high"}).fallback_reason == (
        "the chat template kwargs changed"
    )


def test_truncated_output_is_not_bridged(bridge: PrefixBridge) -> None:
    chain = ChainState()
    plan = bridge.plan(chain, START, TOOLS, KW)
    _, echo = answer(bridge, chain, plan, "I was cut o", stopped=False)
    nxt = bridge.plan(chain, [*START, echo, Message(role="user", content="go on")], TOOLS, KW)
    assert nxt.fallback_reason == "the previous output did not end with the end-of-message token"


def test_two_different_turns_for_one_history_are_ambiguous(bridge: PrefixBridge) -> None:
    chain = ChainState()
    plan = bridge.plan(chain, START, TOOLS, KW)
    _, echo = answer(bridge, chain, plan, "<think>a</think>Same answer.<|im_end|>")
    answer(bridge, chain, plan, "<think>b</think>Same answer.<|im_end|>")  # a retry, other reasoning ids
    nxt = bridge.plan(chain, [*START, echo, Message(role="user", content="and?")], TOOLS, KW)
    assert nxt.mode == "full" and "ambiguous" in (nxt.fallback_reason or "")
    # An identical retry (same ids) is not ambiguous.
    chain2 = ChainState()
    plan2 = bridge.plan(chain2, START, TOOLS, KW)
    for _ in range(2):
        _, echo2 = answer(bridge, chain2, plan2, "Same.<|im_end|>")
    assert (
        bridge.plan(chain2, [*START, echo2, Message(role="user", content="and?")], TOOLS, KW).mode
        == "bridged"
    )


def test_longest_matching_turn_wins(bridge: PrefixBridge) -> None:
    chain, _, _, history = two_turns(bridge)
    second = bridge.plan(chain, history, TOOLS, KW)
    out, echo = answer(bridge, chain, second, "All fixed.<|im_end|>")
    plan = bridge.plan(chain, [*history, echo, Message(role="user", content="thanks")], TOOLS, KW)
    assert plan.bridge_prefix_len == len(second.prompt_ids) + len(out)


def test_unwindowed_suffix_matches_windowed(renderer: ChatRenderer, bridge: PrefixBridge) -> None:
    assert bridge.windowed
    slow = PrefixBridge(renderer)
    slow.windowed = False
    chain, _, _, history = two_turns(bridge)
    k = len(START)
    assert slow.suffix_text(history, k, TOOLS, KW) == bridge.suffix_text(history, k, TOOLS, KW)


def test_context_dependent_template_disables_windowing(renderer: ChatRenderer) -> None:
    # Numbers every message: a window renders other numbers than the full history, so the probe must
    # refuse windowing, and bridging must still produce the full render's tail.
    template = (renderer.chat_template or "").replace(
        "{{- '<|im_start|>' ~ message.role ~ '\\n' ~ text_of(message.content)",
        "{{- '<|im_start|>' ~ message.role ~ '\\n' ~ loop.index0 ~ ' ' ~ text_of(message.content)",
    )
    assert template != renderer.chat_template
    numbered = PrefixBridge(ChatRenderer(renderer.tokenizer, chat_template=template), verify=True)
    assert not numbered.windowed
    chain = ChainState()
    plan = numbered.plan(chain, START, TOOLS, KW)
    _, echo = answer(numbered, chain, plan, "ok<|im_end|>")
    plan2 = numbered.plan(chain, [*START, echo, Message(role="user", content="more")], TOOLS, KW)
    assert plan2.mode == "bridged"
    assert numbered.renderer.decode(plan2.prompt_ids).endswith(
        "<|im_start|>user\n3 more<|im_end|>\n<|im_start|>assistant\n"
    )


_content = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r"), max_size=30)


@settings(max_examples=40, deadline=None)
@given(
    outputs=st.lists(_content, min_size=2, max_size=2),
    order=st.permutations([0, 1]),
    follow=st.lists(st.tuples(st.sampled_from(["user", "system"]), _content), max_size=2),
)
def test_bridged_suffix_equals_full_render_tail(
    bridge: PrefixBridge,
    renderer: ChatRenderer,
    outputs: list[str],
    order: list[int],
    follow: list[tuple[str, str]],
) -> None:
    """For any tool outputs and follow-up messages, the bridged suffix is the full render's tail."""
    chain, first, out, history = two_turns(bridge)
    echo = history[len(START)]
    tail = [Message(role="tool", tool_call_id=echo.tool_calls[i].id, content=outputs[i]) for i in order]
    tail += [Message(role=role, content=c) for role, c in follow]  # type: ignore[arg-type]
    msgs = [*START, echo, *tail]
    plan = bridge.plan(chain, msgs, TOOLS, KW)
    if any("<|im_end|>" in m.content for m in tail):
        assert plan.mode == "full"
        return
    assert plan.mode == "bridged", plan.fallback_reason
    suffix_ids = plan.prompt_ids[len(first.prompt_ids) + len(out) :]
    full = renderer.render_text(msgs, TOOLS, KW)
    assert full.endswith(renderer.decode(suffix_ids))
    assert suffix_ids == renderer.encode(renderer.decode(suffix_ids))


def test_echo_matched_by_call_id_only(bridge: PrefixBridge) -> None:
    # A front end that drops a namespace or renames on echo still matches: ids are what we issued.
    chain, _, _, history = two_turns(bridge)
    echo = history[2]
    renamed = echo.model_copy(
        update={
            "tool_calls": [c.model_copy(update={"name": "Bash", "namespace": "x"}) for c in echo.tool_calls]
        }
    )  # noqa: E501
    assert bridge.plan(chain, [*START, renamed, *history[3:]], TOOLS, KW).mode == "bridged"
    reordered = echo.model_copy(update={"tool_calls": echo.tool_calls[::-1]})
    plan = bridge.plan(chain, [*START, reordered, *history[3:]], TOOLS, KW)
    assert plan.mode == "full" and "not the assistant reply" in (plan.fallback_reason or "")
