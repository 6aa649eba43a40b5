"""Resolution: built-in defaults < lego.toml < environment variables < ``--set section.key=value``.

``resolve()`` is the one place the order is decided. Every value remembers where it came from
(``Source``), so ``lego validate`` can show it and an error can point at the line that caused it.
After the layers are merged, one explicit ``derive()`` fills the keys whose defaults depend on others.

``[harness.<name>]`` tables go through the same layers key by key (section ``harness.<name>``), but are
not validated here: their keys belong to the harness plugin, which the config does not know. The caller
that loads plugins validates them (``compose.harnesses``) and names the source recorded here.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from lego_rl.config.envmap import read_env
from lego_rl.config.schema import HARNESS, SECTIONS, LegoConfig
from lego_rl.errors import ConfigError

SourceKind = Literal["default", "file", "env", "cli", "derived"]


@dataclass(frozen=True)
class Source:
    kind: SourceKind
    detail: str = ""
    """``lego.toml:12``, ``$SWE_EVAL_TIMEOUT_SEC``, ``--set rollout.batch_size=4`` or the derivation."""

    def __str__(self) -> str:
        return self.detail or self.kind


@dataclass
class ResolvedConfig:
    config: LegoConfig
    sources: dict[str, Source]
    """``section.field`` → where the value came from."""
    config_path: Path | None = None
    explicit: set[str] = field(default_factory=set)
    """Keys given explicitly (file, env or CLI), as opposed to defaults and derivations."""

    def source(self, key: str) -> Source:
        return self.sources.get(key, Source("default"))

    def is_explicit(self, key: str) -> bool:
        return key in self.explicit

    def harness_options(self, name: str) -> dict[str, Any]:
        """The ``[harness.<name>]`` table (file < environment < ``--set``), unvalidated; empty when unset."""
        return dict(self.config.harness.get(name, {}))


_TABLE_RE = re.compile(r"^\s*\[\s*([A-Za-z0-9_.\-\"' ]+?)\s*\]\s*(#.*)?$")
_KEY_RE = re.compile(r"^\s*([A-Za-z0-9_\-]+|\"[^\"]+\")\s*=")


def _key_lines(text: str) -> dict[tuple[str, str], int]:
    """Line number of each ``[section] key = ...`` assignment (1-based); good enough for our flat schema."""
    lines: dict[tuple[str, str], int] = {}
    table = ""
    for number, line in enumerate(text.splitlines(), start=1):
        if m := _TABLE_RE.match(line):
            table = m.group(1).strip().strip("\"'")
            lines.setdefault((table, ""), number)
        elif m := _KEY_RE.match(line):
            lines.setdefault((table, m.group(1).strip('"')), number)
    return lines


def _resolve_path_value(value: Any, base: Path) -> Any:
    if isinstance(value, str) and value and not value.startswith(("/", "lego:", "~")) and "://" not in value:
        return str((base / value).resolve())
    return value


_PATH_KEYS = {
    "model.checkpoint", "sandbox.cluster", "sandbox.images", "sandbox.rootfs", "rollout.prompt_data",
    "cluster.ssh_config", "paths.data_root", "paths.run_root", "paths.artifacts", "paths.run_log", "paths.toolchain_dir",
}
HARNESS_PATH_SUFFIXES = ("_tarball", "_tree", "_path", "_dir")
"""A harness option named like this is a host path (``native_tarball``, ``site_tree``): relative values are
taken from lego.toml's folder like every other path. The config cannot see the plugins' models, so a
naming rule decides; docs/plugins.md tells plugin authors."""
_HARNESS_NAME_RE = re.compile(r"[A-Za-z0-9_\-]+")


def is_path_key(section: str, key: str) -> bool:
    if section.startswith(f"{HARNESS}."):
        return key.endswith(HARNESS_PATH_SUFFIXES)
    return f"{section}.{key}" in _PATH_KEYS


def did_you_mean(word: str, choices: Sequence[str], prefix: str = "") -> str:
    """`` (did you mean `rollout.batch_size`?)`` for the closest of ``choices``, or ``""``."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean `{prefix}{close[0]}`?)" if close else ""


def _unknown_key(section: str, key: str) -> str:
    known = SECTIONS[section].model_fields
    return (f"unknown key `{section}.{key}`{did_you_mean(key, list(known), f'{section}.')}; "
            f"known keys of [{section}]: {', '.join(known)}")


