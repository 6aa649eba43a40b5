"""``HarnessPlugin``: an optional base class that turns the name-dispatched hooks into plain methods.

A plugin subclasses ``HarnessPlugin[MyConfig]``, sets ``Config = MyConfig`` and the ``ClassVar``s, and
overrides ``install``, ``verify`` and ``command`` (plus ``classify`` if its event log shows a turn
limit); those methods receive ``options`` typed as its own ``MyConfig``. The hook implementations here
answer only for ``self.name`` and return None for any other harness, as the specs require.
Writing the hooks by hand instead is equally supported (see docs/plugins.md).

Options come from ``[harness.<name>]`` in lego.toml (the config resolves file, environment and
``--set`` into that table and passes it as ``overrides``) and, for callers without a config (``lego
toolchain fetch``), from the plugin's own ``env_names`` variables. Either way the plugin's model is
the only validator, and an error names ``harness.<name>.<key>``.
"""

from __future__ import annotations

import difflib
import json
import shlex
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from lego_rl.errors import ConfigError, HarnessError
from lego_rl.harness.hookspecs import hookimpl
from lego_rl.harness.models import (
    AdapterProtocol,
    CommandSpec,
    Harness,
    HarnessOutcome,
    RunRequest,
    ToolchainPin,
)
from lego_rl.harness.toolchain import Toolchain
from lego_rl.sandbox.base import Sandbox

ENV_PREFIXES = ("LEGO_AGENT_", "VIME_AGENT_")
"""Current name first; ``VIME_AGENT_*`` is the reference example's name, kept as a migration path."""


def agent_env(environ: Mapping[str, str], suffix: str) -> tuple[str, str] | None:
    """Look up ``LEGO_AGENT_<suffix>`` then ``VIME_AGENT_<suffix>``; return (variable, value) or None."""
    for prefix in ENV_PREFIXES:
        var = prefix + suffix
        if environ.get(var, "") != "":
            return var, environ[var]
    return None


def parse_extra_args(var: str, value: str) -> list[str]:
    try:
        return shlex.split(value)
    except ValueError as exc:
        raise ConfigError(f"cannot split into arguments: {exc}", where=f"${var}", value=value) from exc


def parse_extra_envs(var: str, value: str) -> dict[str, str]:
    """A JSON object of string values (numbers are accepted and turned into strings)."""
    try:
        data = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"not valid JSON ({exc.msg} at column {exc.colno})", where=f"${var}", value=value
        ) from exc
    if not isinstance(data, dict):
        raise ConfigError("must be a JSON object of NAME: value", where=f"${var}", value=value)
    out: dict[str, str] = {}
    for key, val in data.items():
        if not isinstance(val, str | int | float) or isinstance(val, bool):
            raise ConfigError(f"value of {key!r} must be a string or number", where=f"${var}", value=value)
        out[str(key)] = str(val)
    return out


def merge_flag_args(defaults: list[str], extra: list[str]) -> list[str]:
    """``defaults`` then ``extra``, dropping a default flag (and its value) that ``extra`` sets again.

    Flags are ``--name value`` or ``--name=value``; a default followed by a non-flag token is taken to
    own it. This is how ``*_EXTRA_ARGS='--max-turns 40'`` overrides a built-in ``--max-turns 30``.
    """
    given = {a.split("=", 1)[0] for a in extra if a.startswith("-")}
    out: list[str] = []
    i = 0
    while i < len(defaults):
        arg = defaults[i]
        owns_value = "=" not in arg and i + 1 < len(defaults) and not defaults[i + 1].startswith("-")
        if arg.startswith("-") and arg.split("=", 1)[0] in given:
            i += 2 if owns_value else 1
            continue
        out.append(arg)
        i += 1
    return out + extra


