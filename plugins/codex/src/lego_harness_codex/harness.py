"""Codex CLI (``@openai/codex``) as a lego harness: ``codex exec --json`` against the adapter.

A custom model provider points at the adapter's Responses front end (``wire_api="responses"``; the
CLI rejects ``"chat"``); its bearer token is the session id, passed through ``env_key``. Plugins,
apps, sub-agents, goals, web search, WebSockets, analytics and update checks are off, so nothing tries
to leave the sandbox, and ``unbounded_connection_retries`` is off so a dead adapter ends the run
instead of retrying until the time budget.

One turn is one request: the provider's ``stream_max_retries`` and ``request_max_retries`` are 0 (by
default Codex re-sends a turn whose stream was cut up to 5 times and a refused request 4 times, each
an extra engine call recorded for one step of the agent; the adapter's refusals are final anyway), and
``stream_idle_timeout_ms`` is the rollout's time budget: SSE keepalive comments do not reset Codex's
idle timer (default 300 s), so a long engine turn would otherwise be cut and re-sent.

Codex is told the rollout's context window (``model_context_window``) and compacts its history at
``autocompact_pct`` of it (``model_auto_compact_token_limit``), as Claude Code does at its own
``autocompact_pct``: for a model it does not know Codex assumes no window and never compacts, so a long
rollout ran into the adapter's context_limit stop at the window instead (tests/rollout/test_generate_64k.py).

Install paths: ``native`` (default): the platform archive ``@openai/codex@<v>-linux-x64``
(``LEGO_AGENT_CODEX_NATIVE_TARBALL``), no Node; ``npm``: Node 22 + ``@openai/codex`` + the same
platform package (``LEGO_AGENT_NODE_TARBALL`` + ``LEGO_AGENT_CODEX_TARBALL``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from lego_rl.harness import CommandSpec, HarnessOutcome, HarnessPlugin, RunRequest, Toolchain
from lego_rl.harness.base import ArchiveOrNpmConfig
from lego_rl.harness.install import INSTALL_ROOT, install_archive, version_of
from lego_rl.harness.models import ToolchainPin
from lego_rl.harness.node import (
    DEFAULT_NODE_VERSION,
    install_node,
    install_npm_package,
    node_binary,
    node_pin,
    npm_pin,
)
from lego_rl.harness.toolchain import cached_integrity
from lego_rl.sandbox.base import Sandbox

CLI = "@openai/codex"
PLATFORM_ALIAS = "@openai/codex-linux-x64"
"""The name the launcher ``require``s; on the registry it is ``@openai/codex@<v>-linux-x64``."""
TRIPLE = "x86_64-unknown-linux-musl"
DEFAULT_VERSION = "0.162.1"
KNOWN = {
    (
        CLI,
        "0.162.1",
    ): "sha512-NWZdi/kxyjv/8EUGFupziGU38YyleugZRM4JXgY5XFH7FUmaFA33NZS2Bmq0HPazf7S3jJQQWsZ/jAK9jsrV3Q==",
    (
        CLI,
        "0.162.1-linux-x64",
    ): "sha512-cjK2mdHIfEepZ1lQ1MX3aTQC+8ncIsvnacl/6vI2dIIcfP8/MrhTQ2+qRlkXFNDzJSj1d36quIszP+3/4CUJWQ==",
}
DISABLED_FEATURES = ["plugins", "apps", "multi_agent", "goals", "unbounded_connection_retries"]
PROVIDER = "lego"
KEY_VAR = "LEGO_SESSION_KEY"
HOME = "/var/tmp/lego-codex"
"""CODEX_HOME and HOME; not under /tmp: the CLI refuses to create its helper links there. One fixed path in
every (fresh) sandbox: see the Claude Code plugin's HOME for why nothing per-session goes into it."""


