"""Options from config and environment, and the exact command lines the four plugins build."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lego_rl.errors import ConfigError
from lego_rl.harness import RunRequest, get_harness, get_plugin_manager
from lego_rl.harness.base import merge_flag_args

PM = None


def harness(name: str, env: dict[str, str] | None = None, **overrides: object):  # type: ignore[no-untyped-def]
    global PM
    PM = PM or get_plugin_manager({})
    return get_harness(name, overrides, environ=env or {}, pm=PM)


def request(**kw: object) -> RunRequest:
    base = dict(
        session_id="sess-42",
        base_url="http://127.0.0.1:18091",
        model="qwen-tiny",
        prompt="Fix the bug.",
        workdir="/testbed",
        time_budget_s=60,
        max_turns=7,
        max_context_tokens=32768,
        max_response_tokens=1024,
    )
    return RunRequest(**(base | kw))  # type: ignore[arg-type]


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_claude_code_command_matches_the_reference_defaults() -> None:
    spec = harness("claude_code").command(request())
    argv = spec.argv
    assert argv[0] == "/opt/lego/claude_code/2.1.332-native/claude"
    assert flag(argv, "-p") == "Fix the bug."
    assert flag(argv, "--output-format") == "stream-json" and "--verbose" in argv
    assert flag(argv, "--max-turns") == "7"
    assert flag(argv, "--tools") == "Bash,Read,Edit,Write,Glob,Grep"
    assert "--disable-slash-commands" in argv and "--dangerously-skip-permissions" in argv
    env = spec.env
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:18091" and env["ANTHROPIC_API_KEY"] == "sess-42"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1" and env["IS_SANDBOX"] == "1"
    assert env["MAX_THINKING_TOKENS"] == "4096" and env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "1024"
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "32768" and env["CLAUDE_AUTOCOMPACT_PCT_OVERRIDE"] == "70"
    assert spec.user == "agent" and spec.cwd == "/testbed"


def test_extra_args_and_envs_override_defaults_and_vime_names_are_accepted() -> None:
    env = {
        "VIME_AGENT_CC_EXTRA_ARGS": "--max-turns 40 --tools Bash,Read",
        "VIME_AGENT_CC_EXTRA_ENVS": '{"MAX_THINKING_TOKENS": 8192, "FOO": "bar"}',
    }
    spec = harness("claude_code", env).command(request())
    assert spec.argv.count("--max-turns") == 1 and flag(spec.argv, "--max-turns") == "40"
    assert flag(spec.argv, "--tools") == "Bash,Read"
    assert spec.env["MAX_THINKING_TOKENS"] == "8192" and spec.env["FOO"] == "bar"


def test_lego_name_wins_over_vime_name_and_config_wins_over_both() -> None:
    env = {"LEGO_AGENT_CC_EXTRA_ARGS": "--a", "VIME_AGENT_CC_EXTRA_ARGS": "--b"}
    assert harness("claude_code", env).options.extra_args == ["--a"]
    assert harness("claude_code", env, extra_args=["--c"]).options.extra_args == ["--c"]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{not json", "not valid JSON"),
        ('["a"]', "must be a JSON object"),
        ('{"A": {"x": 1}}', "must be a string"),
    ],
)
def test_bad_extra_envs_name_the_variable(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        harness("codex", {"LEGO_AGENT_CODEX_EXTRA_ENVS": value})
    assert "$LEGO_AGENT_CODEX_EXTRA_ENVS" in str(info.value)


def test_unknown_config_key_is_refused_with_its_name() -> None:
    with pytest.raises(ConfigError, match=r"unknown key `harness.opencode.tiltle` \(did you mean "
                       r"`harness.opencode.title`\?\); known keys of \[harness.opencode\]: version, ") as info:
        harness("opencode", tiltle="typo")
    assert info.value.parameter == "harness.opencode.tiltle"


def test_options_handed_to_the_wrong_plugin_are_named() -> None:
    codex_options = harness("codex").options
    from lego_rl.errors import HarnessError

    with pytest.raises(HarnessError, match="CodexConfig, not its OpenCodeConfig"):
        PM.hook.lego_harness_toolchain(harness="opencode", options=codex_options)  # type: ignore[union-attr]


def test_codex_autocompact_share_is_validated_and_0_tells_codex_no_window() -> None:
    argv = harness("codex", autocompact_pct=0).command(request(max_context_tokens=65536)).argv
    settings = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-c")
    assert "model_context_window" not in settings and "model_auto_compact_token_limit" not in settings
    for bad in (-1, 101):
        with pytest.raises(ConfigError) as info:
            harness("codex", autocompact_pct=bad)
        assert info.value.parameter == "harness.codex.autocompact_pct"


def test_extra_args_as_a_shell_line_and_numeric_envs_from_config() -> None:
    h = harness("codex", extra_args="--a 'b c'", extra_envs={"N": 8192})
    assert h.options.extra_args == ["--a", "b c"] and h.options.extra_envs == {"N": "8192"}
    with pytest.raises(ConfigError, match="harness.codex.extra_args: .*cannot split") as info:
        harness("codex", extra_args="--a 'unterminated")
    assert info.value.parameter == "harness.codex.extra_args"
    with pytest.raises(ConfigError) as info:
        harness("codex", extra_envs={"FLAG": True})
    assert info.value.parameter == "harness.codex.extra_envs.FLAG"


def test_tarball_variables_select_the_install_path(tmp_path: Path) -> None:
    assert harness("claude_code").options.install_from == "native"
    npm = harness(
        "claude_code", {"LEGO_AGENT_NODE_TARBALL": "/x/node.tar.xz", "VIME_AGENT_CC_TARBALL": "/x/cc.tgz"}
    )
    assert npm.options.install_from == "npm"
    assert [p.role for p in npm.toolchain_pins()] == ["node", "cli", "native"]
    assert npm.command(request()).argv[:2] == [
        "/opt/lego/node/22.23.5/bin/node",
        "/opt/lego/claude_code/2.1.332-npm/node_modules/@anthropic-ai/claude-code/cli-wrapper.cjs",
    ]
    both = harness(
        "claude_code", {"LEGO_AGENT_CC_NATIVE_TARBALL": "/x/n.tgz", "LEGO_AGENT_CC_TARBALL": "/x/c.tgz"}
    )
    assert both.options.install_from == "native"  # the native archive takes precedence
    codex = harness("codex", {"LEGO_AGENT_CODEX_TARBALL": "/x/c.tgz"})
    assert codex.options.install_from == "npm"


def test_codex_command_points_a_responses_provider_at_the_adapter() -> None:
    spec = harness("codex").command(request())
    argv = spec.argv
    assert argv[1:3] == ["exec", "--json"] and "--skip-git-repo-check" in argv
    assert "--dangerously-bypass-approvals-and-sandbox" in argv
    disabled = {argv[i + 1] for i, a in enumerate(argv) if a == "--disable"}
    assert {"plugins", "multi_agent", "goals", "unbounded_connection_retries"} <= disabled
    settings = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-c")
    assert settings["model_provider"] == '"lego"'
    assert settings["model_providers.lego.base_url"] == '"http://127.0.0.1:18091/v1"'
    assert settings["model_providers.lego.wire_api"] == '"responses"'
    assert settings["model_providers.lego.env_key"] == '"LEGO_SESSION_KEY"'
    # One turn is one request: no stream or request retries, and no idle cut inside the time budget.
    assert settings["model_providers.lego.stream_max_retries"] == "0"
    assert settings["model_providers.lego.request_max_retries"] == "0"
    assert int(settings["model_providers.lego.stream_idle_timeout_ms"]) >= request().time_budget_s * 1000
    assert settings["web_search"] == '"disabled"' and settings["analytics.enabled"] == "false"
    # The rollout's window, compacted at 70 % of it like Claude Code (Codex knows no window for our model).
    assert settings["model_context_window"] == "32768"
    assert settings["model_auto_compact_token_limit"] == str(32768 * 70 // 100)
    assert spec.env["LEGO_SESSION_KEY"] == "sess-42"
    assert not spec.env["CODEX_HOME"].startswith("/tmp/")
    assert argv[-2:] == ["--", "Fix the bug."]
    assert get_harness("codex", environ={}, pm=PM).adapter_options() == {
        "protocol": "responses",
        "force_stream": True,
        "enforce_turn_limit": True,
    }


def test_opencode_config_and_flags() -> None:
    h = harness("opencode")
    spec = h.command(request())
    assert spec.argv[1:4] == ["run", "--format", "json"] and flag(spec.argv, "--title") == "lego rollout"
    assert spec.env["OPENCODE_DISABLE_MODELS_FETCH"] == "1"
    assert spec.argv[-2:] == ["--", "Fix the bug."]  # a prompt starting with "-" is not taken for a flag
    ((path, text),) = spec.files.items()
    assert path.endswith("/.config/opencode/opencode.json") and not path.startswith("/testbed")
    cfg = json.loads(text)
    provider = cfg["provider"]["lego"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"] == {"baseURL": "http://127.0.0.1:18091/v1", "apiKey": "sess-42"}
    assert provider["models"]["qwen-tiny"]["tool_call"] is True
    assert cfg["agent"]["build"]["steps"] == 7 and cfg["model"] == "lego/qwen-tiny"
    assert "/opt/lego/opencode/1.18.33/plugin/." in spec.prelude  # plugin tree copied into the config dir
    assert h.adapter_options() == {
        "protocol": "chat",
        "force_stream": True,
        "enforce_turn_limit": False,
        "max_requests": 400,
    }


def test_openhands_runner_gets_its_settings_from_a_file() -> None:
    spec = harness("openhands").command(request())
    # The toolchain's Python by default; setting `python` selects the image's interpreter.
    assert spec.argv[0] == "/opt/lego/python/3.13/bin/python3.13"
    assert spec.argv[1] == "/opt/lego/openhands/1.58.2-py3.13-lego_openhands_runner.py"
    image = harness("openhands", python="python3.13")
    assert image.command(request()).argv[0] == "python3.13"
    assert [p.kind for p in image.toolchain_pins()] == ["pypi"]
    run = json.loads(spec.files[spec.argv[2]])
    assert run["base_url"] == "http://127.0.0.1:18091/v1" and run["api_key"] == "sess-42"
    assert run["max_turns"] == 7 and run["model"] == "qwen-tiny"
    assert spec.env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"


KEY_CARRIERS = {"ANTHROPIC_API_KEY", "LEGO_SESSION_KEY"}
"""Where a CLI takes its API key: the session id travels there (a request header), never into a path."""


@pytest.mark.parametrize("name", ["claude_code", "codex", "opencode", "openhands"])
def test_the_session_id_reaches_the_cli_only_as_its_api_key(name: str) -> None:
    """Red team: a rollout's id (it carries the task's instance id) must not reach anything the CLI can show
    the model. Claude Code renders its HOME into the system prompt; a per-session HOME made every rollout's
    prompt unique. Two sessions get the same command apart from the key."""
    a = harness(name).command(request(session_id="django__django-11099-s3"))
    b = harness(name).command(request(session_id="g00007-other-task-5"))
    assert a.argv == b.argv and a.cwd == b.cwd and a.prelude == b.prelude
    assert list(a.files) == list(b.files)  # the paths of its config files
    assert {k: v for k, v in a.env.items() if k not in KEY_CARRIERS} == {
        k: v for k, v in b.env.items() if k not in KEY_CARRIERS
    }
    for text in [*a.argv, *a.files, *(v for k, v in a.env.items() if k not in KEY_CARRIERS)]:
        assert "11099" not in text, text
    keys = {k for k, v in a.env.items() if v == "django__django-11099-s3"}
    files = [k for k, v in a.files.items() if "django__django-11099-s3" in v]
    assert keys <= KEY_CARRIERS and (keys or files), "the CLI must still get the session id as its key"


def test_merge_flag_args() -> None:
    assert merge_flag_args(["-p", "x", "--max-turns", "3", "--verbose"], ["--max-turns=9"]) == [
        "-p",
        "x",
        "--verbose",
        "--max-turns=9",
    ]
    assert merge_flag_args(["--a", "--b", "1"], []) == ["--a", "--b", "1"]


def test_opencode_turns_off_sub_agents_and_web_fetch() -> None:
    cfg = json.loads(next(iter(harness("opencode").command(request()).files.values())))
    assert cfg["agent"]["build"]["tools"] == {"task": False, "webfetch": False}


def test_classifiers_read_each_clis_final_events() -> None:
    from lego_rl.harness import HarnessOutcome

    def outcome(log: str, code: int = 1) -> HarnessOutcome:
        return HarnessOutcome(harness="x", exit_code=code, duration_s=1, event_log=log)

    pm = PM or get_plugin_manager({})
    classify = pm.hook.lego_harness_classify
    r = request()
    cc = classify(
        harness="claude_code",
        request=r,
        outcome=outcome('{"type":"system"}\n{"type":"result","subtype":"error_max_turns","is_error":true}'),
    )
    assert cc.kind == "turn_limit"
    cc = classify(
        harness="claude_code",
        request=r,
        outcome=outcome(
            '{"type":"result","subtype":"success","is_error":true,"terminal_reason":"api_error","result":"API Error"}'
        ),
    )
    assert cc.kind == "adapter_error"
    codex = classify(
        harness="codex",
        request=r,
        outcome=outcome(
            '{"type":"turn.failed","error":{"message":"Connection failed: error sending request"}}'
        ),
    )
    assert codex.kind == "adapter_error" and "Connection failed" in codex.detail
    # An engine failure inside the stream (response.failed), as Codex 0.162 words it (real run, issue 16).
    codex = classify(
        harness="codex",
        request=r,
        outcome=outcome(
            '{"type":"turn.failed","error":{"message":"stream disconnected before completion: model engine '
            'error: generate r-1: no replica answered within 30s"}}'
        ),
    )
    assert codex.kind == "adapter_error"
    oc = classify(
        harness="opencode", request=r, outcome=outcome("\n".join(['{"type":"step_finish"}'] * 7), 0)
    )
    assert oc.kind == "turn_limit"
    oc = classify(
        harness="opencode",
        request=r,
        outcome=outcome('{"type":"error","error":{"name":"APIError","data":{"statusCode":400}}}'),
    )
    assert oc.kind == "adapter_error"
    oh = classify(
        harness="openhands",
        request=r,
        outcome=outcome(
            '{"type":"lego_result","status":"error","error":{"code":"MaxIterationsReached","detail":"limit 7"}}'
        ),
    )
    assert oh.kind == "turn_limit"
    plain = outcome('{"type":"result","subtype":"success","is_error":false}', 0)
    assert classify(harness="claude_code", request=r, outcome=plain).kind == "completed"
