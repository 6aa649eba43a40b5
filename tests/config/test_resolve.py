from __future__ import annotations

from pathlib import Path

import pytest

from lego_rl.config.envmap import ENV_VARS
from lego_rl.config.resolve import resolve
from lego_rl.errors import ConfigError


def test_reference_defaults(workdir: Path) -> None:
    c = resolve(environ={}).config
    assert c.agent.time_budget_s == 1200
    assert c.grader.timeout_s == 180
    assert c.rollout.guard_s == 1200 + 180 + 300
    assert c.sandbox.boot_concurrency == 2
    assert c.sandbox.memory_mb == 2048
    assert (c.adapter.bind_host, c.adapter.port) == ("0.0.0.0", 18091)
    assert (c.model.max_context_tokens, c.model.max_response_tokens) == (65536, 8192)
    assert c.harness == {}
    assert (c.rollout.temperature, c.rollout.top_p, c.rollout.top_k) == (1.0, 0.95, -1)
    assert c.model.chat_template_kwargs == {"reasoning_effort": "medium"}
    assert c.train.global_batch_size == c.rollout.batch_size * c.rollout.samples_per_prompt
    assert c.sandbox.provider == "sunabako"


def test_precedence_default_file_env_cli(base_toml: Path) -> None:
    base_toml.write_text(base_toml.read_text() + "\n[grader]\ntimeout_s = 100\n")
    r = resolve(base_toml, environ={})
    assert r.config.grader.timeout_s == 100
    assert r.source("grader.timeout_s").detail == "lego.toml:10"  # BASE_TOML opens with a blank line
    r = resolve(base_toml, environ={"SWE_EVAL_TIMEOUT_SEC": "150"})
    assert r.config.grader.timeout_s == 150
    assert r.source("grader.timeout_s").detail == "$SWE_EVAL_TIMEOUT_SEC"
    r = resolve(base_toml, environ={"SWE_EVAL_TIMEOUT_SEC": "150"}, overrides=["grader.timeout_s=170"])
    assert r.config.grader.timeout_s == 170
    assert r.source("grader.timeout_s").kind == "cli"
    assert r.source("agent.time_budget_s").kind == "default"


def test_derived_guard_follows_its_inputs(workdir: Path) -> None:
    r = resolve(environ={"SWE_AGENT_TIME_BUDGET_SEC": "600", "SWE_EVAL_TIMEOUT_SEC": "60"})
    assert r.config.rollout.guard_s == 960
    assert r.source("rollout.guard_s").kind == "derived"
    r = resolve(environ={"SWE_ROLLOUT_GUARD_SEC": "5000"})
    assert r.config.rollout.guard_s == 5000


def test_vime_alias_and_lego_name_set_harness_options(workdir: Path) -> None:
    r = resolve(environ={"VIME_AGENT_CC_TARBALL": "/x/cc.tgz"})
    assert r.config.harness == {"claude_code": {"cli_tarball": "/x/cc.tgz"}}
    assert r.source("harness.claude_code.cli_tarball").detail == "$VIME_AGENT_CC_TARBALL"
    r = resolve(environ={"VIME_AGENT_CC_TARBALL": "/x/old.tgz", "LEGO_AGENT_CC_TARBALL": "/x/new.tgz"})
    assert r.harness_options("claude_code") == {"cli_tarball": "/x/new.tgz"}
    # One variable, two harnesses; an empty harness variable is unset (as the plugins read it).
    r = resolve(environ={"LEGO_AGENT_NODE_TARBALL": "/x/node.tar.xz", "LEGO_AGENT_CODEX_EXTRA_ARGS": ""})
    assert r.config.harness == {"claude_code": {"node_tarball": "/x/node.tar.xz"},
                                "codex": {"node_tarball": "/x/node.tar.xz"}}


def test_opencode_tarball_keeps_its_old_name_as_an_alias(workdir: Path) -> None:
    r = resolve(environ={"LEGO_AGENT_OPENCODE_TARBALL": "/x/old.tgz"})
    assert r.harness_options("opencode") == {"native_tarball": "/x/old.tgz"}
    r = resolve(environ={"LEGO_AGENT_OPENCODE_TARBALL": "/x/old.tgz", "VIME_AGENT_OPENCODE_NATIVE_TARBALL": "/x/n"})
    assert r.harness_options("opencode") == {"native_tarball": "/x/n"}


def test_every_reference_variable_maps_to_its_keys(workdir: Path) -> None:
    keys = [k for v in ENV_VARS for k in v.keys]
    assert len(keys) == len(set(keys)), "two variables set the same key"
    for var in ENV_VARS:
        value = '{"A": "1"}' if var.json else {"int": "3", "float": "3", "bool": "1"}.get(
            _kind(var.key), "/tmp/x" if "tarball" in var.key else "3")
        if var.key == "sandbox.provider":
            value = "bwrap"
        if var.key in {"agent.default_harness", "agent.prompt", "adapter.public_host", "adapter.bind_host",
                       "cluster.train_head", "cluster.gloo_socket_ifname", "agent.sandbox_image_metadata_key"}:
            value = "x"
        r = resolve(environ={var.name: value})
        for key in var.keys:
            assert str(r.source(key)).endswith(f"${var.name}"), (var.name, key)


def _kind(key: str) -> str:
    from lego_rl.config.schema import SECTIONS

    section, _, field = key.rpartition(".")
    if section not in SECTIONS:
        return "str"  # a harness option: kept as text, the plugin's model converts it
    text = str(SECTIONS[section].model_fields[field].annotation)
    return "bool" if "bool" in text else "int" if "int" in text else "float" if "float" in text else "str"


