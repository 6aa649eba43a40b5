from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from lego_rl.cli.main import app

runner = CliRunner()


def test_validate_ok_json(base_toml: Path) -> None:
    result = runner.invoke(app, ["validate", "-c", str(base_toml), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ok"] is True and data["errors"] == 0
    assert data["config"]["sandbox"]["provider"] == {"value": "bwrap", "source": "lego.toml:3"}
    assert data["config"]["rollout"]["guard_s"]["source"].startswith("agent.time_budget_s")


def test_validate_failed_check_exit_1_and_failed_first(base_toml: Path) -> None:
    result = runner.invoke(app, ["validate", "-c", str(base_toml), "--set", "rollout.top_p=2"])
    assert result.exit_code == 1
    assert result.stdout.index("top_p") < result.stdout.index("[model]")
    assert "FAIL" in result.stdout
    data = json.loads(runner.invoke(app, ["validate", "-c", str(base_toml), "--set", "rollout.top_p=2",
                                          "--json"]).stdout)
    assert data["ok"] is False and data["findings"][0]["code"] == "top_p"
    assert "rollout.top_p" in data["findings"][0]["fix"]


def test_validate_config_error_exit_2_one_line(base_toml: Path) -> None:
    base_toml.write_text("[rollout]\nbatch_size = 'x'\n")
    result = runner.invoke(app, ["validate", "-c", str(base_toml)])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert "lego.toml:2" in result.output and "rollout.batch_size" in result.output
    result = runner.invoke(app, ["validate", "-c", str(base_toml), "--json"])
    assert result.exit_code == 2
    assert json.loads(result.stdout)["parameter"] == "rollout.batch_size"


def test_validate_secrets_are_masked(base_toml: Path, monkeypatch) -> None:
    monkeypatch.setenv("E2B_API_KEY", "sk-very-secret")
    result = runner.invoke(app, ["validate", "-c", str(base_toml), "--json"])
    assert "sk-very-secret" not in result.stdout


def test_config_show_and_env(base_toml: Path) -> None:
    result = runner.invoke(app, ["config", "show", "-c", str(base_toml), "--docs"], env={"COLUMNS": "250"})
    assert result.exit_code == 0 and "Prompts per rollout step" in result.stdout
    result = runner.invoke(app, ["config", "env", "--json"])
    names = {row["name"] for row in json.loads(result.stdout)}
    assert {"SWE_EVAL_TIMEOUT_SEC", "SUNABAKO_ALLOW_TEST_MEMORY", "CHAT_TEMPLATE_KWARGS"} <= names


def test_help_reads_well() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0 and "validate" in result.stdout
    result = runner.invoke(app, ["validate", "--help"])
    assert "Exit 0" in result.stdout and "--remote" in result.stdout


def test_remote_on_the_shipped_config_needs_no_running_job(workdir: Path, monkeypatch) -> None:
    """The shipped lego.toml names an adapter address that only exists while a job runs: `--remote` must not
    report it (before launch nothing listens there)."""
    repo = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(repo)
    result = runner.invoke(app, ["validate", "-c", "lego.toml", "--remote", "--timeout", "2", "--json"])
    assert result.exit_code in (0, 1), result.output
    unreachable = [f["message"] for f in json.loads(result.stdout)["findings"] if f["code"] == "unreachable"]
    assert unreachable == []


def test_tables_are_not_folded_at_80_columns_off_a_terminal(base_toml: Path) -> None:
    """Piped or logged (no terminal, no COLUMNS), a table row stays one line: rich's default 80 columns folded
    every meaning and finding into a column of fragments."""
    from lego_rl.cli.console import out

    assert not out.is_terminal  # the runner captures stdout
    result = runner.invoke(app, ["config", "show", "-c", str(base_toml), "--docs"])
    assert result.exit_code == 0
    [line] = [ln for ln in result.stdout.splitlines() if "heartbeat_s" in ln]
    assert "prints its status line with the counts of the moment at least this often (seconds)" in line
    assert len(line) > 120
    result = runner.invoke(app, ["validate", "-c", str(base_toml), "--set", "rollout.top_p=2"])
    assert any(len(ln) > 80 and "top_p" in ln for ln in result.stdout.splitlines()), result.stdout
