"""OpenCode (``opencode-ai``) as a lego harness: ``opencode run --format json`` over Chat Completions.

The provider is an ``@ai-sdk/openai-compatible`` entry in the run's global ``opencode.json`` (kept out
of the repository so the patch stays clean) with the session id as its API key. ``--title`` skips the
title-generation call, ``OPENCODE_DISABLE_MODELS_FETCH=1`` the model-list download, and the
``@opencode-ai/plugin`` package (with its dependency tree) is pre-installed into the config folder so
the CLI does not try to npm-install it at start. The agent's ``steps`` is the turn limit.

Install: the platform archive ``opencode-linux-x64`` (one Bun-compiled binary, no Node;
``LEGO_AGENT_OPENCODE_NATIVE_TARBALL``) and the plugin tree fetched by ``lego toolchain fetch``.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field

from lego_rl.harness import CommandSpec, HarnessConfig, HarnessOutcome, HarnessPlugin, RunRequest, Toolchain
from lego_rl.harness.install import INSTALL_ROOT, install_archive, version_of
from lego_rl.harness.models import ToolchainPin
from lego_rl.harness.node import npm_pin
from lego_rl.harness.toolchain import cached_integrity
from lego_rl.sandbox.base import Sandbox

CLI = "opencode-ai"
NATIVE = "opencode-linux-x64"
PLUGIN = "@opencode-ai/plugin"
DEFAULT_VERSION = "1.18.33"
KNOWN = {
    (
        CLI,
        "1.18.33",
    ): "sha512-58P1ffLRXiAY4QeoABqUjqf6DEzm1ihpovvn9Ad+oOLbLiwK/rf88wruT9IATJ7AtNjmi8iA7pC8tN4o5y799Q==",
    (
        NATIVE,
        "1.18.33",
    ): "sha512-q/t/3p2CTxOT9y2kvjesb/LZab2+1eqlhhWA02Be6mjTtmYtNBcBsrI5yDo4Fw7ZSPBW2oyMIGMNRqiKQjiAWw==",
    (
        PLUGIN,
        "1.18.33",
    ): "sha512-fmhqCBJvNt+Vfbx6ckKP19S3xwMBhUXLCBQaK92R4wnv3wsWTZYkJQwYf2egiWfJNOl47jhs3vP7uQkl0mvHQw==",
}
PROVIDER = "lego"
HOME = "/tmp/lego-opencode"
"""One fixed path in every (fresh) sandbox: nothing per-session in what the CLI may show the model (see the
Claude Code plugin's HOME)."""


class OpenCodeConfig(HarnessConfig):
    """``[harness.opencode]``; env: ``LEGO_AGENT_OPENCODE_*`` (or ``VIME_AGENT_OPENCODE_*``)."""

    version: str = DEFAULT_VERSION
    native_tarball: Path | None = None
    """Host copy of the ``opencode-linux-x64`` archive (``LEGO_AGENT_OPENCODE_NATIVE_TARBALL``)."""
    plugin_tree: Path | None = None
    """Host copy of the packed ``@opencode-ai/plugin`` tree (``LEGO_AGENT_OPENCODE_PLUGIN_TREE``)."""
    title: str = "lego rollout"
    """Session title given on the command line, so the CLI makes no title-generation call."""
    disabled_tools: list[str] = Field(default_factory=lambda: ["task", "webfetch"])
    """Built-in tools turned off: ``task`` runs sub-agents (their requests would mix into the session),
    ``webfetch`` tries to leave the sandbox."""
    max_requests: int = Field(default=400, ge=1)
    """Adapter cap on requests per session: a CLI that loops must still end."""


class OpenCodeHarness(HarnessPlugin[OpenCodeConfig]):
    name: ClassVar[str] = "opencode"
    protocol: ClassVar[Literal["chat"]] = "chat"
    cli_package: ClassVar[str] = CLI
    summary: ClassVar[str] = "OpenCode, opencode run over Chat Completions"
    Config = OpenCodeConfig
    env_names: ClassVar[dict[str, str]] = {
        "native_tarball": "OPENCODE_NATIVE_TARBALL", "plugin_tree": "OPENCODE_PLUGIN_TREE",
        "extra_args": "OPENCODE_EXTRA_ARGS", "extra_envs": "OPENCODE_EXTRA_ENVS", "version": "OPENCODE_VERSION",
    }  # fmt: skip
    streams_only: ClassVar[bool] = True
    enforces_turn_limit: ClassVar[bool] = True  # agent.build.steps

    @staticmethod
    def _home(o: OpenCodeConfig) -> str:
        return f"{INSTALL_ROOT}/opencode/{o.version}"

    def _pins(self, o: OpenCodeConfig) -> tuple[ToolchainPin, ToolchainPin]:
        native = npm_pin("native", NATIVE, o.version, KNOWN)
        tree = ToolchainPin(role="plugin", kind="npm", name=PLUGIN, version=o.version,
                            integrity=KNOWN.get((PLUGIN, o.version)), with_dependencies=True)  # fmt: skip
        return native, tree

    def toolchain(self, options: OpenCodeConfig) -> list[ToolchainPin]:
        return list(self._pins(options))

    async def install(self, sandbox: Sandbox, toolchain: Toolchain, o: OpenCodeConfig) -> str:
        native, tree = self._pins(o)
        path = toolchain.resolve(native, override=o.native_tarball)
        await install_archive(sandbox, path, f"{self._home(o)}/cli", integrity=cached_integrity(path))
        path = toolchain.resolve(tree, override=o.plugin_tree)
        await install_archive(sandbox, path, f"{self._home(o)}/plugin", integrity=cached_integrity(path))
        return f"{self._home(o)}/cli/bin/opencode"

    async def verify(self, sandbox: Sandbox, o: OpenCodeConfig, user: str) -> str:
        env = {"HOME": "/tmp/lego-opencode-verify", "OPENCODE_DISABLE_AUTOUPDATE": "1"}
        return await version_of(sandbox, [f"{self._home(o)}/cli/bin/opencode", "--version"], user=user,
                                expect=o.version, env=env)  # fmt: skip

    def config(self, request: RunRequest, o: OpenCodeConfig) -> dict[str, Any]:
        """The ``opencode.json`` that points the CLI at the adapter."""
        return {
            "$schema": "https://opencode.ai/config.json",
            "provider": {
                PROVIDER: {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": PROVIDER,
                    "options": {
                        "baseURL": request.base_url.rstrip("/") + "/v1",
                        "apiKey": request.session_id,
                    },
                    "models": {
                        request.model: {
                            "name": request.model,
                            "tool_call": True,
                            "limit": {
                                "context": request.max_context_tokens,
                                "output": request.max_response_tokens,
                            },
                        }
                    },
                }
            },
            "model": f"{PROVIDER}/{request.model}",
            "small_model": f"{PROVIDER}/{request.model}",
            "autoupdate": False,
            "share": "disabled",
            "agent": {"build": {"steps": request.max_turns, "tools": dict.fromkeys(o.disabled_tools, False)}},
        }

    def command(self, request: RunRequest, o: OpenCodeConfig) -> CommandSpec:
        cfg = f"{HOME}/.config/opencode"
        env = {
            "HOME": HOME,
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        }
        env.update(o.extra_envs)
        argv = [f"{self._home(o)}/cli/bin/opencode", "run", "--format", "json", "--title", o.title,
                "--model", f"{PROVIDER}/{request.model}", *o.extra_args, "--", request.prompt]  # fmt: skip
        # The plugin tree is copied into the per-run config folder, which the CLI writes to.
        prelude = (
            f"mkdir -p {shlex.quote(cfg)} && cp -a {shlex.quote(self._home(o))}/plugin/. {shlex.quote(cfg)}/"
        )
        return CommandSpec(
            argv=argv, env=env, cwd=request.workdir, user=request.user, prelude=prelude,
            files={f"{cfg}/opencode.json": json.dumps(self.config(request, o), indent=2) + "\n"},
        )  # fmt: skip

    def classify(self, outcome: HarnessOutcome, request: RunRequest) -> HarnessOutcome:
        """Counts ``step_finish`` events: reaching ``steps`` means the turn limit ended the run."""
        steps = 0
        error: dict[str, Any] | None = None
        for line in outcome.event_log.splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(event, dict):
                continue
            if event.get("type") == "step_finish":
                steps += 1
            elif event.get("type") == "error":
                error = event.get("error") if isinstance(event.get("error"), dict) else {"data": event}
        update: dict[str, Any] = {}
        if steps >= request.max_turns:
            update = {"hit_turn_limit": True, "detail": f"{steps} steps, limit {request.max_turns}"}
        elif error:
            # APIError: the adapter answered an HTTP error (or a connection failed): not the policy's doing.
            update = {"detail": json.dumps(error)[:500], "adapter_error": error.get("name") == "APIError"}
        return outcome.model_copy(update=update) if update else outcome

    async def artifacts(self, sandbox: Sandbox, request: RunRequest) -> dict[str, bytes]:
        # Its own log says what happened when stdout is silent (it retries a dead adapter without output).
        logs = f"{HOME}/.local/share/opencode/log"
        res = await sandbox.exec(["sh", "-c", f"find {logs} -name '*.log' -size -20M 2>/dev/null | head -5"],
                                 user=request.user, timeout=30)  # fmt: skip
        return {
            f"opencode/{Path(p).name}": await sandbox.read_file(p, user=request.user)
            for p in res.stdout.split()
        }

    def adapter_options(self, options: OpenCodeConfig) -> dict[str, Any]:
        # A JSON (non-SSE) reply makes it loop at ~10 requests/s: always stream, and cap requests.
        return {**super().adapter_options(options), "max_requests": options.max_requests}


plugin = OpenCodeHarness()
