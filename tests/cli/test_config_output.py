"""`lego validate`, `lego config show` and `lego config env` show what the config holds, harness tables included."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from lego_rl.cli.main import app

WIDE = {"COLUMNS": "250"}


def invoke(*argv: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(argv), env=WIDE)
    return result.exit_code, result.stdout


def test_harness_tables_are_shown_with_their_sources(workdir: Path) -> None:
    (workdir / "lego.toml").write_text('[harness.codex]\nextra_args = "--[bold]x"\n')
    for argv in (("config", "show", "-c", "lego.toml"), ("validate", "-c", "lego.toml")):
        _, stdout = invoke(*argv)
        assert "[harness.codex]" in stdout, argv
        line = next(ln for ln in stdout.splitlines() if "extra_args" in ln)
        assert "--[bold]x" in line and "lego.toml:2" in line, line


def test_no_harness_table_when_none_is_set(workdir: Path) -> None:
    (workdir / "lego.toml").write_text("[rollout]\ntemperature = 0.5\n")
    code, stdout = invoke("config", "show", "-c", "lego.toml")
    assert code == 0 and "[harness." not in stdout


def test_a_variable_that_sets_two_keys_shows_both() -> None:
    _, stdout = invoke("config", "env")
    line = next(ln for ln in stdout.splitlines() if "LEGO_AGENT_NODE_TARBALL" in ln)
    assert "harness.claude_code.node_tarball" in line and "harness.codex.node_tarball" in line
    _, raw = invoke("config", "env", "--json")
    row = next(v for v in json.loads(raw) if v["name"] == "LEGO_AGENT_NODE_TARBALL")
    assert row["key"] == "harness.claude_code.node_tarball"
    assert row["keys"] == ["harness.claude_code.node_tarball", "harness.codex.node_tarball"]


def test_a_clock_derived_run_root_is_not_shown_as_a_folder_the_job_will_use(workdir: Path) -> None:
    """The job resolves again at launch and takes a later timestamp: validate must not print this one."""
    (workdir / "lego.toml").write_text("[rollout]\ntemperature = 0.5\n")
    _, stdout = invoke("config", "show", "-c", "lego.toml")
    cells = [ln.replace("│", " ").split() for ln in stdout.splitlines()]
    rows = {c[0]: " ".join(c) for c in cells if c and c[0] in ("run_root", "artifacts", "run_log")}
    assert set(rows) == {"run_root", "artifacts", "run_log"}, stdout
    for key, line in rows.items():
        assert "run-<timestamp when the job starts>" in line, line
        assert "/runs/run-2" not in line, line  # no concrete stamp (run-YYYYMMDD-...)
    # An explicit run root is the folder the job uses, shown as given.
    (workdir / "lego.toml").write_text(f'[paths]\nrun_root = "{workdir / "myrun"}"\n')
    _, stdout = invoke("config", "show", "-c", "lego.toml")
    assert str(workdir / "myrun") in stdout and "<timestamp" not in stdout
