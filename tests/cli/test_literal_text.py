"""Text we did not write (errors, hints, config values, ids, plugin metadata) reaches the terminal as written.

Rich reads `[word]` as markup and silently drops it; each test feeds bracketed text through one output path
of `lego` and asserts it survives literally."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from lego_rl.cli.main import app
from lego_rl.rollout.generate import RolloutResult
from lego_rl.termination import TerminationReason

WIDE = {"COLUMNS": "250"}
"""Tables wrap at 80 columns in CliRunner; a wide terminal keeps each cell on one line for the asserts."""


def invoke(*argv: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(argv), env=WIDE)
    return result.exit_code, result.stdout, result.stderr


def test_config_error_keeps_the_section_name(workdir: Path) -> None:
    (workdir / "lego.toml").write_text("[rollout]\nbatchsize = 1\n")
    code, _, err = invoke("validate", "-c", "lego.toml")
    assert code == 2
    assert ("unknown key `rollout.batchsize` (did you mean `rollout.batch_size`?); "
            "known keys of [rollout]:") in err


def test_sandbox_error_keeps_the_pip_extra(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "e2b", None)  # the SDK is absent: importing it raises ImportError
    code, _, err = invoke("sandbox", "exec", "--provider", "e2b", "host", "--", "true")
    assert code == 3
    assert "pip install 'lego-rl[e2b]'" in err


def test_validate_table_shows_a_bracketed_value_as_written(workdir: Path) -> None:
    code, out, _ = invoke("validate", "-c", "lego.toml", "--set", 'model.served_name="[bold]policy[/bold]"')
    assert code == 0, out
    assert "[bold]policy[/bold]" in out
    assert "--set model.served_name=\"[bold]policy[/bold]\"" in out  # the source column, same text


def test_validate_findings_table_keeps_brackets(workdir: Path) -> None:
    (workdir / "lego.toml").write_text('[sandbox]\nprovider = "bwrap"\nimages = "img[s].json"\n'
                                       '[rollout]\nprompt_data = "tasks.jsonl"\n')
    code, out, _ = invoke("validate", "-c", "lego.toml")
    assert code == 1
    assert "img[s].json" in out


def test_rollout_check_config_refusal_keeps_brackets(workdir: Path) -> None:
    code, _, err = invoke("rollout-check", "-c", "lego.toml", "--data", str(workdir / "run[red]" / "t.jsonl"))
    assert code == 2
    assert "run[red]/t.jsonl" in err.replace("\n", "")


def _result(instance_id: str, harness: str) -> RolloutResult:
    return RolloutResult(rollout_id=f"{instance_id}-s0", instance_id=instance_id, harness=harness,
                         termination=TerminationReason.COMPLETED, reward=0.0, samples=[], timings={"agent": 1.0},
                         artifacts=None)


def test_rollout_check_table_shows_ids_and_harnesses_as_written() -> None:
    from lego_rl.cli.rollout_cmd import _results_table

    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115 - closed with the test
    console.print(_results_table([_result("task[bold]-1", "codex[x]"), _result("task-2", "claude_code")]))
    text = console.export_text()
    assert "task[bold]-1#0" in text and "codex[x]" in text
    console.print(_results_table([_result("task[red]-3", "my[harness]")]))
    assert "Rollouts (my[harness])" in console.export_text()


def test_harness_listing_shows_plugin_metadata_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    from lego_rl.harness import plugins

    real = plugins.describe_all

    def describe_all_test_double(pm):  # type: ignore[no-untyped-def]
        """TEST DOUBLE: the real listing, with a third-party package whose metadata holds brackets."""
        infos = real(pm)
        first = infos[0]
        odd = dataclasses.replace(first, package="lego-harness-x[extra]",
                                  harness=first.harness.model_copy(update={"cli_package": "cli[bold]pkg"}))
        return [odd, *infos[1:]]

    monkeypatch.setattr(plugins, "describe_all", describe_all_test_double)
    code, out, _ = invoke("harnesses")
    assert code == 0
    assert "cli[bold]pkg" in out and "lego-harness-x[extra]" in out


def test_sandbox_listing_shows_ids_as_written(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "sb-[bold]1").mkdir(parents=True)  # a create that died before meta.json: listed as leaked
    code, out, _ = invoke("sandbox", "ls", "--provider", "bwrap", "--state-dir", str(state))
    assert code == 0
    assert "sb-[bold]1" in out and "leaked" in out


def test_sandbox_exec_refusal_keeps_brackets(tmp_path: Path) -> None:
    code, _, err = invoke("sandbox", "exec", "--provider", "no[such]", "host", "--", "true")
    assert code == 2
    assert "'no[such]'" in err


def test_tasks_prepare_bad_rows_table_keeps_brackets(workdir: Path) -> None:
    (workdir / "rows.jsonl").write_text('{"prompt": "x", "metadata": {"instance_id": "id[bold]7"}}\n')
    code, _, err = invoke("tasks", "prepare", "--format", "rows", "--data", "rows.jsonl", "-o", "out.jsonl")
    assert code == 2
    assert "id[bold]7" in err
