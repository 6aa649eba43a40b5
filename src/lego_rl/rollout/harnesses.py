"""From ``[agent]`` config keys to each harness plugin's own options.

The plugins read their ``LEGO_AGENT_*`` / ``VIME_AGENT_*`` variables themselves; this passes on what the
operator set in ``lego.toml`` or with ``--set`` (values left at their defaults are not passed, so a
plugin's own defaults stand).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

from lego_rl.config.resolve import ResolvedConfig
from lego_rl.harness.plugins import HarnessHandle, get_harness, get_plugin_manager

# agent.<key> -> (harness, option); shared keys (node tarball) appear once per harness that uses them.
_MAP: dict[str, dict[str, str]] = {
    "claude_code": {"cc_native_tarball": "native_tarball", "cc_tarball": "cli_tarball", "node_tarball": "node_tarball",
                    "cc_extra_args": "extra_args", "cc_extra_envs": "extra_envs",
                    "max_thinking_tokens": "max_thinking_tokens", "autocompact_pct": "autocompact_pct"},
    "codex": {"codex_native_tarball": "native_tarball", "codex_tarball": "cli_tarball", "node_tarball": "node_tarball",
              "codex_extra_args": "extra_args", "codex_extra_envs": "extra_envs"},
    "opencode": {"opencode_tarball": "native_tarball", "opencode_extra_args": "extra_args",
                 "opencode_extra_envs": "extra_envs"},
    "openhands": {"openhands_extra_envs": "extra_envs"},
}


def harness_overrides(r: ResolvedConfig, harness: str) -> dict[str, Any]:
    """Options for ``harness`` from the config keys that were set explicitly."""
    out: dict[str, Any] = {}
    for key, option in _MAP.get(harness, {}).items():
        if not r.is_explicit(f"agent.{key}"):
            continue
        value = getattr(r.config.agent, key)
        if option == "extra_args" and isinstance(value, str):
            value = shlex.split(value)
        elif option == "autocompact_pct":
            value = round(value)
        out[option] = value
    return out


def harness_factory(r: ResolvedConfig, environ: Mapping[str, str] | None = None) -> Callable[[str], HarnessHandle]:
    """A cached lookup ``name -> HarnessHandle`` with the run's options (one plugin manager per run)."""
    env = dict(os.environ if environ is None else environ)
    pm = get_plugin_manager(env)

    @cache
    def lookup(name: str) -> HarnessHandle:
        return get_harness(name, overrides=harness_overrides(r, name), environ=env, pm=pm)

    return lookup