class HarnessConfig(BaseModel):
    """Fields every harness config has; plugins extend it."""

    model_config = ConfigDict(extra="forbid")

    version: str
    """CLI version to install (must match a pin the toolchain holds)."""
    extra_args: list[str] = []
    """Appended to the command line, overriding a default flag of the same name. A string is split like
    a shell line (``extra_args = "--max-turns 40"``), as the ``*_EXTRA_ARGS`` variables are."""
    extra_envs: dict[str, str] = {}
    """Merged over the CLI environment last; numbers are turned into strings."""

    @field_validator("extra_args", mode="before")
    @classmethod
    def _split_shell_line(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return shlex.split(value)
            except ValueError as exc:
                raise ValueError(f"cannot split into arguments: {exc}") from None
        return value

    @field_validator("extra_envs", mode="before")
    @classmethod
    def _numbers_as_text(cls, value: Any) -> Any:
        # An environment holds text; a TOML `CLAUDE_CODE_MAX_OUTPUT_TOKENS = 8192` means "8192". A bool
        # has no one spelling ("true"? "1"?), so it stays an error.
        if isinstance(value, dict):
            return {
                k: str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v
                for k, v in value.items()
            }
        return value


class ArchiveOrNpmConfig(HarnessConfig):
    """A CLI installed either from its native platform archive or from Node plus its npm package.

    Unless ``install_from`` is given, a native tarball selects ``native`` and the Node / npm tarballs alone
    select ``npm``: the reference example's precedence, shared by every such harness.
    """

    install_from: Literal["native", "npm"] = "native"
    native_tarball: Path | None = None
    cli_tarball: Path | None = None
    node_tarball: Path | None = None

    @model_validator(mode="after")
    def _tarball_selects_path(self) -> ArchiveOrNpmConfig:
        if "install_from" not in self.model_fields_set:
            if self.native_tarball is not None:
                self.install_from = "native"
            elif self.cli_tarball is not None or self.node_tarball is not None:
                self.install_from = "npm"
        return self


ConfigT = TypeVar("ConfigT", bound=HarnessConfig)


def options_error(
    harness: str, exc: ValidationError, model: type[BaseModel] | None, sources: Mapping[str, str]
) -> ConfigError:
    """A plugin model's ``ValidationError`` as one ``ConfigError`` naming ``harness.<name>.<key>``.

    An unknown key gets the model's closest field as a suggestion; ``sources`` maps a field to where
    its value came from (a variable), else the error points at ``[harness.<name>]``.
    """
    errors = exc.errors()
    first = errors[0]
    loc = [str(part) for part in first["loc"]]
    key = loc[0] if loc else "?"
    parameter = ".".join([f"harness.{harness}", *loc]) if loc else f"harness.{harness}"
    if first["type"] == "extra_forbidden":
        fields = list(model.model_fields) if model is not None else []
        close = difflib.get_close_matches(key, fields, n=1)
        hint = f" (did you mean `harness.{harness}.{close[0]}`?)" if close else ""
        known = f"; known keys of [harness.{harness}]: {', '.join(fields)}" if fields else ""
        message = f"unknown key `{parameter}`{hint}{known}"
    else:
        message = f"{parameter}: {first['msg']} (got {first.get('input')!r})"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem(s) in [harness.{harness}])"
    return ConfigError(message, where=sources.get(key, f"[harness.{harness}]"), parameter=parameter,
                       value=first.get("input"))