def _harness_name(name: str, where: str) -> str:
    if not _HARNESS_NAME_RE.fullmatch(name):
        raise ConfigError(f"`{HARNESS}.{name}` is not a harness name (letters, digits, _ and -)",
                          where=where, parameter=f"{HARNESS}.{name}")
    return name


def _harness_key(rest: str, *, where: str, target: str, bad: str) -> tuple[str, str]:
    """``<name>.<key>`` after ``harness.`` → (``harness.<name>``, key); ``bad`` is the error when a part is missing."""
    name, dot, key = rest.partition(".")
    if not dot or not key:
        raise ConfigError(bad, where=where, parameter=target)
    return f"{HARNESS}.{_harness_name(name, where)}", key


def load_toml(path: Path) -> tuple[dict[tuple[str, str], Any], dict[tuple[str, str], Source]]:
    """Read ``lego.toml``: values per (section, field) with ``file:line`` sources. Unknown keys are errors."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path} (pass an existing file to -c/--config)") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}", where=str(path)) from None
    lines = _key_lines(text)
    values: dict[tuple[str, str], Any] = {}
    sources: dict[tuple[str, str], Source] = {}
    base = path.resolve().parent
    for section, table in data.items():
        where = f"{path}:{lines.get((section, ''), lines.get(('', section), 1))}"
        if section == HARNESS:
            _load_harness_tables(table, path, lines, values, sources)
            continue
        if section not in SECTIONS:
            raise ConfigError(
                f"unknown section [{section}]{did_you_mean(section, [*SECTIONS, HARNESS])}; known sections: "
                f"{', '.join([*SECTIONS, f'{HARNESS}.<name>'])}", where=where, parameter=section,
            )
        if not isinstance(table, dict):
            raise ConfigError(f"`{section}` must be a table ([{section}]), got a {type(table).__name__}",
                              where=where, parameter=section)
        model = SECTIONS[section]
        for key, value in table.items():
            line = lines.get((section, key), lines.get((section, ""), 1))
            if key not in model.model_fields:
                raise ConfigError(_unknown_key(section, key), where=f"{path}:{line}",
                                  parameter=f"{section}.{key}")
            if is_path_key(section, key):
                value = _resolve_path_value(value, base)
            values[(section, key)] = value
            sources[(section, key)] = Source("file", f"{path.name}:{line}")
    return values, sources


def _load_harness_tables(
    tables: Any,
    path: Path,
    lines: dict[tuple[str, str], int],
    values: dict[tuple[str, str], Any],
    sources: dict[tuple[str, str], Source],
) -> None:
    """``[harness.<name>]`` tables: every key kept as (``harness.<name>``, key) with its line."""
    top = lines.get((HARNESS, ""), 1)
    if not isinstance(tables, dict):
        raise ConfigError(f"`{HARNESS}` must hold one table per harness ([{HARNESS}.<name>])",
                          where=f"{path}:{top}", parameter=HARNESS)
    base = path.resolve().parent
    for name, table in tables.items():
        section = f"{HARNESS}.{name}"
        head = lines.get((section, ""), lines.get((HARNESS, name), top))
        _harness_name(name, f"{path}:{head}")
        if not isinstance(table, dict):
            raise ConfigError(f"`{section}` must be a table ([{section}]), got a {type(table).__name__}",
                              where=f"{path}:{head}", parameter=section)
        for key, value in table.items():
            # A key inside the table, or a sub-table such as [harness.codex.extra_envs].
            line = lines.get((section, key), lines.get((f"{section}.{key}", ""), head))
            if is_path_key(section, key):
                value = _resolve_path_value(value, base)
            values[(section, key)] = value
            sources[(section, key)] = Source("file", f"{path.name}:{line}")


def parse_set(assignment: str) -> tuple[str, str, Any]:
    """``section.key=value`` → (section, key, value); the value is read as TOML when it parses, else text."""
    target, sep, raw = assignment.partition("=")
    if not sep or "." not in target:
        raise ConfigError(f"--set expects section.key=value, got {assignment!r}", where="--set")
    section, _, key = target.strip().partition(".")
    if section == HARNESS:
        section, key = _harness_key(key, where="--set", target=target,
                                    bad=f"--set expects {HARNESS}.<name>.<key>=value, got {assignment!r}")
    elif section not in SECTIONS:
        hint = did_you_mean(section, [*SECTIONS, HARNESS])
        raise ConfigError(
            f"unknown section `{section}` in --set {assignment!r}{hint}; "
            f"known: {', '.join([*SECTIONS, f'{HARNESS}.<name>'])}", where="--set", parameter=target,
        )
    elif key not in SECTIONS[section].model_fields:
        raise ConfigError(f"{_unknown_key(section, key)} (in --set)", where="--set", parameter=target)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return section, key, value


def _describe_error(err: Mapping[str, Any]) -> str:
    msg = str(err.get("msg", "invalid value"))
    value = err.get("input")
    shown = repr(value) if not isinstance(value, dict | list) or len(repr(value)) < 80 else type(value).__name__
    return f"{msg} (got {shown})"


def _build(values: dict[tuple[str, str], Any], sources: dict[tuple[str, str], Source]) -> LegoConfig:
    nested: dict[str, dict[str, Any]] = {}
    for (section, key), value in values.items():
        top, dot, name = section.partition(".")
        if top == HARNESS and dot:
            nested.setdefault(HARNESS, {}).setdefault(name, {})[key] = value
        else:
            nested.setdefault(section, {})[key] = value
    try:
        return LegoConfig.model_validate(nested)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = tuple(str(p) for p in first["loc"])
        key = ".".join(loc[:2])
        src = sources.get((loc[0], loc[1])) if len(loc) >= 2 else None
        raise ConfigError(f"{key}: {_describe_error(first)}", where=str(src) if src else None,
                          parameter=key) from None


def derive(cfg: LegoConfig, sources: dict[str, Source], *, now: _dt.datetime | None = None) -> None:
    """Fill keys whose defaults depend on other keys. Explicit values are never touched."""

    def put(section: str, key: str, value: Any, how: str) -> None:
        setattr(getattr(cfg, section), key, value)
        sources[f"{section}.{key}"] = Source("derived", how)

    data_root = Path(cfg.paths.data_root)
    if cfg.paths.run_root is None:
        stamp = (now or _dt.datetime.now()).strftime("%Y%m%d-%H%M%S")
        put("paths", "run_root", str(Path("runs", f"run-{stamp}").resolve()), "runs/run-<timestamp>")
    run_root = Path(cfg.paths.run_root)  # type: ignore[arg-type]
    if cfg.paths.artifacts is None:
        put("paths", "artifacts", str(run_root / "sandboxes"), "$RUN_ROOT/sandboxes")
    if cfg.paths.run_log is None:
        put("paths", "run_log", str(run_root / "events.jsonl"), "$RUN_ROOT/events.jsonl")
    if cfg.paths.toolchain_dir is None:
        put("paths", "toolchain_dir", str(data_root / "toolchain"), "$DATA_ROOT/toolchain")
    if cfg.rollout.prompt_data is None:
        put("rollout", "prompt_data", str(data_root / "train.jsonl"), "$DATA_ROOT/train.jsonl")
    if cfg.sandbox.images is None:
        put("sandbox", "images", str(data_root / "images.json"), "$DATA_ROOT/images.json")
    if cfg.sandbox.cluster is None and cfg.sandbox.provider == "sunabako":
        candidate = data_root / "cluster.json"
        if candidate.exists():
            put("sandbox", "cluster", str(candidate), "$DATA_ROOT/cluster.json")
    guard = cfg.rollout.guard_s
    if guard is None:
        guard = cfg.agent.time_budget_s + cfg.grader.timeout_s + cfg.rollout.guard_slack_s
        put("rollout", "guard_s", guard, "agent.time_budget_s + grader.timeout_s + rollout.guard_slack_s")
    if cfg.sandbox.lifetime_s is None:
        put("sandbox", "lifetime_s", guard + 300.0, "rollout.guard_s + 300")
    if cfg.train.global_batch_size is None:
        put("train", "global_batch_size", cfg.rollout.batch_size * cfg.rollout.samples_per_prompt,
            "rollout.batch_size × rollout.samples_per_prompt")
    if cfg.train.data_parallel is None:
        gpus = trainer_devices(cfg)
        mp = cfg.train.tensor_parallel * cfg.train.pipeline_parallel
        put("train", "data_parallel", max(1, gpus // mp), "trainer GPUs / (TP × PP)")
    if cfg.grader.provider is None:
        put("grader", "provider", cfg.sandbox.provider, "sandbox.provider")
    if cfg.model.reasoning_effort and "reasoning_effort" not in cfg.model.chat_template_kwargs:
        kwargs = {**cfg.model.chat_template_kwargs, "reasoning_effort": cfg.model.reasoning_effort}
        cfg.model.chat_template_kwargs = kwargs
        previous = sources.get("model.chat_template_kwargs")
        detail = "model.reasoning_effort" + (f" + {previous}" if previous and previous.kind != "default" else "")
        sources["model.chat_template_kwargs"] = Source("derived", detail)


def trainer_devices(cfg: LegoConfig) -> int:
    """Devices the trainer runs on: GPUs across trainer nodes, or one CPU process (in Ray mode one CPU rank per
    trainer node: the ranks are placed by Ray, not started by torchrun on one machine)."""
    cl = cfg.cluster
    per_node = cl.gpus_per_node or (1 if cl.mode == "ray" else 0)
    return max(1, cl.trainer_nodes * per_node)


def resolve(
    config_path: Path | str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Sequence[str] = (),
    typed_overrides: Mapping[str, tuple[Any, str]] | None = None,
    now: _dt.datetime | None = None,
) -> ResolvedConfig:
    """Resolve the configuration from every layer; raise ``ConfigError`` with a precise location.

    ``typed_overrides`` maps ``section.key`` to ``(value, option)`` for a CLI's typed options (``--data``
    → ``rollout.prompt_data``): the value is taken as given, never re-parsed from a ``--set`` string (where
    a backslash in a path would be read as an escape), and wins over ``overrides``.
    """
    environ = os.environ if environ is None else environ
    values: dict[tuple[str, str], Any] = {}
    sources: dict[tuple[str, str], Source] = {}
    path = Path(config_path) if config_path is not None else None
    if path is not None:
        file_values, file_sources = load_toml(path)
        values.update(file_values)
        sources.update(file_sources)
    for (section, key), (var, value) in read_env(environ).items():
        if is_path_key(section, key):
            value = _resolve_path_value(value, Path.cwd())
        values[(section, key)] = value
        sources[(section, key)] = Source("env", f"${var}")
    for assignment in overrides:
        section, key, value = parse_set(assignment)
        if is_path_key(section, key):
            value = _resolve_path_value(value, Path.cwd())
        values[(section, key)] = value
        sources[(section, key)] = Source("cli", f"--set {assignment}")
    for target, (value, option) in (typed_overrides or {}).items():
        section, _, key = target.partition(".")
        if section == HARNESS:
            # harness.<name>.<key>: the plugin validates the key later, as for the file and --set.
            section, key = _harness_key(key, where=option, target=target,
                                        bad=f"{option} expects {HARNESS}.<name>.<key>, got `{target}`")
        elif section not in SECTIONS or key not in SECTIONS[section].model_fields:
            raise ConfigError(f"{option} targets unknown key `{target}`", where=option, parameter=target)
        if is_path_key(section, key):
            value = _resolve_path_value(value, Path.cwd())
        values[(section, key)] = value
        sources[(section, key)] = Source("cli", option)
    cfg = _build(values, sources)
    flat = {f"{s}.{k}": src for (s, k), src in sources.items()}
    explicit = set(flat)
    derive(cfg, flat, now=now)
    return ResolvedConfig(config=cfg, sources=flat, config_path=path, explicit=explicit)


def iter_values(cfg: LegoConfig) -> list[tuple[str, str, Any]]:
    """``(section, field, value)`` for every key, in schema order (secrets stay masked)."""
    rows = []
    for section in SECTIONS:
        model = getattr(cfg, section)
        for name in type(model).model_fields:
            rows.append((section, name, getattr(model, name)))
    return rows


def config_json(r: ResolvedConfig) -> dict[str, dict[str, Any]]:
    """``{section: {key: {"value", "source"}}}`` for ``--json`` output and the run's config.json.

    Secrets are masked: this goes to terminals and to disk.
    """
    data: dict[str, dict[str, Any]] = {}
    for section, key, value in iter_values(r.config):
        if hasattr(value, "get_secret_value"):
            value = "**********"
        data.setdefault(section, {})[key] = {"value": value, "source": str(r.source(f"{section}.{key}"))}
    for name, table in sorted(r.config.harness.items()):
        data.setdefault(HARNESS, {})[name] = {
            key: {"value": value, "source": str(r.source(f"{HARNESS}.{name}.{key}"))}
            for key, value in table.items()
        }
    return data
