"""From the resolved config to harness handles: each ``[harness.<name>]`` table reaches its plugin.

The config resolves the tables (lego.toml < environment < ``--set``) without knowing any plugin; here
each table is handed to its plugin's ``lego_harness_options`` hook, so the plugin's own pydantic model
is the only validator. A refused value comes back naming ``harness.<name>.<key>``, and is re-pointed at
the lego.toml line, variable or ``--set`` that supplied it. ``lego validate`` runs the same path
(``harness_inventory``) as the rollout (``harness_factory``), so what validates is what runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from functools import cache

import pluggy

from lego_rl.config.checks import HarnessInventory
from lego_rl.config.resolve import ResolvedConfig
from lego_rl.errors import ConfigError, HarnessError
from lego_rl.harness.plugins import HarnessHandle, describe_all, get_harness, get_plugin_manager


def locate(exc: ConfigError, r: ResolvedConfig) -> ConfigError:
    """``exc`` pointed at the config source of its key: the plugin knows the key, the config the line."""
    key = exc.parameter or ""
    parts = key.split(".")
    # harness.<name>.<key>[.<nested>]: the source is recorded per top-level option key.
    source_key = ".".join(parts[:3]) if len(parts) >= 3 else key
    if source_key not in r.sources:
        return exc
    message = exc.args[0] if exc.args else str(exc)
    return ConfigError(message, where=str(r.source(source_key)), parameter=exc.parameter, value=exc.value)


def _handle(r: ResolvedConfig, name: str, env: Mapping[str, str], pm: pluggy.PluginManager) -> HarnessHandle:
    try:
        return get_harness(name, overrides=r.harness_options(name), environ=env, pm=pm)
    except ConfigError as exc:
        raise locate(exc, r) from None


def harness_factory(
    r: ResolvedConfig, environ: Mapping[str, str] | None = None, pm: pluggy.PluginManager | None = None
) -> Callable[[str], HarnessHandle]:
    """A cached lookup ``name -> HarnessHandle`` with the run's options (one plugin manager per run,
    loaded from the entry points unless given)."""
    env = dict(os.environ if environ is None else environ)
    pm = pm or get_plugin_manager(env)

    @cache
    def lookup(name: str) -> HarnessHandle:
        return _handle(r, name, env, pm)

    return lookup


def harness_inventory(
    r: ResolvedConfig, environ: Mapping[str, str] | None = None, pm: pluggy.PluginManager | None = None
) -> HarnessInventory:
    """What ``lego validate`` needs to know about harness plugins: which are installed, and which
    options each refuses. Every installed harness's options are built, as a rollout would build them."""
    env = dict(os.environ if environ is None else environ)
    try:
        pm = pm or get_plugin_manager(env)
        installed = frozenset(info.harness.name for info in describe_all(pm))
    except HarnessError as exc:
        return HarnessInventory(installed=frozenset(), load_error=str(exc))
    refused: list[ConfigError] = []
    for name in sorted(installed):
        try:
            _handle(r, name, env, pm)
        except ConfigError as exc:
            refused.append(exc)
        except HarnessError as exc:
            refused.append(ConfigError(f"harness {name!r}: {exc}", parameter=f"harness.{name}"))
    return HarnessInventory(installed=installed, option_errors=tuple(refused))