class HarnessPlugin(Generic[ConfigT]):
    """Base for one harness. Register an *instance* through the entry point group ``lego_rl.harnesses``.

    Generic over its options model: ``class MyHarness(HarnessPlugin[MyConfig])`` with ``Config = MyConfig``
    gives every method below ``options: MyConfig``.
    """

    name: ClassVar[str]
    protocol: ClassVar[AdapterProtocol]
    cli_package: ClassVar[str]
    summary: ClassVar[str] = ""
    # Not a ClassVar: a ClassVar cannot name the type variable, and this is what types ``options``.
    Config: type[ConfigT]
    """The plugin's options model: the ``[harness.<name>]`` table in lego.toml, validated."""
    env_names: ClassVar[dict[str, str]] = {}
    """Config field -> ``LEGO_AGENT_<suffix>`` suffix (JSON fields ``extra_envs`` are parsed as JSON)."""
    enforces_turn_limit: ClassVar[bool] = True
    """Whether the CLI stops by itself at ``max_turns``; otherwise the adapter must cap requests."""
    streams_only: ClassVar[bool] = False
    """Whether the CLI mishandles non-streamed (JSON) replies, so the adapter must always stream."""

    # ---- methods a subclass overrides -------------------------------------------------------------
    def toolchain(self, options: ConfigT) -> list[ToolchainPin]:
        raise NotImplementedError

    async def install(self, sandbox: Sandbox, toolchain: Toolchain, options: ConfigT) -> str:
        raise NotImplementedError

    async def verify(self, sandbox: Sandbox, options: ConfigT, user: str) -> str:
        raise NotImplementedError

    def command(self, request: RunRequest, options: ConfigT) -> CommandSpec:
        raise NotImplementedError

    def classify(self, outcome: HarnessOutcome, request: RunRequest) -> HarnessOutcome:
        return outcome

    def adapter_options(self, options: ConfigT) -> dict[str, Any]:
        """Protocol and the quirks the capability flags imply; subclasses add their own keys."""
        return {
            "protocol": self.protocol,
            "force_stream": self.streams_only,
            "enforce_turn_limit": not self.enforces_turn_limit,
        }

    async def artifacts(self, sandbox: Sandbox, request: RunRequest) -> dict[str, bytes]:
        return {}

    def capabilities(self) -> dict[str, bool]:
        return {"enforces_turn_limit": self.enforces_turn_limit, "streams_only": self.streams_only}

    def options(self, overrides: Mapping[str, Any], environ: Mapping[str, str]) -> ConfigT:
        """Environment first, then config values over it, then validation naming the bad key.

        Through lego's config the overrides already hold the ``LEGO_AGENT_*`` variables the config
        maps (with the config's precedence: file < environment < ``--set``); reading them here too is
        for callers without a config, and gives the same value."""
        raw: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for field, suffix in self.env_names.items():
            found = agent_env(environ, suffix)
            if found is None:
                continue
            var, value = found
            sources[field] = f"${var}"
            if field == "extra_args":
                raw[field] = parse_extra_args(var, value)
            elif field == "extra_envs":
                raw[field] = parse_extra_envs(var, value)
            else:
                raw[field] = value
        for key, value in overrides.items():
            raw[key] = value
            sources[key] = f"[harness.{self.name}]"
        try:
            return self.Config.model_validate(raw)
        except ValidationError as exc:
            raise options_error(self.name, exc, self.Config, sources) from exc

    def _own(self, options: object) -> ConfigT:
        """``options`` as this plugin's model; anything else is a host bug, named rather than guessed."""
        if not isinstance(options, self.Config):
            raise HarnessError(
                f"harness {self.name!r} was handed options of type {type(options).__name__}, not its "
                f"{self.Config.__name__} (options must come from its lego_harness_options hook)"
            )
        return options

    # ---- hook implementations: answer for our own name only ---------------------------------------
    @hookimpl
    def lego_harness_describe(self) -> Harness:
        if not hasattr(self, "Config"):
            raise HarnessError(f"harness {self.name!r}: its plugin class sets no Config (its options model)")
        try:
            defaults = self.Config.model_validate({}).model_dump(mode="json")
        except ValidationError as exc:
            raise HarnessError(
                f"harness {self.name!r}: its Config must give every field a default ({exc})"
            ) from exc
        return Harness(
            name=self.name, version=defaults["version"], protocol=self.protocol, cli_package=self.cli_package,
            summary=self.summary, defaults=defaults, capabilities=self.capabilities(),
        )  # fmt: skip

    @hookimpl
    def lego_harness_options(
        self, harness: str, overrides: Mapping[str, Any], environ: Mapping[str, str]
    ) -> Any:
        return self.options(overrides, environ) if harness == self.name else None

    @hookimpl
    def lego_harness_toolchain(self, harness: str, options: object) -> list[ToolchainPin] | None:
        return self.toolchain(self._own(options)) if harness == self.name else None

    @hookimpl
    def lego_harness_adapter_options(self, harness: str, options: object) -> dict[str, Any] | None:
        return self.adapter_options(self._own(options)) if harness == self.name else None

    @hookimpl
    def lego_harness_install(
        self, harness: str, sandbox: Sandbox, toolchain: Toolchain, options: object
    ) -> Awaitable[str] | None:
        return self.install(sandbox, toolchain, self._own(options)) if harness == self.name else None

    @hookimpl
    def lego_harness_verify(
        self, harness: str, sandbox: Sandbox, options: object, user: str
    ) -> Awaitable[str] | None:
        return self.verify(sandbox, self._own(options), user) if harness == self.name else None

    @hookimpl
    def lego_harness_command(self, harness: str, request: RunRequest, options: object) -> CommandSpec | None:
        return self.command(request, self._own(options)) if harness == self.name else None

    @hookimpl
    def lego_harness_classify(
        self, harness: str, outcome: HarnessOutcome, request: RunRequest
    ) -> HarnessOutcome | None:
        return self.classify(outcome, request) if harness == self.name else None

    @hookimpl
    def lego_harness_artifacts(
        self, harness: str, sandbox: Sandbox, request: RunRequest
    ) -> Awaitable[dict[str, bytes]] | None:
        return self.artifacts(sandbox, request) if harness == self.name else None
