"""Plugin loading: entry points, the LEGO_LOAD_PLUGINS allowlist, tracing, name clashes, lookup."""

from __future__ import annotations

from pathlib import Path

import pytest

from lego_rl.errors import ConfigError, HarnessError
from lego_rl.harness import (
    Harness,
    HarnessConfig,
    HarnessPlugin,
    describe_all,
    get_harness,
    get_plugin_manager,
    hookimpl,
)

SHIPPED = {"claude_code": "anthropic", "codex": "responses", "opencode": "chat", "openhands": "chat"}


def test_shipped_plugins_load_from_entry_points() -> None:
    infos = {i.harness.name: i for i in describe_all(get_plugin_manager({}))}
    assert set(SHIPPED) <= set(infos), "run scripts/install_plugins.sh"
    for name, protocol in SHIPPED.items():
        assert infos[name].harness.protocol == protocol
        assert infos[name].package == f"lego-harness-{name.replace('_', '-')}"
        assert infos[name].harness.version  # a pinned CLI version


def test_allowlist_loads_only_named_plugins() -> None:
    names = [
        i.harness.name for i in describe_all(get_plugin_manager({"LEGO_LOAD_PLUGINS": "codex, opencode"}))
    ]
    assert names == ["codex", "opencode"]
    assert describe_all(get_plugin_manager({"LEGO_LOAD_PLUGINS": ""})) == []


def test_unknown_harness_names_what_is_installed() -> None:
    with pytest.raises(ConfigError, match=r"unknown harness 'nope'; installed: .*codex"):
        get_harness("nope", environ={"LEGO_LOAD_PLUGINS": "codex"})


def test_trace_writes_hook_calls_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    pm = get_plugin_manager({"LEGO_LOAD_PLUGINS": "codex", "LEGO_TRACE_PLUGINS": "1"})
    describe_all(pm)
    pm.hook.lego_harness_toolchain(harness="codex", options=get_harness("codex", environ={}, pm=pm).options)
    assert "lego_harness_toolchain" in capsys.readouterr().err


class _TwinConfig(HarnessConfig):
    version: str = "9"


class _Twin(HarnessPlugin):
    name = "codex"
    protocol = "responses"
    cli_package = "x"
    Config = _TwinConfig


def test_two_plugins_claiming_one_name_is_an_error() -> None:
    pm = get_plugin_manager({"LEGO_LOAD_PLUGINS": "codex"})
    pm.register(_Twin(), name="twin")
    with pytest.raises(HarnessError, match="claimed by both"):
        describe_all(pm)


class _Bad:
    @hookimpl
    def lego_harness_describe(self) -> object:
        return {"name": "dict-not-model"}


def test_describe_must_return_a_harness_model() -> None:
    pm = get_plugin_manager({"LEGO_LOAD_PLUGINS": ""})
    pm.register(_Bad(), name="bad")
    with pytest.raises(HarnessError, match="returned dict, not Harness"):
        describe_all(pm)


class _RawHooks:
    """A plugin written with bare hookimpls (no base class) that names only the arguments it uses."""

    @hookimpl
    def lego_harness_describe(self) -> Harness:
        return Harness(name="raw", version="1", protocol="chat", cli_package="raw")

    @hookimpl
    def lego_harness_options(self, harness: str) -> object:
        return {"ok": True} if harness == "raw" else None


def test_raw_hook_plugin_is_usable_and_unimplemented_hooks_are_reported() -> None:
    pm = get_plugin_manager({"LEGO_LOAD_PLUGINS": ""})
    pm.register(_RawHooks(), name="raw")
    handle = get_harness("raw", pm=pm, environ={})
    assert handle.options == {"ok": True} and handle.protocol == "chat"
    assert handle.toolchain_pins() == []
    with pytest.raises(HarnessError, match="implements no command hook"):
        handle.command(None)  # type: ignore[arg-type]


def fake_distribution(root: Path, dist: str, module: str, source: str) -> None:
    """A real, minimal installed distribution on sys.path: a module plus a dist-info with an entry point."""
    (root / f"{module}.py").write_text(source)
    info = root / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[lego_rl.harnesses]\n{module} = {module}\n")


def test_broken_and_misspelled_plugins_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_distribution(tmp_path, "broken-harness", "lego_broken_h", "raise RuntimeError('no such luck')\n")
    fake_distribution(
        tmp_path,
        "typo-harness",
        "lego_typo_h",
        "from lego_rl.harness import hookimpl\n\n@hookimpl\ndef lego_harness_descibe():\n    pass\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(HarnessError, match=r"'lego_broken_h' .*package broken-harness.* no such luck"):
        get_plugin_manager({"LEGO_LOAD_PLUGINS": "lego_broken_h"})
    with pytest.raises(HarnessError, match=r"'lego_typo_h' \(package typo-harness\).*lego_harness_descibe"):
        get_plugin_manager({"LEGO_LOAD_PLUGINS": "lego_typo_h"})
    # Neither is loaded when the allowlist leaves them out.
    assert [i.harness.name for i in describe_all(get_plugin_manager({"LEGO_LOAD_PLUGINS": "codex"}))] == [
        "codex"
    ]


def test_config_maps_exactly_the_shipped_plugins_variables_into_their_tables() -> None:
    """The config lists the four plugins' LEGO_AGENT_* variables (so its precedence holds for them);
    they must be the variables the plugins themselves read, onto the same option."""
    from lego_rl.config.envmap import ENV_VARS

    mapped = {(v.name, key) for v in ENV_VARS if v.name.startswith("LEGO_AGENT_") for key in v.keys
              if key.startswith("harness.")}
    pm = get_plugin_manager({})
    declared = set()
    for name in SHIPPED:
        plugin = pm.get_plugin(name)
        assert isinstance(plugin, HarnessPlugin)
        declared |= {(f"LEGO_AGENT_{suffix}", f"harness.{name}.{field}") for field, suffix in plugin.env_names.items()}
        for field in plugin.env_names:
            assert field in plugin.Config.model_fields, f"{name}: env_names names no option {field!r}"
    assert mapped == declared


def test_a_plugin_class_without_its_options_model_is_named() -> None:
    class NoConfig(HarnessPlugin):  # type: ignore[type-arg]
        name = "noconfig"
        protocol = "chat"
        cli_package = "x"

    pm = get_plugin_manager({"LEGO_LOAD_PLUGINS": ""})
    pm.register(NoConfig(), name="noconfig")
    with pytest.raises(HarnessError, match="'noconfig': its plugin class sets no Config"):
        describe_all(pm)
