"""Rendering with the served model's chat template (the real tiny model's tokenizer and template)."""

from __future__ import annotations

import pytest

from lego_rl.chat.messages import Message, ToolCall, ToolSpec
from lego_rl.chat.render import ChatRenderer, RenderError, tool_to_template

USER = [Message(role="system", content="be brief"), Message(role="user", content="hi")]


def test_boundary_probe_finds_im_end_then_newline(renderer: ChatRenderer) -> None:
    b = renderer.boundary
    assert b is not None
    assert (b.marker, b.trailer) == ("<|im_end|>", "\n")
    assert renderer.encode("<|im_end|>") == [b.marker_id]
    # generation_config.json lists <|endoftext|> as a second stop token.
    assert renderer.eos_ids == {b.marker_id, renderer.encode("<|endoftext|>")[0]}


def test_render_ids_equal_tokenised_text(renderer: ChatRenderer) -> None:
    text = renderer.render_text(USER)
    assert text.endswith("<|im_start|>assistant\n")
    ids = renderer.render_ids(USER)
    assert renderer.decode(ids) == text
    assert ids.count(renderer.boundary.marker_id) == 2  # type: ignore[union-attr]


def test_kwargs_are_forwarded_and_layered(renderer: ChatRenderer) -> None:
    r = ChatRenderer(
        renderer.tokenizer, template_kwargs={"reasoning_effort": "high", "enable_thinking": False}
    )
    kw = r.merged_kwargs({"reasoning_effort": "low"}, {"reasoning_effort": "medium"})
    assert kw == {"reasoning_effort": "medium", "enable_thinking": False}
    text = r.render_text(USER, kwargs=kw)
    assert "Reasoning effort: medium" in text
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert "Reasoning effort" not in r.render_text(USER, kwargs={})


def test_tools_and_calls_are_rendered(renderer: ChatRenderer) -> None:
    tools = [
        ToolSpec(
            name="bash",
            description="run",
            parameters={"type": "object", "properties": {"cmd": {"type": "string"}}},
        ),
        ToolSpec(name="spawn", namespace="agents"),
    ]
    call = ToolCall(id="c1", name="spawn", namespace="agents", arguments={"n": 2})
    msgs = [
        *USER,
        Message(role="assistant", content="", reasoning="why", tool_calls=[call]),
        Message(role="tool", tool_call_id="c1", content="spawned"),
    ]
    text = renderer.render_text(msgs, tools)
    assert '"name": "bash"' in text and '"name": "agents.spawn"' in text
    assert "<function=agents.spawn>\n<parameter=n>\n2\n</parameter>" in text
    assert "<think>\nwhy\n</think>" in text  # reasoning after the last user query is kept
    assert "<tool_response>\nspawned\n</tool_response>" in text


def test_custom_tool_schema_carries_grammar() -> None:
    spec = ToolSpec(
        name="apply_patch",
        kind="custom",
        format={"type": "grammar", "syntax": "lark", "definition": "start: x"},
    )
    fn = tool_to_template(spec)["function"]
    assert fn["parameters"]["required"] == ["input"]
    assert "lark grammar:\nstart: x" in fn["parameters"]["properties"]["input"]["description"]


def test_template_error_is_a_render_error(renderer: ChatRenderer) -> None:
    bad = ChatRenderer(renderer.tokenizer, chat_template="{{ raise_exception('no system role here') }}")
    assert bad.boundary is None  # the probe render failed: prefix reuse is off
    with pytest.raises(RenderError, match="no system role here"):
        bad.render_text(USER)


def test_template_without_special_boundary_disables_reuse(renderer: ChatRenderer) -> None:
    plain = ChatRenderer(
        renderer.tokenizer,
        chat_template="{% for m in messages %}{{ m.role }}: {{ m.content }}\n\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}",
    )
    assert plain.boundary is None
    assert plain.render_text(USER) == "system: be brief\n\nuser: hi\n\nassistant: "


def test_strip_end_of_message(renderer: ChatRenderer) -> None:
    ids = renderer.encode("done<|im_end|>")
    assert renderer.decode(renderer.strip_end_of_message(ids)) == "done"