class CodexConfig(ArchiveOrNpmConfig):
    """``[harness.codex]``; env: ``LEGO_AGENT_CODEX_*`` (or ``VIME_AGENT_CODEX_*``)."""

    version: str = DEFAULT_VERSION
    install_from: Literal["native", "npm"] = "native"
    native_tarball: Path | None = None
    """Host copy of ``@openai/codex@<v>-linux-x64`` (``LEGO_AGENT_CODEX_NATIVE_TARBALL``); selects ``native``."""
    cli_tarball: Path | None = None
    """Host copy of the ``@openai/codex`` npm tarball (``LEGO_AGENT_CODEX_TARBALL``)."""
    node_tarball: Path | None = None
    node_version: str = DEFAULT_NODE_VERSION
    disabled_features: list[str] = list(DISABLED_FEATURES)
    """Passed as ``--disable <feature>`` each."""
    autocompact_pct: int = Field(default=70, ge=0, le=100)
    """Compact the conversation at this share of the context window. 0 tells Codex nothing about the window:
    for a model it does not know it then never compacts, and a long rollout ends at the window (context_limit)."""


class CodexHarness(HarnessPlugin[CodexConfig]):
    name: ClassVar[str] = "codex"
    protocol: ClassVar[Literal["responses"]] = "responses"
    cli_package: ClassVar[str] = CLI
    summary: ClassVar[str] = "OpenAI Codex CLI, codex exec --json over the Responses API"
    Config = CodexConfig
    env_names: ClassVar[dict[str, str]] = {
        "native_tarball": "CODEX_NATIVE_TARBALL", "cli_tarball": "CODEX_TARBALL", "node_tarball": "NODE_TARBALL",
        "extra_args": "CODEX_EXTRA_ARGS", "extra_envs": "CODEX_EXTRA_ENVS", "version": "CODEX_VERSION",
    }  # fmt: skip
    streams_only: ClassVar[bool] = True  # a JSON reply makes it retry five times and fail
    enforces_turn_limit: ClassVar[bool] = False  # codex exec has no turn limit flag: the adapter caps it

    @staticmethod
    def _home(o: CodexConfig) -> str:
        return f"{INSTALL_ROOT}/codex/{o.version}-{o.install_from}"

    def _vendor(self, o: CodexConfig) -> str:
        base = (
            self._home(o) if o.install_from == "native" else f"{self._home(o)}/node_modules/{PLATFORM_ALIAS}"
        )
        return f"{base}/vendor/{TRIPLE}"

    def launcher(self, o: CodexConfig) -> list[str]:
        if o.install_from == "native":
            return [f"{self._vendor(o)}/bin/codex"]
        return [node_binary(o.node_version), f"{self._home(o)}/node_modules/{CLI}/bin/codex.js"]

    def _native_pin(self, o: CodexConfig) -> ToolchainPin:
        return npm_pin("native", CLI, f"{o.version}-linux-x64", KNOWN)

    def toolchain(self, o: CodexConfig) -> list[ToolchainPin]:
        if o.install_from == "native":
            return [self._native_pin(o)]
        return [node_pin(o.node_version), npm_pin("cli", CLI, o.version, KNOWN), self._native_pin(o)]

    async def install(self, sandbox: Sandbox, toolchain: Toolchain, o: CodexConfig) -> str:
        if o.install_from == "native":
            path = toolchain.resolve(self._native_pin(o), override=o.native_tarball)
            await install_archive(sandbox, path, self._home(o), integrity=cached_integrity(path))
        else:
            await install_node(sandbox, toolchain, o.node_version, o.node_tarball)
            await install_npm_package(
                sandbox,
                toolchain,
                self._home(o),
                npm_pin("cli", CLI, o.version, KNOWN),
                tarball=o.cli_tarball,
            )
            await install_npm_package(
                sandbox,
                toolchain,
                self._home(o),
                self._native_pin(o),
                as_name=PLATFORM_ALIAS,
                tarball=o.native_tarball,
            )
        return self.launcher(o)[-1]

    async def verify(self, sandbox: Sandbox, o: CodexConfig, user: str) -> str:
        env = {"CODEX_HOME": "/var/tmp/lego-codex-verify", "HOME": "/var/tmp/lego-codex-verify"}
        return await version_of(
            sandbox, [*self.launcher(o), "--version"], user=user, expect=o.version, env=env
        )

    def command(self, request: RunRequest, o: CodexConfig) -> CommandSpec:
        settings = {
            "model_provider": PROVIDER,
            f"model_providers.{PROVIDER}.name": PROVIDER,
            f"model_providers.{PROVIDER}.base_url": request.base_url.rstrip("/") + "/v1",
            f"model_providers.{PROVIDER}.wire_api": "responses",
            f"model_providers.{PROVIDER}.env_key": KEY_VAR,
            f"model_providers.{PROVIDER}.supports_websockets": False,
            f"model_providers.{PROVIDER}.stream_max_retries": 0,
            f"model_providers.{PROVIDER}.request_max_retries": 0,
            f"model_providers.{PROVIDER}.stream_idle_timeout_ms": math.ceil(request.time_budget_s * 1000),
            "web_search": "disabled",
            "analytics.enabled": False,
            "check_for_update_on_startup": False,
        }
        if o.autocompact_pct:
            # Codex derives a compaction limit of its own from a known window, so both or neither.
            settings["model_context_window"] = request.max_context_tokens
            settings["model_auto_compact_token_limit"] = request.max_context_tokens * o.autocompact_pct // 100
        args = ["exec", "--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"]
        for feature in o.disabled_features:
            args += ["--disable", feature]
        for key, value in settings.items():
            args += ["-c", f"{key}={json.dumps(value)}"]  # JSON scalars are valid TOML values
        args += ["-m", request.model, "-C", request.workdir]
        env = {KEY_VAR: request.session_id, "HOME": HOME, "CODEX_HOME": HOME, "NO_COLOR": "1"}
        env.update(o.extra_envs)
        path = [] if o.install_from == "npm" else [f"{self._vendor(o)}/codex-path"]
        return CommandSpec(
            argv=[*self.launcher(o), *args, *o.extra_args, "--", request.prompt],
            env=env, cwd=request.workdir, user=request.user, path_prepend=path,
        )  # fmt: skip

    def classify(self, outcome: HarnessOutcome, request: RunRequest) -> HarnessOutcome:
        """``turn.failed`` / ``error`` events carry the reason; the adapter words its cap as a turn limit."""
        message = _last_error(outcome.event_log)
        if message is None:
            return outcome
        low = message.lower()
        hit = "turn limit" in low or "max_turns" in low
        # Connection failures, 5xx answers and engine failures reported inside the stream
        # (``response.failed``: "stream disconnected before completion: model engine error: ...") are the
        # adapter's (or engine's), not the policy's.
        adapter = not hit and any(
            s in low
            for s in (
                "connection failed", "error sending request", "unexpected status 5",
                "stream disconnected before completion", "model engine error",
            )
        )  # fmt: skip
        return outcome.model_copy(
            update={
                "hit_turn_limit": hit or outcome.hit_turn_limit,
                "adapter_error": adapter,
                "detail": message[:500],
            }
        )

    async def artifacts(self, sandbox: Sandbox, request: RunRequest) -> dict[str, bytes]:
        # The CLI's own session transcript: $CODEX_HOME/sessions/YYYY/MM/DD/rollout-*.jsonl (bounded).
        home = f"{HOME}/sessions"
        res = await sandbox.exec(
            ["sh", "-c", f"find {home} -name '*.jsonl' -size -20M 2>/dev/null | head -20"],
            user=request.user, timeout=30,
        )  # fmt: skip
        return {
            f"codex/{Path(p).name}": await sandbox.read_file(p, user=request.user) for p in res.stdout.split()
        }


def _last_error(log: str) -> str | None:
    for line in reversed(log.splitlines()):
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(event, dict):
            continue
        if event.get("type") == "turn.failed":
            err = event.get("error") or {}
            return str(err.get("message", err)) if isinstance(err, dict) else str(err)
        if event.get("type") == "error":
            return str(event.get("message", ""))
        if event.get("type") == "turn.completed":
            return None
    return None


plugin = CodexHarness()