def test_json_env_parsed_and_malformed_names_variable(workdir: Path) -> None:
    r = resolve(environ={"CHAT_TEMPLATE_KWARGS": '{"reasoning_effort": "high", "enable_thinking": true}'})
    assert r.config.model.chat_template_kwargs == {"reasoning_effort": "high", "enable_thinking": True}
    with pytest.raises(ConfigError, match=r"\$VIME_AGENT_CC_EXTRA_ENVS is not valid JSON"):
        resolve(environ={"VIME_AGENT_CC_EXTRA_ENVS": "{MAX: 1"})
    with pytest.raises(ConfigError, match=r"\$CHAT_TEMPLATE_KWARGS must be a JSON object"):
        resolve(environ={"CHAT_TEMPLATE_KWARGS": "[1, 2]"})


def test_generic_lego_variable(workdir: Path) -> None:
    r = resolve(environ={"LEGO_TRAIN_LR": "2e-6", "LEGO_SERVING_URLS": "http://a:1, http://b:2"})
    assert r.config.train.lr == 2e-6
    assert r.config.serving.urls == ["http://a:1", "http://b:2"]


def test_train_worker_list(workdir: Path) -> None:
    assert resolve(environ={"TRAIN_WORKER": "10.0.0.2,10.0.0.3"}).config.cluster.train_workers == [
        "10.0.0.2", "10.0.0.3"]


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("[rollout]\nbatch_sise = 2\n", r"lego.toml:2: unknown key `rollout.batch_sise` \(did you mean "
                                        r"`rollout.batch_size`\?\); known keys of \[rollout\]: prompt_data, "),
        ("[rolout]\nbatch_size = 2\n", r"lego.toml:1: unknown section \[rolout\] \(did you mean `rollout`\?\)"),
        ("[harnes.codex]\nversion = 2\n", r"lego.toml:1: unknown section \[harnes\] \(did you mean `harness`\?\)"),
        ("[harness]\ncodex = 3\n", r"lego.toml:2: `harness.codex` must be a table"),
        ("[harness.\"co dex\"]\nversion = 2\n", r"lego.toml:1: `harness.co dex` is not a harness name"),
        ("[rollout]\nbatch_size = \"two\"\n", r"lego.toml:2: rollout.batch_size: .*integer.*'two'"),
        ("[rollout\nbatch_size = 2\n", r"not valid TOML"),
        ("rollout = 3\n", r"`rollout` must be a table"),
    ],
)
def test_bad_toml_is_one_clear_error(workdir: Path, text: str, pattern: str) -> None:
    path = workdir / "lego.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=pattern):
        resolve(path, environ={})


def test_bad_env_type_names_variable(workdir: Path) -> None:
    with pytest.raises(ConfigError, match=r"\$SWE_BOOT_CONCURRENCY: sandbox.boot_concurrency"):
        resolve(environ={"SWE_BOOT_CONCURRENCY": "many"})


def test_missing_config_file(workdir: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        resolve(workdir / "nope.toml", environ={})


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("rollout.batch_size", "--set expects section.key=value"),
        ("nosection.x=1", "unknown section `nosection`"),
        ("rollout.nokey=1", "unknown key `rollout.nokey`"),
        ("rollout.batchsize=4", r"unknown key `rollout.batchsize` \(did you mean `rollout.batch_size`\?\); "
                                r"known keys of \[rollout\]"),
        ("harness.codex=1", r"--set expects harness.<name>.<key>=value"),
    ],
)
def test_bad_set(workdir: Path, assignment: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve(environ={}, overrides=[assignment])


def test_set_harness_option_and_json_output(workdir: Path) -> None:
    from lego_rl.config.resolve import config_json

    r = resolve(environ={}, overrides=["harness.codex.version=\"0.1\"", "harness.codex.native_tarball=x.tgz"])
    assert r.harness_options("codex") == {"version": "0.1", "native_tarball": str(workdir / "x.tgz")}
    assert config_json(r)["harness"]["codex"]["version"] == {"value": "0.1",
                                                             "source": '--set harness.codex.version="0.1"'}


def test_config_imports_no_engine() -> None:
    """The config knows no harness plugin, sandbox or engine: importing all of it loads none of them (the
    import contracts say the same statically; this is what actually gets loaded)."""
    import subprocess
    import sys

    engines = ("harness", "sandbox", "serving", "adapter", "chat", "trajectory", "rollout", "driver", "compose", "cluster",
               "train", "swe", "images")
    code = ("import sys, lego_rl.config.checks, lego_rl.config.remote, lego_rl.config.envmap; "
            f"print(sorted(m for m in sys.modules if m.split('.')[:2][-1] in {engines!r} "
            "and m.startswith('lego_rl.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_set_reads_toml_values_and_plain_text(workdir: Path) -> None:
    r = resolve(environ={}, overrides=["serving.urls=[\"http://a:1\"]", "agent.default_harness=codex"])
    assert r.config.serving.urls == ["http://a:1"]
    assert r.config.agent.default_harness == "codex"


def test_relative_paths_in_file_resolve_against_the_file(workdir: Path) -> None:
    sub = workdir / "conf"
    sub.mkdir()
    (sub / "lego.toml").write_text('[rollout]\nprompt_data = "../tasks.jsonl"\n')
    r = resolve(sub / "lego.toml", environ={})
    assert r.config.rollout.prompt_data == str(workdir / "tasks.jsonl")
