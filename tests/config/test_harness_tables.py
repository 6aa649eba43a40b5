"""``[harness.<name>]`` tables: from lego.toml (and variables, and --set) to each plugin's own options,
through the path rollouts use (``lego_rl.compose.harnesses``), with errors that name key and line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Literal

import pytest
from pydantic import Field
from typer.testing import CliRunner

from lego_rl.cli.main import app
from lego_rl.config.checks import run_checks
from lego_rl.config.resolve import resolve
from lego_rl.errors import ConfigError
from lego_rl.harness import CommandSpec, HarnessConfig, HarnessPlugin, RunRequest, get_plugin_manager
from lego_rl.compose.harnesses import harness_factory, harness_inventory

CODEX_TOML = """
[harness.codex]
install_from = "npm"
extra_args = "--profile fast"
extra_envs = {RUST_LOG = "info", CODEX_MAX = 3}
native_tarball = "toolchain/codex-native.tgz"
"""


def write(base_toml: Path, text: str) -> Path:
    base_toml.write_text(base_toml.read_text() + text)
    return base_toml


def test_codex_table_in_lego_toml_reaches_the_codex_plugin(base_toml: Path, workdir: Path) -> None:
    r = resolve(write(base_toml, CODEX_TOML), environ={})
    handle = harness_factory(r, environ={})("codex")
    o = handle.options
    assert type(o).__name__ == "CodexConfig"
    assert o.install_from == "npm"  # type: ignore[attr-defined]
    assert o.extra_args == ["--profile", "fast"]
    assert o.extra_envs == {"RUST_LOG": "info", "CODEX_MAX": "3"}
    # A relative path in lego.toml is taken from the file's folder, like every other path.
    assert o.native_tarball == workdir / "toolchain" / "codex-native.tgz"  # type: ignore[attr-defined]
    argv = handle.command(RunRequest(session_id="s", base_url="http://a:1", model="m", prompt="p",
                                     workdir="/testbed", time_budget_s=10)).argv
    assert argv[argv.index("--profile") + 1] == "fast"
    assert r.source("harness.codex.extra_args").detail == "lego.toml:11"


def test_precedence_file_then_variable_then_set(base_toml: Path) -> None:
    write(base_toml, CODEX_TOML)
    env = {"LEGO_AGENT_CODEX_EXTRA_ARGS": "--from-env"}
    r = resolve(base_toml, environ=env)
    assert harness_factory(r, environ=env)("codex").options.extra_args == ["--from-env"]
    assert r.source("harness.codex.extra_args").detail == "$LEGO_AGENT_CODEX_EXTRA_ARGS"
    r = resolve(base_toml, environ=env, overrides=['harness.codex.extra_args=["--from-set"]'])
    assert harness_factory(r, environ=env)("codex").options.extra_args == ["--from-set"]
    assert r.source("harness.codex.extra_args").kind == "cli"


@pytest.mark.parametrize(
    ("table", "parameter", "message"),
    [
        ("disabled_features = 3\n", "harness.codex.disabled_features", r"harness.codex.disabled_features: .*list"),
        ("instal_from = \"npm\"\n", "harness.codex.instal_from",
         r"unknown key `harness.codex.instal_from` \(did you mean `harness.codex.install_from`\?\)"),
        ("install_from = \"pip\"\n", "harness.codex.install_from", r"harness.codex.install_from: .*'native' or 'npm'"),
    ],
)
def test_bad_codex_option_names_key_and_line(base_toml: Path, table: str, parameter: str, message: str) -> None:
    r = resolve(write(base_toml, "\n[harness.codex]\nversion = \"0.162.1\"\n" + table), environ={})
    with pytest.raises(ConfigError, match=message) as info:
        harness_factory(r, environ={})("codex")
    assert info.value.parameter == parameter
    assert info.value.where == "lego.toml:11"  # the offending key's own line
    assert str(info.value).startswith("lego.toml:11: ")


def test_bad_option_from_a_variable_names_the_variable(base_toml: Path) -> None:
    env = {"LEGO_AGENT_CODEX_EXTRA_ARGS": "--a 'unterminated"}
    r = resolve(base_toml, environ=env)
    with pytest.raises(ConfigError, match="cannot split") as info:
        harness_factory(r, environ=env)("codex")
    assert info.value.where == "$LEGO_AGENT_CODEX_EXTRA_ARGS"


def test_table_syntax_errors_are_config_errors_with_lines(base_toml: Path) -> None:
    with pytest.raises(ConfigError, match=r"lego.toml:10: `harness.codex` must be a table") as info:
        resolve(write(base_toml, "\n[harness]\ncodex = 3\n"), environ={})
    assert info.value.parameter == "harness.codex"
    with pytest.raises(ConfigError, match=r"--set expects harness.<name>.<key>=value"):
        resolve(None, environ={}, overrides=["harness.codex=1"])


def test_validate_reports_refused_options_and_unknown_harnesses(base_toml: Path) -> None:
    write(base_toml, "\n[harness.codex]\nversion = 7\n\n[harness.codx]\nversion = \"1\"\n")
    r = resolve(base_toml, environ={})
    findings = {f.code: f for f in run_checks(r, harnesses=harness_inventory(r, environ={}))}
    refused = findings["harness_options"]
    assert refused.severity == "error" and refused.keys == ("harness.codex.version",)
    assert refused.message.startswith("lego.toml:10: harness.codex.version: ")
    unknown = findings["harness_unknown"]
    assert "[harness.codx] (from lego.toml:13)" in unknown.message
    assert "did you mean `harness.codex`?" in unknown.message


def test_lego_validate_fails_on_a_bad_harness_option(base_toml: Path) -> None:
    write(base_toml, "\n[harness.codex]\nextra_envs = \"not a table\"\n")
    result = CliRunner().invoke(app, ["validate", "-c", str(base_toml), "--json"])
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    [finding] = [f for f in data["findings"] if f["code"] == "harness_options"]
    assert "harness.codex.extra_envs" in finding["message"] and "lego.toml:10" in finding["message"]
    assert data["config"]["harness"]["codex"]["extra_envs"] == {"value": "not a table", "source": "lego.toml:10"}


class FifthConfig(HarnessConfig):
    version: str = "0.1.0"
    temperature_hint: float = Field(default=0.5, ge=0, le=1)
    style: Literal["terse", "chatty"] = "terse"


class FifthHarness(HarnessPlugin[FifthConfig]):
    """A harness lego has never heard of: nothing in core names it."""

    name: ClassVar[str] = "fifth"
    protocol: ClassVar[Literal["chat"]] = "chat"
    cli_package: ClassVar[str] = "fifth-cli"
    Config = FifthConfig

    def command(self, request: RunRequest, options: FifthConfig) -> CommandSpec:
        return CommandSpec(argv=["fifth", f"--style={options.style}", *options.extra_args, request.prompt],
                           env={}, cwd=request.workdir, user=request.user)


def fifth_pm() -> Any:
    pm = get_plugin_manager({"LEGO_LOAD_PLUGINS": "codex"})
    pm.register(FifthHarness(), name="fifth")
    return pm


def test_a_fifth_harness_table_validates_through_its_own_model(base_toml: Path) -> None:
    write(base_toml, "\n[harness.fifth]\nstyle = \"chatty\"\nextra_args = [\"-v\"]\n")
    r = resolve(base_toml, environ={})
    handle = harness_factory(r, environ={}, pm=fifth_pm())("fifth")
    assert isinstance(handle.options, FifthConfig) and handle.options.style == "chatty"
    spec = handle.command(RunRequest(session_id="s", base_url="http://a:1", model="m", prompt="go",
                                     workdir="/w", time_budget_s=10))
    assert spec.argv == ["fifth", "--style=chatty", "-v", "go"]
    assert harness_inventory(r, environ={}, pm=fifth_pm()).option_errors == ()

    r = resolve(base_toml, environ={}, overrides=["harness.fifth.temperature_hint=3"])
    with pytest.raises(ConfigError, match=r"harness.fifth.temperature_hint: .*less than or equal to 1") as info:
        harness_factory(r, environ={}, pm=fifth_pm())("fifth")
    assert info.value.where == "--set harness.fifth.temperature_hint=3"
    [refused] = harness_inventory(r, environ={}, pm=fifth_pm()).option_errors
    assert refused.parameter == "harness.fifth.temperature_hint"


def test_a_plugin_without_the_base_class_gets_its_validation_errors_named(base_toml: Path) -> None:
    from lego_rl.harness import Harness, hookimpl

    class RawConfig(HarnessConfig):
        version: str = "1"

    class Raw:
        @hookimpl
        def lego_harness_describe(self) -> Harness:
            return Harness(name="raw", version="1", protocol="chat", cli_package="raw")

        @hookimpl
        def lego_harness_options(self, harness: str, overrides: dict[str, Any]) -> RawConfig | None:
            return RawConfig.model_validate(overrides) if harness == "raw" else None

    pm = get_plugin_manager({"LEGO_LOAD_PLUGINS": ""})
    pm.register(Raw(), name="raw")
    r = resolve(write(base_toml, "\n[harness.raw]\nverison = \"2\"\n"), environ={})
    with pytest.raises(ConfigError, match=r"unknown key `harness.raw.verison`") as info:
        harness_factory(r, environ={}, pm=pm)("raw")
    assert info.value.where == "lego.toml:10"


def test_the_documented_example_validates(workdir: Path) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    example = doc.split("## Harness options", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    (workdir / "lego.toml").write_text(example)
    r = resolve(workdir / "lego.toml", environ={})
    lookup = harness_factory(r, environ={})
    assert lookup("claude_code").options.max_thinking_tokens == 8192  # type: ignore[attr-defined]
    assert lookup("codex").options.install_from == "native"  # type: ignore[attr-defined]
