"""Harness plugins: how lego installs and drives a coding CLI inside a sandbox.

Public API::

    from lego_rl.harness import get_harness, RunRequest
    h = get_harness("claude_code")                 # plugin found through entry points
    await h.install(sandbox, Toolchain())          # offline, hash-checked
    outcome = await h.run(sandbox, RunRequest(...))

Plugins implement the hooks in ``lego_rl.harness.hookspecs`` (or subclass ``HarnessPlugin``).
"""

from lego_rl.harness.base import HarnessConfig, HarnessPlugin, agent_env
from lego_rl.harness.hookspecs import hookimpl
from lego_rl.harness.models import CommandSpec, Harness, HarnessOutcome, RunRequest, ToolchainPin
from lego_rl.harness.plugins import HarnessHandle, HarnessInfo, describe_all, get_harness, get_plugin_manager
from lego_rl.harness.toolchain import Toolchain, default_toolchain_dir

__all__ = [
    "CommandSpec",
    "Harness",
    "HarnessConfig",
    "HarnessHandle",
    "HarnessInfo",
    "HarnessOutcome",
    "HarnessPlugin",
    "RunRequest",
    "Toolchain",
    "ToolchainPin",
    "agent_env",
    "default_toolchain_dir",
    "describe_all",
    "get_harness",
    "get_plugin_manager",
    "hookimpl",
]
