"""The shape of `lego`: help and docs name only commands that exist, typed options reach the config as
values, and a harness that is not installed is refused before anything starts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer
from typer.core import TyperGroup
from typer.testing import CliRunner

from lego_rl.cli.main import app

REPO = Path(__file__).resolve().parents[2]

COMMAND_REF = re.compile(r"[`(]lego ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?")
"""A command named in prose: `lego validate ...`, `lego tasks check ...`, or in parentheses as an option's help
does ("Prepared task JSONL (lego tasks prepare)"; `lego images --help` once pointed to a removed `lego prepare`)."""


def _tree() -> TyperGroup:
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    return group


def _missing(text: str) -> set[str]:
    root = _tree()
    missing = set()
    for first, second in COMMAND_REF.findall(text):
        command = root.commands.get(first)
        if command is None:
            missing.add(f"lego {first}")
        elif isinstance(command, TyperGroup) and second and second not in command.commands:
            missing.add(f"lego {first} {second}")
    return missing


def _all_help(group: TyperGroup, prefix: list[str]) -> str:
    texts = [CliRunner().invoke(app, [*prefix, "--help"], env={"COLUMNS": "1000"}).stdout]
    for name, command in group.commands.items():
        if isinstance(command, TyperGroup):
            texts.append(_all_help(command, [*prefix, name]))
        else:
            texts.append(CliRunner().invoke(app, [*prefix, name, "--help"], env={"COLUMNS": "1000"}).stdout)
    return "\n".join(texts)


def test_help_names_only_commands_that_exist() -> None:
    text = _all_help(_tree(), [])
    assert "`lego rollout-check`" in text  # the pattern does match the help's prose
    assert _missing(text) == set()


@pytest.mark.parametrize("path", sorted(
    [REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "skills").glob("*/SKILL.md")], key=str),
    ids=lambda p: str(p.relative_to(REPO)))
def test_docs_name_only_commands_that_exist(path: Path) -> None:
    assert _missing(path.read_text()) == set()


def test_the_missing_check_sees_a_stale_command() -> None:
    assert _missing("run `lego trains` then `lego tasks nosuch` and `lego tasks check`") == {
        "lego trains", "lego tasks nosuch"}
    assert _missing("--data  Prepared task JSONL (lego prepare).  lego reads it") == {"lego prepare"}


def test_verbs_on_task_rows_are_one_sub_app() -> None:
    tasks = _tree().commands["tasks"]
    assert isinstance(tasks, TyperGroup) and {"prepare", "check"} <= set(tasks.commands)
    assert "prepare" not in _tree().commands


def test_typed_option_path_keeps_its_backslash(workdir: Path) -> None:
    """`--data` reaches rollout.prompt_data as a value: `\\b` in the path is not a TOML escape (backspace)."""
    data = workdir / "run\\bench" / "t.jsonl"
    result = CliRunner().invoke(app, ["rollout-check", "-c", "lego.toml", "--data", str(data)],
                                env={"COLUMNS": "1000"})
    assert result.exit_code == 2
    assert f"rollout.prompt_data names {data}, which does not exist" in result.stderr
    assert "(rollout.prompt_data from --data)" in result.stderr
    assert "\b" not in result.stderr


def test_typed_overrides_beat_set_and_name_their_option(workdir: Path) -> None:
    from lego_rl.cli.options import load

    r = load(Path("lego.toml"), ["serving.urls=[\"http://a:1\"]"],
             {"serving.urls": (["http://b\\bx:2"], "--vllm-url"), "rollout.prompt_data": ("/data/run\\bench", "--data")})
    assert r.config.serving.urls == ["http://b\\bx:2"] and str(r.source("serving.urls")) == "--vllm-url"
    assert r.config.rollout.prompt_data == "/data/run\\bench"


def test_typed_override_of_an_unknown_key_is_refused(workdir: Path) -> None:
    from lego_rl.cli.options import load
    from lego_rl.errors import ConfigError

    with pytest.raises(ConfigError, match=r"--nosuch targets unknown key `rollout.nosuch`"):
        load(Path("lego.toml"), [], {"rollout.nosuch": (1, "--nosuch")})


@pytest.mark.parametrize("argv", [["--harness", "nosuch"], ["--set", "agent.default_harness=nosuch"]],
                         ids=["--harness", "--set"])
def test_uninstalled_harness_refused_before_anything_starts(workdir: Path, argv: list[str]) -> None:
    from lego_rl.harness.plugins import describe_all, get_plugin_manager

    installed = sorted(info.harness.name for info in describe_all(get_plugin_manager()))
    assert installed, "the shipped harness plugins are not installed in this venv"
    result = CliRunner().invoke(app, ["rollout-check", "-c", "lego.toml", *argv], env={"COLUMNS": "1000"})
    assert result.exit_code == 2, result.output
    assert "harness 'nosuch'" in result.stderr and f"installed: {', '.join(installed)}" in result.stderr
    assert ("from --harness" if argv[0] == "--harness" else "from --set agent.default_harness=nosuch") in result.stderr
    assert not (workdir / "runs").exists(), "a run directory was opened: something started"
