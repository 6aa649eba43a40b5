"""Environment variables that map onto config keys.

Two kinds are accepted:

* The reference example's variables (``SWE_*``, ``SUNABAKO_*``, ``ADAPTER_*``, launcher variables such as
  ``NUM_ROLLOUT``) listed in ``ENV_VARS``, each onto exactly one key. ``VIME_AGENT_*`` / ``VIME_*`` names are
  accepted as aliases of our ``LEGO_AGENT_*`` / ``LEGO_*`` names: they are our users' migration path.
* The generic form ``LEGO_<SECTION>_<KEY>`` for every key (``LEGO_TRAIN_LR=2e-6``).

The ``LEGO_AGENT_*`` variables of the four shipped harnesses set keys of their ``[harness.<name>]``
tables (``LEGO_AGENT_CODEX_EXTRA_ARGS`` → ``harness.codex.extra_args``); one variable may set a key of
several harnesses (``LEGO_AGENT_NODE_TARBALL``). They are the plugins' ``env_names`` (a test keeps the two
in step), listed here so that the config's precedence (file < environment < ``--set``) holds for them.
An empty harness variable counts as unset, as the plugins read it.

A JSON-valued variable (``*_EXTRA_ENVS``, ``CHAT_TEMPLATE_KWARGS``) is parsed here; a malformed value is a
``ConfigError`` naming the variable.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lego_rl.config.schema import SECTIONS
from lego_rl.errors import ConfigError


@dataclass(frozen=True)
class EnvVar:
    name: str
    key: str
    """``section.field``, or ``harness.<name>.<option>``."""
    meaning: str
    aliases: tuple[str, ...] = ()
    json: bool = False
    list_sep: str | None = None
    also: tuple[str, ...] = ()
    """Further keys the same value sets (a Node tarball shared by two harnesses)."""

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.key, *self.also)


def _agent(suffix: str, key: str, meaning: str, *, json: bool = False, also: tuple[str, ...] = (),
           aliases: tuple[str, ...] = ()) -> EnvVar:
    """A harness variable ``LEGO_AGENT_<suffix>``, also read as the reference example's
    ``VIME_AGENT_<suffix>`` (which wins over older ``aliases``, and loses to the ``LEGO_`` name)."""
    names = (*aliases, f"VIME_AGENT_{suffix}")
    return EnvVar(f"LEGO_AGENT_{suffix}", key, meaning, names, json=json, also=also)


def split_key(key: str) -> tuple[str, str]:
    """``rollout.batch_size`` → (``rollout``, ``batch_size``); ``harness.codex.version`` → (``harness.codex``,
    ``version``)."""
    section, _, field = key.rpartition(".")
    return section, field


ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar("SWE_SANDBOX_PROVIDER", "sandbox.provider", "Provider used for both agent and evaluator."),
    EnvVar("SUNABAKO_CLUSTER", "sandbox.cluster", "sunabako sandbox nodes (cluster.json)."),
    EnvVar("SUNABAKO_IMAGES", "sandbox.images", "Imported task images (images.json)."),
    EnvVar("SUNABAKO_MEMORY_MB", "sandbox.memory_mb", "Requested memory per sandbox."),
    EnvVar("SUNABAKO_ALLOW_TEST_MEMORY", "sandbox.allow_test_memory", "0 for cgroups; 1 only for RSS tests."),
    EnvVar("SUNABAKO_ARTIFACTS", "paths.artifacts", "Saved commands, CLI trajectories, grading output."),
    EnvVar("SUNABAKO_START_RAY", "cluster.start_ray", "0 reuses the experiment's Ray cluster."),
    EnvVar("ADAPTER_PUBLIC_HOST", "adapter.public_host", "Routable address advertised to sandboxes."),
    EnvVar("ADAPTER_BIND_HOST", "adapter.bind_host", "Adapter listening address."),
    EnvVar("ADAPTER_PORT", "adapter.port", "Adapter listening port."),
    _agent("NODE_TARBALL", "harness.claude_code.node_tarball", "Host-side Node 22 tarball (npm path).",
           also=("harness.codex.node_tarball",)),
    _agent("CC_TARBALL", "harness.claude_code.cli_tarball", "Claude Code npm tarball."),
    _agent("CC_NATIVE_TARBALL", "harness.claude_code.native_tarball", "Claude Code platform archive."),
    _agent("CC_EXTRA_ARGS", "harness.claude_code.extra_args", "Claude CLI flags."),
    _agent("CC_EXTRA_ENVS", "harness.claude_code.extra_envs", "JSON overrides of the Claude CLI environment.",
           json=True),
    _agent("CC_VERSION", "harness.claude_code.version", "Claude Code version to install."),
    _agent("CODEX_TARBALL", "harness.codex.cli_tarball", "Codex npm tarball."),
    _agent("CODEX_NATIVE_TARBALL", "harness.codex.native_tarball", "Codex platform archive."),
    _agent("CODEX_EXTRA_ARGS", "harness.codex.extra_args", "Extra Codex CLI settings."),
    _agent("CODEX_EXTRA_ENVS", "harness.codex.extra_envs", "JSON overrides of the Codex environment.",
           json=True),
    _agent("CODEX_VERSION", "harness.codex.version", "Codex version to install."),
    _agent("OPENCODE_NATIVE_TARBALL", "harness.opencode.native_tarball", "OpenCode platform archive.",
           aliases=("VIME_AGENT_OPENCODE_TARBALL", "LEGO_AGENT_OPENCODE_TARBALL")),
    _agent("OPENCODE_PLUGIN_TREE", "harness.opencode.plugin_tree", "Packed @opencode-ai/plugin tree."),
    _agent("OPENCODE_EXTRA_ARGS", "harness.opencode.extra_args", "Extra OpenCode flags."),
    _agent("OPENCODE_EXTRA_ENVS", "harness.opencode.extra_envs", "JSON overrides of the OpenCode env.",
           json=True),
    _agent("OPENCODE_VERSION", "harness.opencode.version", "OpenCode version to install."),
    _agent("OPENHANDS_SITE_TREE", "harness.openhands.site_tree", "Packed OpenHands site-packages tree."),
    _agent("OPENHANDS_PYTHON", "harness.openhands.python", "Python interpreter inside the sandbox image."),
    _agent("OPENHANDS_EXTRA_ARGS", "harness.openhands.extra_args", "Extra OpenHands runner arguments."),
    _agent("OPENHANDS_EXTRA_ENVS", "harness.openhands.extra_envs", "JSON overrides of the OpenHands env.",
           json=True),
    _agent("OPENHANDS_VERSION", "harness.openhands.version", "OpenHands SDK version to install."),
    EnvVar("LEGO_AGENT_SANDBOX_IMAGE_METADATA_KEY", "agent.sandbox_image_metadata_key",
           "Row metadata key naming the sandbox image.", ("VIME_AGENT_SANDBOX_IMAGE_METADATA_KEY",)),
    EnvVar("LEGO_FORK_MERGE_MAX_RESPONSE_TOKENS", "rollout.fork_merge_max_response_tokens",
           "Short-turn rewrite merging threshold (0 = off).", ("VIME_FORK_MERGE_MAX_RESPONSE_TOKENS",)),
    EnvVar("SWE_AGENT", "agent.default_harness", "Default harness when a row's metadata.agent is unset."),
    EnvVar("SWE_AGENT_TIME_BUDGET_SEC", "agent.time_budget_s", "Agent CLI wall-clock budget."),
    EnvVar("SWE_EVAL_TIMEOUT_SEC", "grader.timeout_s", "Official grader timeout."),
    EnvVar("SWE_ROLLOUT_GUARD_SEC", "rollout.guard_s", "Whole-rollout deadline, including sandbox setup."),
    EnvVar("SWE_BOOT_CONCURRENCY", "sandbox.boot_concurrency", "Concurrent sandbox boots."),
    EnvVar("SWE_CC_PROMPT", "agent.prompt", "Agent instruction; official tests remain in the grader."),
    EnvVar("NUM_ROLLOUT", "train.num_rollout", "Rollout steps."),
    EnvVar("PROMPT_DATA", "rollout.prompt_data", "Task rows (JSONL)."),
    EnvVar("ROLLOUT_BATCH_SIZE", "rollout.batch_size", "Prompts per rollout step."),
    EnvVar("SAMPLES_PER_PROMPT", "rollout.samples_per_prompt", "Samples per prompt."),
    EnvVar("GLOBAL_BATCH_SIZE", "train.global_batch_size", "Samples per optimizer step."),
    EnvVar("MAX_CONTEXT_LEN", "model.max_context_len", "Model context in tokens."),
    EnvVar("MAX_RESPONSE_LEN", "model.max_response_len", "Per-turn output limit in tokens."),
    EnvVar("HF_CHECKPOINT", "model.checkpoint", "Policy checkpoint directory."),
    EnvVar("CHAT_TEMPLATE_KWARGS", "model.chat_template_kwargs", "Chat template options (JSON).", json=True),
    EnvVar("DATA_ROOT", "paths.data_root", "Shared data directory."),
    EnvVar("RUN_ROOT", "paths.run_root", "This run's directory (new per experiment)."),
    EnvVar("RUN_LOG", "paths.run_log", "Event log path (new when retrying with retained engines)."),
    EnvVar("TRAIN_HEAD", "cluster.train_head", "First training node."),
    EnvVar("TRAIN_WORKER", "cluster.train_workers", "Other training nodes (comma separated).", list_sep=","),
    EnvVar("SSH_PORT", "cluster.ssh_port", "SSH port of the nodes."),
    EnvVar("GLOO_SOCKET_IFNAME", "cluster.gloo_socket_ifname", "Training network interface."),
    EnvVar("VLLM_DISABLE_CUDA_GRAPH", "serving.disable_cuda_graph", "Disable decode CUDA graphs."),
    EnvVar("E2B_API_KEY", "sandbox.e2b_api_key", "E2B API key."),
)

_BY_KEY: dict[str, EnvVar] = {key: v for v in ENV_VARS for key in v.keys}


def generic_name(section: str, field: str) -> str:
    return f"LEGO_{section.upper()}_{field.upper()}"


def _is_json_field(section: str, field: str) -> bool:
    if section not in SECTIONS:  # a harness option: the EnvVar says
        return False
    annotation = str(SECTIONS[section].model_fields[field].annotation)
    return annotation.startswith("dict")


def _is_list_field(section: str, field: str) -> bool:
    # Harness options stay text: the plugin's model splits ``extra_args`` like a shell line.
    return section in SECTIONS and str(SECTIONS[section].model_fields[field].annotation).startswith("list")


def parse_env_value(var: str, raw: str, section: str, field: str) -> Any:
    """Turn one variable's text into a value for ``section.field`` (pydantic coerces scalars)."""
    known = _BY_KEY.get(f"{section}.{field}")
    if _is_json_field(section, field) or (known is not None and known.json):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"${var} is not valid JSON ({exc.msg} at column {exc.colno}); expected a JSON object such as "
                '\'{"KEY": "value"}\'',
                where=f"${var}",
                parameter=f"{section}.{field}",
                value=raw,
            ) from None
        if not isinstance(value, dict):
            raise ConfigError(
                f"${var} must be a JSON object, got {type(value).__name__}", where=f"${var}",
                parameter=f"{section}.{field}", value=raw,
            )
        return value
    if _is_list_field(section, field):
        sep = known.list_sep if known and known.list_sep else ","
        return [item.strip() for item in raw.split(sep) if item.strip()]
    optional = section in SECTIONS and str(SECTIONS[section].model_fields[field].annotation).endswith("None")
    if raw == "" and optional:
        return None
    return raw


def read_env(environ: Mapping[str, str]) -> dict[tuple[str, str], tuple[str, Any]]:
    """All config values present in ``environ``: ``{(section, field): (variable name, value)}``.

    When a key is set by several variables, the reference/LEGO name wins over its VIME alias, and the
    generic ``LEGO_<SECTION>_<KEY>`` form wins over both (it is the most specific, our own spelling).
    """
    found: dict[tuple[str, str], tuple[str, Any]] = {}
    for var in ENV_VARS:
        for key in var.keys:
            section, field = split_key(key)
            for name in (*var.aliases, var.name):  # later names win
                if name not in environ or (section not in SECTIONS and environ[name] == ""):
                    continue
                found[(section, field)] = (name, parse_env_value(name, environ[name], section, field))
    for section, model in SECTIONS.items():
        for field in model.model_fields:
            name = generic_name(section, field)
            if name in environ and name not in {v.name for v in ENV_VARS}:
                found[(section, field)] = (name, parse_env_value(name, environ[name], section, field))
    return found
