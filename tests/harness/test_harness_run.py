"""The built-in run hook in a real bwrap sandbox, driving a *scripted CLI*.

The scripted CLI is a test double of a coding CLI: a shell script installed by a small in-process
harness plugin that prints JSON events and then exits, fails, hangs, or dies as the prompt says. Every
other part (plugin manager, install helper, sandbox, outcome classification, artifact saving) is real.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Literal

import pytest
from conftest import MakeSandbox
from harness_helpers import make_tgz

from lego_rl.harness import (
    CommandSpec,
    HarnessConfig,
    HarnessOutcome,
    HarnessPlugin,
    RunRequest,
    Toolchain,
    get_harness,
    get_plugin_manager,
)  # fmt: skip
from lego_rl.harness.install import install_archive
from lego_rl.harness.toolchain import sha512_integrity

SCRIPT = r"""#!/bin/sh
# A scripted coding CLI: behaviour chosen by the prompt ($1).
[ "$1" = silent ] && { echo 'boom' >&2; exit 2; }
echo '{"type":"start","user":"'"$(id -un)"'","cwd":"'"$(pwd)"'","key":"'"$SCRIPTED_KEY"'"}'
[ -f "$HOME/cfg.json" ] && echo '{"type":"config","bytes":'"$(wc -c < "$HOME/cfg.json")"'}'
case "$1" in
  ok) echo '{"type":"result","reason":"done"}'; exit 0 ;;
  fail) echo '{"type":"result","reason":"gave_up"}'; exit 3 ;;
  turns) echo '{"type":"result","reason":"max_turns"}'; exit 1 ;;
  hang) sleep 30 ;;
  signal) kill -9 $$ ;;
esac
"""


class ScriptedConfig(HarnessConfig):
    version: str = "0.0.1"
    binary: str = "/opt/lego/scripted/bin/scripted"


class ScriptedHarness(HarnessPlugin):
    name: ClassVar[str] = "scripted"
    protocol: ClassVar[Literal["chat"]] = "chat"
    cli_package: ClassVar[str] = "scripted-cli"
    Config: ClassVar[type[HarnessConfig]] = ScriptedConfig
    archive: ClassVar[Path]

    async def install(self, sandbox: Any, toolchain: Toolchain, options: Any) -> str:
        # Copied, not mounted: these tests are about running, and one of them deletes the install.
        await install_archive(
            sandbox, self.archive, "/opt/lego/scripted", integrity=sha512_integrity(self.archive), share=False
        )
        return options.binary

    def command(self, request: RunRequest, options: Any) -> CommandSpec:
        home = f"/tmp/scripted-{request.session_id}"
        return CommandSpec(
            argv=[options.binary, request.prompt],
            env={"SCRIPTED_KEY": request.session_id, "HOME": home},
            cwd=request.workdir,
            user=request.user,
            files={f"{home}/cfg.json": "{}"},
        )

    def classify(self, outcome: HarnessOutcome, request: RunRequest) -> HarnessOutcome:
        if '"reason":"max_turns"' in outcome.event_log:
            return outcome.model_copy(update={"hit_turn_limit": True})
        return outcome


@pytest.fixture
async def scripted(make_sandbox: MakeSandbox, tmp_path: Path) -> tuple[Any, Any]:
    ScriptedHarness.archive = make_tgz(
        tmp_path / "scripted.tgz", {"bin/scripted": SCRIPT}, modes={"bin/scripted": 0o755}
    )
    pm = get_plugin_manager({"LEGO_LOAD_PLUGINS": ""})
    pm.register(ScriptedHarness(), name="scripted")
    handle = get_harness("scripted", pm=pm, environ={})
    sb = await make_sandbox()
    await handle.install(sb, Toolchain(tmp_path))
    return handle, sb


def req(prompt: str, tmp_path: Path, **kw: Any) -> RunRequest:
    return RunRequest(
        session_id="s1",
        base_url="http://127.0.0.1:1",
        model="m",
        prompt=prompt,
        workdir="/testbed",
        time_budget_s=kw.pop("budget", 20),
        artifacts_dir=tmp_path / "art",
        **kw,
    )


async def test_completed_run_saves_its_event_log_without_overwriting(
    scripted: tuple[Any, Any], tmp_path: Path
) -> None:
    handle, sb = scripted
    out = await handle.run(sb, req("ok", tmp_path))
    assert out.kind == "completed" and out.exit_code == 0
    start = json.loads(out.event_log.splitlines()[0])
    assert start == {"type": "start", "user": "agent", "cwd": "/testbed", "key": "s1"}
    assert '"type":"config"' in out.event_log  # the spec's file was written before launch
    assert out.event_log_path == tmp_path / "art" / "scripted-events.jsonl"
    assert out.event_log_path.read_text() == out.event_log
    again = await handle.run(sb, req("fail", tmp_path))
    assert again.event_log_path == tmp_path / "art" / "scripted-events.1.jsonl"
    assert json.loads(out.event_log_path.read_text().splitlines()[-1])["reason"] == "done"  # first log intact


@pytest.mark.parametrize(
    ("prompt", "kind", "exit_code", "detail"),
    [
        ("fail", "agent_error", 3, ""),
        ("turns", "turn_limit", 1, ""),
        ("silent", "crashed", 2, "before any event: boom"),
        ("signal", "crashed", 137, "killed by signal 9"),
    ],
)
async def test_outcomes_are_classified(
    scripted: tuple[Any, Any], tmp_path: Path, prompt: str, kind: str, exit_code: int, detail: str
) -> None:
    handle, sb = scripted
    out = await handle.run(sb, req(prompt, tmp_path))
    assert (out.kind, out.exit_code) == (kind, exit_code)
    assert detail in out.detail


async def test_time_budget_ends_the_run(scripted: tuple[Any, Any], tmp_path: Path) -> None:
    handle, sb = scripted
    out = await handle.run(sb, req("hang", tmp_path, budget=1.5))
    assert out.kind == "timed_out" and out.exit_code is None and out.duration_s < 10
    assert (
        '"type":"start"' in out.event_log or out.event_log == ""
    )  # partial output kept when the provider has it


async def test_missing_binary_is_a_crash_not_an_exception(scripted: tuple[Any, Any], tmp_path: Path) -> None:
    handle, sb = scripted
    await sb.exec(["rm", "-rf", "/opt/lego/scripted"])
    out = await handle.run(sb, req("ok", tmp_path))
    assert out.kind == "crashed" and out.exit_code == 127 and "command not found" in out.detail
