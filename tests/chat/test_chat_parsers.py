"""Parsing sampled turns (reasoning, qwen3_coder / hermes tool calls) and restoring tool-result order."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lego_rl.chat.messages import Message, ToolCall, ToolSpec
from lego_rl.chat.parsers import (
    merge_assistant_runs,
    parse_turn,
    restore_tool_order,
    split_reasoning,
)
from lego_rl.chat.render import ChatRenderer
from lego_rl.errors import ProtocolError

BASH = ToolSpec(
    name="bash",
    parameters={
        "type": "object",
        "properties": {
            "cmd": {"type": "string"},
            "timeout": {"type": "integer"},
            "background": {"type": "boolean"},
            "env": {"type": "object"},
        },
    },
)
PATCH = ToolSpec(
    name="apply_patch", kind="custom", format={"type": "grammar", "syntax": "lark", "definition": "x"}
)
SPAWN = ToolSpec(
    name="spawn", namespace="agents", parameters={"type": "object", "properties": {"n": {"type": "integer"}}}
)


def _ids() -> itertools.count[int]:
    return itertools.count()


def _xml(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


@pytest.mark.parametrize(
    ("text", "reasoning", "rest"),
    [
        ("<think>\nplan\n</think>\n\nanswer", "plan", "answer"),
        ("plan only closed</think>answer", "plan only closed", "answer"),  # template opened <think>
        ("<think>cut off mid-thought", "cut off mid-thought", ""),
        ("no reasoning here", None, "no reasoning here"),
        # a call opened before the reasoning closed ends it (vLLM's qwen3 grammar does the same)
        ("<think>plan<tool_call>x</tool_call>", "plan", "<tool_call>x</tool_call>"),
        ("<think>a</think>b<tool_call>x</tool_call>", "a", "b<tool_call>x</tool_call>"),
    ],
)
def test_split_reasoning(text: str, reasoning: str | None, rest: str) -> None:
    assert split_reasoning(text) == (reasoning, rest)


def test_qwen3_coder_call_converts_values_by_schema() -> None:
    ids = _ids()
    text = "<think>look</think>\nChecking.\n" + _xml(
        "bash", cmd="123", timeout="30", background="true", env='{"A": "1"}'
    )
    turn = parse_turn(text, [BASH], new_id=lambda: f"c{next(ids)}")
    assert turn.reasoning == "look"
    assert turn.text == "Checking."
    assert turn.parse_failures == 0
    assert turn.tool_calls == [
        ToolCall(
            id="c0",
            name="bash",
            arguments={"cmd": "123", "timeout": 30, "background": True, "env": {"A": "1"}},
        )
    ]


def test_several_calls_mixed_styles_in_one_turn() -> None:
    text = (
        _xml("bash", cmd="ls")
        + "\n"
        + '<tool_call>\n{"name": "bash", "arguments": "{\\"cmd\\": \\"pwd\\"}"}\n</tool_call>'
    )
    turn = parse_turn(text, [BASH])
    assert [c.arguments for c in turn.tool_calls] == [{"cmd": "ls"}, {"cmd": "pwd"}]
    assert len({c.id for c in turn.tool_calls}) == 2
    assert turn.text == ""


def test_hermes_style_forced() -> None:
    turn = parse_turn(
        '<tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}</tool_call>', [BASH], style="hermes"
    )
    assert turn.tool_calls[0].arguments == {"cmd": "ls"}
    forced_xml = parse_turn(
        '<tool_call>{"name": "bash", "arguments": {}}</tool_call>', [BASH], style="qwen3_coder"
    )
    assert forced_xml.tool_calls == [] and forced_xml.parse_failures == 1


@pytest.mark.parametrize(
    "bad",
    [
        "<tool_call>\n<function=bash>\n<parameter=cmd>\nls\n</parameter>\n",  # unterminated
        '<tool_call>{"name": "bash", "arguments": {"cmd": }</tool_call>',  # bad JSON
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        "<tool_call>\nstray<function=bash>\n</function>\n</tool_call>",  # text outside the function block
    ],
)
def test_malformed_call_becomes_text_and_is_counted(bad: str) -> None:
    turn = parse_turn("before " + bad, [BASH])
    assert turn.tool_calls == []
    assert turn.parse_failures == 1
    assert bad.strip() in turn.text and turn.text.startswith("before")


def test_xml_call_is_read_as_leniently_as_vllm_reads_it() -> None:
    """Text between parameters is ignored and a repeated parameter keeps its last value (vLLM's qwen3_coder)."""
    turn = parse_turn("<tool_call>\n<function=bash>\nstray\n<parameter=cmd>\na\n</parameter>\n"
                      "<parameter=cmd>\nb\n</parameter>\n</function>\n</tool_call>", [BASH])
    assert [c.arguments for c in turn.tool_calls] == [{"cmd": "b"}] and turn.parse_failures == 0


def test_malformed_call_next_to_a_good_one() -> None:
    turn = parse_turn('<tool_call>{"name": "bash"</tool_call>\n' + _xml("bash", cmd="ls"), [BASH])
    assert turn.parse_failures == 1
    assert [c.arguments for c in turn.tool_calls] == [{"cmd": "ls"}]
    assert '{"name": "bash"' in turn.text


def test_custom_and_namespaced_tools_map_back() -> None:
    turn = parse_turn(
        _xml("apply_patch", input="*** Begin Patch\n+x\n*** End Patch") + _xml("agents.spawn", n="2"),
        [PATCH, SPAWN],
    )
    patch, spawn = turn.tool_calls
    assert (patch.name, patch.kind, patch.arguments) == (
        "apply_patch",
        "custom",
        {"input": "*** Begin Patch\n+x\n*** End Patch"},
    )
    assert (spawn.name, spawn.namespace, spawn.arguments) == ("spawn", "agents", {"n": 2})


def test_mistyped_value_stays_a_string() -> None:
    # Well-formed call, wrong type: the CLI's validation answers the model, so the call goes through.
    turn = parse_turn(_xml("bash", timeout="soon", env="{broken"), [BASH])
    assert turn.parse_failures == 0
    assert turn.tool_calls[0].arguments == {"timeout": "soon", "env": "{broken"}


def test_unknown_tool_is_still_a_call() -> None:
    # The CLI answers an unknown tool with an error result: that is policy behaviour, not a parse failure.
    turn = parse_turn(_xml("nope", x="1"), [BASH])
    assert turn.tool_calls[0].name == "nope" and turn.tool_calls[0].arguments == {"x": 1}


_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="<>\r"), min_size=1, max_size=40
)


