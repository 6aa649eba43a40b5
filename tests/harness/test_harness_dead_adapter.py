"""Each real CLI, installed offline in a real bwrap sandbox, is launched with the exact command its
plugin builds against an adapter address where nothing listens (the sandbox has no network). This
proves the command lines and config files are accepted by the real CLIs, that nothing blocks on a
terminal, and that the outcome says "adapter error" (infrastructure), not a policy failure.
The end-to-end runs against the real adapter live with generate() (lead's tests)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import MakeSandbox
from harness_helpers import missing

from lego_rl.harness import RunRequest, Toolchain, get_harness, get_plugin_manager
from lego_rl.harness.toolchain import default_toolchain_dir
from lego_rl.sandbox import ImageSpec

pytestmark = pytest.mark.slow

ROOTFS_TRIXIE = Path(os.environ.get("LEGO_ROOTFS_TRIXIE_CACHE", "/var/cache/lego-rl/rootfs-trixie"))
"""The OpenHands SDK needs Python >= 3.12 in the sandbox: the trixie rootfs (python3.13, the plugin's default)."""


def request(budget: float) -> RunRequest:
    return RunRequest(
        session_id="dead-1",
        base_url="http://127.0.0.1:9",
        model="qwen-tiny",
        prompt="Say hi.",
        workdir="/testbed",
        time_budget_s=budget,
        max_turns=3,
    )


async def installed(
    make_sandbox: MakeSandbox,
    name: str,
    overrides: dict[str, Any] | None = None,
    image: ImageSpec | None = None,
) -> tuple[Any, Any]:
    folder = default_toolchain_dir()
    if not (folder / "toolchain.lock.json").is_file():
        missing(f"no harness toolchain at {folder}: run scripts/setup_toolchain.sh")
    handle = get_harness(name, overrides or {}, environ={}, pm=get_plugin_manager({}))
    sb = await make_sandbox(image)
    await handle.install(sb, Toolchain(folder))
    return handle, sb


async def test_claude_code_reports_the_dead_adapter(make_sandbox: MakeSandbox) -> None:
    handle, sb = await installed(make_sandbox, "claude_code")
    out = await handle.run(sb, request(90))
    init = json.loads(out.event_log.splitlines()[0])
    assert init["subtype"] == "init" and init["tools"] == sorted(
        ["Bash", "Read", "Edit", "Write", "Glob", "Grep"]
    )
    assert init["apiKeySource"] == "ANTHROPIC_API_KEY" and init["slash_commands"] == []
    assert out.kind == "adapter_error" and "ECONNREFUSED" in out.detail
    transcripts = await handle.artifacts(sb, request(90))
    assert transcripts and all(k.startswith("claude_code/") for k in transcripts)
    assert any(b"Say hi." in v for v in transcripts.values())


async def test_codex_reports_the_dead_adapter(make_sandbox: MakeSandbox) -> None:
    handle, sb = await installed(make_sandbox, "codex")
    out = await handle.run(sb, request(90))
    assert json.loads(out.event_log.splitlines()[0])["type"] == "thread.started"
    assert out.kind == "adapter_error" and "Connection failed" in out.detail
    [(name, transcript)] = (await handle.artifacts(sb, request(90))).items()
    assert name.startswith("codex/rollout-") and b"Say hi." in transcript


async def test_opencode_uses_the_lego_provider_and_is_ended_by_its_budget(make_sandbox: MakeSandbox) -> None:
    handle, sb = await installed(make_sandbox, "opencode")
    req = request(20)
    out = await handle.run(sb, req)
    # OpenCode retries a refused connection without end and prints nothing meanwhile: only the budget stops it.
    assert out.kind == "timed_out"
    logs = await handle.artifacts(sb, req)
    text = b"".join(logs.values()).decode()
    assert "providerID=lego modelID=qwen-tiny" in text and "Cannot connect to API" in text
    assert re.search(r'title="?lego rollout', text)  # --title given: no title-generation call


async def test_openhands_runner_reports_the_dead_adapter(make_sandbox: MakeSandbox) -> None:
    if not (ROOTFS_TRIXIE / ".lego-rootfs-stamp").is_file():
        missing(f"no trixie rootfs at {ROOTFS_TRIXIE}: run scripts/build_rootfs_trixie.sh")
    image = ImageSpec(name="trixie", rootfs=str(ROOTFS_TRIXIE), workdir="/testbed")
    handle, sb = await installed(make_sandbox, "openhands", {}, image)
    assert await handle.verify(sb, "agent") == "openhands-sdk 1.58.2"
    out = await handle.run(sb, request(150))
    assert out.kind == "adapter_error" and "LLMServiceUnavailableError" in out.detail
    kinds = {json.loads(line).get("kind") for line in out.event_log.splitlines() if line.startswith("{")}
    assert {"SystemPromptEvent", "MessageEvent", "ConversationErrorEvent"} <= kinds
