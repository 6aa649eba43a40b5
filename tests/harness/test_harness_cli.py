"""`lego harnesses` and `lego toolchain fetch` through typer's CliRunner (in process)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from lego_rl.cli.main import app


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.delenv("LEGO_LOAD_PLUGINS", raising=False)
    return CliRunner()


def test_harnesses_table_and_json(runner: CliRunner) -> None:
    table = runner.invoke(app, ["harnesses"])
    assert table.exit_code == 0
    for word in ("claude_code", "codex", "opencode", "openhands", "anthropic", "responses"):
        assert word in table.output
    rows = {r["name"]: r for r in json.loads(runner.invoke(app, ["harnesses", "--json"]).output)}
    assert (
        rows["codex"]["package"] == "lego-harness-codex" and rows["codex"]["cli_package"] == "@openai/codex"
    )
    assert rows["claude_code"]["capabilities"]["enforces_turn_limit"] is True
    assert rows["codex"]["capabilities"]["enforces_turn_limit"] is False
    assert {"lego_harness_install", "lego_harness_command"} <= set(rows["codex"]["hooks"])


def test_harnesses_with_none_loaded_says_how_to_install(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEGO_LOAD_PLUGINS", "")
    res = runner.invoke(app, ["harnesses"])
    assert res.exit_code == 0 and "scripts/install_plugins.sh" in res.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-o", "novalue"], "expected HARNESS.KEY=VALUE"),
        (["-H", "nope"], "unknown harness 'nope'"),
        (["-H", "codex", "-o", "codex.install_from=zip"], "harness.codex.install_from"),
    ],
)
def test_toolchain_fetch_usage_errors_exit_2(
    runner: CliRunner, tmp_path: object, args: list[str], message: str
) -> None:
    res = runner.invoke(app, ["toolchain", "fetch", "--dir", str(tmp_path), *args])
    assert res.exit_code == 2
    assert message in res.output.replace("\n", " ")


def test_toolchain_fetch_reads_the_harness_table(runner: CliRunner, tmp_path, monkeypatch) -> None:
    """The pins come from the options the run will use: a refused value in lego.toml's [harness.codex] stops
    the fetch naming its line; --option wins over the table and is named as the source instead."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lego.toml").write_text('[harness.codex]\ninstall_from = "zip"\n')
    res = runner.invoke(app, ["toolchain", "fetch", "--dir", str(tmp_path / "tc"), "-H", "codex"])
    text = res.output.replace("\n", " ")
    assert res.exit_code == 2, text
    assert "harness.codex.install_from" in text and "lego.toml:2" in text
    res = runner.invoke(app, ["toolchain", "fetch", "--dir", str(tmp_path / "tc"), "-H", "codex",
                              "-o", "codex.install_from=tar"])
    text = res.output.replace("\n", " ")
    assert res.exit_code == 2 and "--option codex.install_from=tar" in text and "lego.toml:2" not in text
    assert not (tmp_path / "tc").exists()