@settings(max_examples=60, deadline=None)
@given(
    cmd=_text,
    timeout=st.integers(-5, 10**6),
    env=st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
)
def test_template_rendered_call_parses_back(
    renderer: ChatRenderer, cmd: str, timeout: int, env: dict[str, str]
) -> None:
    """What the template renders as an assistant tool call is what the parser reads back."""
    call = ToolCall(id="x", name="bash", arguments={"cmd": cmd, "timeout": timeout, "env": env})
    text = renderer.render_text(
        [Message(role="user", content="u"), Message(role="assistant", content="ok", tool_calls=[call])],
        add_generation_prompt=False,
    )
    body = text.split("<|im_start|>assistant\n", 1)[1].rsplit("<|im_end|>", 1)[0]
    turn = parse_turn(body, [BASH], new_id=lambda: "x")
    assert turn.parse_failures == 0
    assert turn.tool_calls == [call]


def _tool(cid: str, content: str = "") -> Message:
    return Message(role="tool", tool_call_id=cid, content=content or f"result {cid}")


def _assistant(*cids: str) -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(id=c, name="bash") for c in cids])


def test_parallel_results_restored_to_call_order() -> None:
    msgs = [Message(role="user", content="go"), _assistant("a", "b", "c"), _tool("c"), _tool("a"), _tool("b"),
            Message(role="user", content="next")]  # fmt: skip
    out = restore_tool_order(msgs)
    assert [m.tool_call_id for m in out[2:5]] == ["a", "b", "c"]
    assert out[0] == msgs[0] and out[-1] == msgs[-1]


@pytest.mark.parametrize(
    ("msgs", "needle"),
    [
        ([_assistant("a"), _tool("zz")], "unknown call id 'zz'"),
        ([_assistant("a", "b"), _tool("a"), _tool("a"), _tool("b")], "duplicate tool result for call id 'a'"),
        ([_assistant("a", "b"), _tool("b"), Message(role="user", content="x")], "['a'] have no tool result"),
        ([Message(role="user", content="x"), _tool("a")], "does not follow an assistant tool call"),
        ([_assistant("a"), _tool("a"), _tool("a")], "duplicate tool result"),
    ],
)
def test_bad_tool_results_are_protocol_errors(msgs: list[Message], needle: str) -> None:
    with pytest.raises(ProtocolError) as err:
        restore_tool_order(msgs)
    assert needle in str(err.value)
    assert err.value.status == 400 and err.value.param


def test_trailing_calls_without_results_are_allowed() -> None:
    msgs = [Message(role="user", content="x"), _assistant("a")]
    assert restore_tool_order(msgs) == msgs


def test_split_assistant_items_are_merged() -> None:
    msgs = [
        Message(role="user", content="x"),
        Message(role="assistant", reasoning="r"),
        Message(role="assistant", content="text"),
        _assistant("a"),
        _tool("a"),
    ]
    out = merge_assistant_runs(msgs)
    assert len(out) == 3
    assert (out[1].content, out[1].reasoning, [c.id for c in out[1].tool_calls]) == ("text", "r", ["a"])


@pytest.mark.parametrize("style", ["auto", "qwen3_coder", "hermes"])
def test_no_tools_offered_means_no_tool_calls(style: str) -> None:
    """OpenCode's title request offers no tools; a sampled call must come back as text, not as a call
    the client has no tool for (it was parsed, and OpenCode's title came back empty)."""
    xml = _xml("bash", cmd="ls")
    hermes = '<tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}</tool_call>'
    turn = parse_turn(f"<think>t</think>Title: {xml}\n{hermes}", [], style=style)  # type: ignore[arg-type]
    assert turn.tool_calls == [] and turn.parse_failures == 0
    assert turn.reasoning == "t"
    assert turn.text == f"Title: {xml}\n{hermes}"


@pytest.mark.parametrize("style", ["qwen3_coder", "hermes"])
def test_complete_call_left_open_at_the_end_counts(style: str) -> None:
    """Output cut right after a complete call body (no ``</tool_call>``): the call stands, as in vLLM."""
    body = ("<function=bash>\n<parameter=cmd>\nls\n</parameter>\n</function>" if style == "qwen3_coder"
            else '{"name": "bash", "arguments": {"cmd": "ls"}}')
    turn = parse_turn(f"run it\n<tool_call>\n{body}\n", [BASH], style=style)  # type: ignore[arg-type]
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("bash", {"cmd": "ls"})]
    assert turn.text == "run it" and turn.parse_failures == 0


def test_reasoning_none_keeps_think_in_text() -> None:
    turn = parse_turn("<think>r</think>answer", reasoning="none")
    assert turn.reasoning is None and turn.text == "<think>r</think>answer"
