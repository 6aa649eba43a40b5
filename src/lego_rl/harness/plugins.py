"""Plugin loading and the host-side API the rollout uses to drive one harness.

``get_plugin_manager()`` builds a fresh manager each call (no import-time global): specs, the
built-in default runner, then entry points of group ``lego_rl.harnesses``, then ``check_pending()``.

Operator knobs (read at each call):

* ``LEGO_LOAD_PLUGINS``: comma-separated allowlist of entry-point names to load; set but empty
  loads none. Unset loads all.
* ``LEGO_TRACE_PLUGINS``: when ``1``, every hook call and its result is traced to stderr.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

import pluggy
from pydantic import BaseModel, ValidationError

from lego_rl.errors import ConfigError, HarnessError
from lego_rl.harness import hookspecs
from lego_rl.harness.base import options_error
from lego_rl.harness.hookspecs import PROJECT
from lego_rl.harness.models import CommandSpec, Harness, HarnessOutcome, RunRequest, ToolchainPin
from lego_rl.harness.runner import DefaultRunner
from lego_rl.harness.toolchain import Toolchain
from lego_rl.sandbox.base import Sandbox

ENTRY_POINT_GROUP = "lego_rl.harnesses"


@dataclass(frozen=True)
class PluginSource:
    """Where a loaded plugin came from, for ``lego harnesses``."""

    entry_point: str
    package: str
    package_version: str


def _allowlist(environ: Mapping[str, str]) -> set[str] | None:
    value = environ.get("LEGO_LOAD_PLUGINS")
    if value is None:
        return None
    return {part.strip() for part in value.split(",") if part.strip()}


def get_plugin_manager(environ: Mapping[str, str] | None = None) -> pluggy.PluginManager:
    """A new plugin manager with every allowed harness plugin loaded and checked."""
    env = os.environ if environ is None else environ
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.register(DefaultRunner(pm), name="lego_rl.default_runner")
    allowed = _allowlist(env)
    sources: dict[str, PluginSource] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if allowed is not None and ep.name not in allowed:
            continue
        if pm.get_plugin(ep.name) is not None or pm.is_blocked(ep.name):
            continue
        try:
            plugin = ep.load()
        except Exception as exc:  # a broken third-party package must name itself, not crash lego
            dist = ep.dist.name if ep.dist else "?"
            raise HarnessError(
                f"harness plugin {ep.name!r} ({ep.value}, package {dist}) failed to import: {exc}"
            ) from exc
        pm.register(plugin, name=ep.name)
        sources[ep.name] = PluginSource(
            entry_point=ep.value,
            package=ep.dist.name if ep.dist else "?",
            package_version=ep.dist.version if ep.dist else "?",
        )
    try:
        pm.check_pending()  # a hook implementation whose name matches no spec is a typo: say so now
    except pluggy.PluginValidationError as exc:
        name = pm.get_name(exc.plugin) or "?"
        src = sources.get(name)
        where = f" (package {src.package})" if src else ""
        raise HarnessError(f"harness plugin {name!r}{where}: {exc}") from exc
    pm.lego_sources = sources  # type: ignore[attr-defined]  # read by describe_all()
    if env.get("LEGO_TRACE_PLUGINS", "") not in ("", "0"):
        pm.trace.root.setwriter(sys.stderr.write)
        pm.enable_tracing()
    return pm


@dataclass(frozen=True)
class HarnessInfo:
    """A described harness plus the pip package that provides it."""

    harness: Harness
    plugin: str
    package: str
    package_version: str
    hooks: tuple[str, ...] = ()
    """Hooks the plugin implements itself (the built-in runner covers the rest)."""


def _implemented(pm: pluggy.PluginManager, plugin_name: str) -> list[str]:
    plugin = pm.get_plugin(plugin_name)
    return [caller.name for caller in pm.get_hookcallers(plugin) or []]


def describe_all(pm: pluggy.PluginManager) -> list[HarnessInfo]:
    """Every registered harness, sorted by name; two plugins claiming one name is an error."""
    sources: dict[str, PluginSource] = getattr(pm, "lego_sources", {})
    infos: dict[str, HarnessInfo] = {}
    for impl in pm.hook.lego_harness_describe.get_hookimpls():
        desc = impl.function()
        if desc is None:
            continue
        if not isinstance(desc, Harness):
            raise HarnessError(
                f"plugin {impl.plugin_name!r}: lego_harness_describe returned {type(desc).__name__}, not Harness"
            )
        src = sources.get(impl.plugin_name, PluginSource("(registered in-process)", "-", "-"))
        if desc.name in infos:
            raise HarnessError(
                f"harness name {desc.name!r} is claimed by both {infos[desc.name].plugin!r} and {impl.plugin_name!r}"
            )
        hooks = tuple(sorted(n for n in _implemented(pm, impl.plugin_name)))
        infos[desc.name] = HarnessInfo(desc, impl.plugin_name, src.package, src.package_version, hooks)
    return sorted(infos.values(), key=lambda i: i.harness.name)


class HarnessHandle:
    """One harness with validated options: what generate() calls. All hook dispatch lives here."""

    def __init__(self, pm: pluggy.PluginManager, info: HarnessInfo, options: BaseModel) -> None:
        self.pm, self.info, self.options = pm, info, options
        self.name = info.harness.name

    @property
    def protocol(self) -> str:
        return self.info.harness.protocol

    def toolchain_pins(self) -> list[ToolchainPin]:
        return list(self.pm.hook.lego_harness_toolchain(harness=self.name, options=self.options) or [])

    def adapter_options(self) -> dict[str, Any]:
        return dict(self.pm.hook.lego_harness_adapter_options(harness=self.name, options=self.options) or {})

    async def install(self, sandbox: Sandbox, toolchain: Toolchain) -> str:
        pending = self.pm.hook.lego_harness_install(
            harness=self.name, sandbox=sandbox, toolchain=toolchain, options=self.options
        )
        if pending is None:
            raise HarnessError(f"harness {self.name!r} implements no install hook")
        return await pending

    async def verify(self, sandbox: Sandbox, user: str = "agent") -> str:
        pending = self.pm.hook.lego_harness_verify(
            harness=self.name, sandbox=sandbox, options=self.options, user=user
        )
        if pending is None:
            raise HarnessError(f"harness {self.name!r} implements no verify hook")
        return await pending

    def command(self, request: RunRequest) -> CommandSpec:
        spec = self.pm.hook.lego_harness_command(harness=self.name, request=request, options=self.options)
        if spec is None:
            raise HarnessError(f"harness {self.name!r} implements no command hook")
        return spec

    async def run(self, sandbox: Sandbox, request: RunRequest) -> HarnessOutcome:
        pending = self.pm.hook.lego_harness_run(
            harness=self.name, sandbox=sandbox, request=request, options=self.options
        )
        return await pending

    async def artifacts(self, sandbox: Sandbox, request: RunRequest) -> dict[str, bytes]:
        merged: dict[str, bytes] = {}
        for pending in self.pm.hook.lego_harness_artifacts(
            harness=self.name, sandbox=sandbox, request=request
        ):
            if pending is not None:
                merged.update(await pending)
        return merged


def get_harness(
    name: str,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    pm: pluggy.PluginManager | None = None,
) -> HarnessHandle:
    """Look up ``name`` (e.g. a row's ``metadata.agent``) and validate its options.

    ``overrides`` is the ``[harness.<name>]`` table; a refused option raises ``ConfigError`` naming
    ``harness.<name>.<key>``."""
    env = os.environ if environ is None else environ
    pm = pm or get_plugin_manager(env)
    infos = {i.harness.name: i for i in describe_all(pm)}
    if name not in infos:
        known = ", ".join(sorted(infos)) or "none (install the plugins: scripts/install_plugins.sh)"
        raise ConfigError(f"unknown harness {name!r}; installed: {known}", parameter="agent", value=name)
    try:
        options = pm.hook.lego_harness_options(harness=name, overrides=dict(overrides or {}), environ=env)
    except ValidationError as exc:
        # A plugin written without the base class may let its model's error escape: name the key all the same.
        raise options_error(name, exc, None, {}) from exc
    if options is None:
        raise HarnessError(f"harness {name!r} implements no options hook")
    return HarnessHandle(pm, infos[name], options)
