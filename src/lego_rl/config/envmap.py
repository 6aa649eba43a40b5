"""Environment variables that map onto config keys.

Two kinds are accepted:

* The reference example's variables (``SWE_*``, ``SUNABAKO_*``, ``ADAPTER_*``, launcher variables such as
  ``NUM_ROLLOUT``) listed in ``ENV_VARS``, each onto exactly one key. ``VIME_AGENT_*`` / ``VIME_*`` names are
  accepted as aliases of our ``LEGO_AGENT_*`` / ``LEGO_*`` names: they are our users' migration path.
* The generic form ``LEGO_<SECTION>_<KEY>`` for every key (``LEGO_TRAIN_LR=2e-6``).

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
    """``section.field``."""
    meaning: str
    aliases: tuple[str, ...] = ()
    json: bool = False
    list_sep: str | None = None


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
    EnvVar("LEGO_AGENT_NODE_TARBALL", "agent.node_tarball", "Host-side Node 22 tarball.",
           ("VIME_AGENT_NODE_TARBALL",)),
    EnvVar("LEGO_AGENT_CC_TARBALL", "agent.cc_tarball", "Claude Code npm tarball.", ("VIME_AGENT_CC_TARBALL",)),
    EnvVar("LEGO_AGENT_CC_NATIVE_TARBALL", "agent.cc_native_tarball", "Claude Code platform archive.",
           ("VIME_AGENT_CC_NATIVE_TARBALL",)),
    EnvVar("LEGO_AGENT_CC_EXTRA_ARGS", "agent.cc_extra_args", "Claude CLI flags.", ("VIME_AGENT_CC_EXTRA_ARGS",)),
    EnvVar("LEGO_AGENT_CC_EXTRA_ENVS", "agent.cc_extra_envs", "JSON overrides of the Claude CLI environment.",
           ("VIME_AGENT_CC_EXTRA_ENVS",), json=True),
    EnvVar("LEGO_AGENT_CODEX_TARBALL", "agent.codex_tarball", "Codex npm tarball.", ("VIME_AGENT_CODEX_TARBALL",)),
    EnvVar("LEGO_AGENT_CODEX_NATIVE_TARBALL", "agent.codex_native_tarball", "Codex platform archive.",
           ("VIME_AGENT_CODEX_NATIVE_TARBALL",)),
    EnvVar("LEGO_AGENT_CODEX_EXTRA_ARGS", "agent.codex_extra_args", "Extra Codex CLI settings.",
           ("VIME_AGENT_CODEX_EXTRA_ARGS",)),
    EnvVar("LEGO_AGENT_CODEX_EXTRA_ENVS", "agent.codex_extra_envs", "JSON overrides of the Codex environment.",
           ("VIME_AGENT_CODEX_EXTRA_ENVS",), json=True),
    EnvVar("LEGO_AGENT_OPENCODE_TARBALL", "agent.opencode_tarball", "OpenCode npm tarball.",
           ("VIME_AGENT_OPENCODE_TARBALL",)),
    EnvVar("LEGO_AGENT_OPENCODE_EXTRA_ARGS", "agent.opencode_extra_args", "Extra OpenCode flags.",
           ("VIME_AGENT_OPENCODE_EXTRA_ARGS",)),
    EnvVar("LEGO_AGENT_OPENCODE_EXTRA_ENVS", "agent.opencode_extra_envs", "JSON overrides of the OpenCode env.",
           ("VIME_AGENT_OPENCODE_EXTRA_ENVS",), json=True),
    EnvVar("LEGO_AGENT_OPENHANDS_EXTRA_ENVS", "agent.openhands_extra_envs", "JSON overrides of the OpenHands env.",
           ("VIME_AGENT_OPENHANDS_EXTRA_ENVS",), json=True),
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

_BY_KEY: dict[str, EnvVar] = {v.key: v for v in ENV_VARS}


def generic_name(section: str, field: str) -> str:
    return f"LEGO_{section.upper()}_{field.upper()}"


def _is_json_field(section: str, field: str) -> bool:
    annotation = str(SECTIONS[section].model_fields[field].annotation)
    return annotation.startswith("dict")


def _is_list_field(section: str, field: str) -> bool:
    return str(SECTIONS[section].model_fields[field].annotation).startswith("list")


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
    if raw == "" and str(SECTIONS[section].model_fields[field].annotation).endswith("None"):
        return None
    return raw


def read_env(environ: Mapping[str, str]) -> dict[tuple[str, str], tuple[str, Any]]:
    """All config values present in ``environ``: ``{(section, field): (variable name, value)}``.

    When a key is set by several variables, the reference/LEGO name wins over its VIME alias, and the
    generic ``LEGO_<SECTION>_<KEY>`` form wins over both (it is the most specific, our own spelling).
    """
    found: dict[tuple[str, str], tuple[str, Any]] = {}
    for var in ENV_VARS:
        section, field = var.key.split(".")
        for name in (*var.aliases, var.name):  # later names win
            if name in environ:
                found[(section, field)] = (name, parse_env_value(name, environ[name], section, field))
    for section, model in SECTIONS.items():
        for field in model.model_fields:
            name = generic_name(section, field)
            if name in environ and name not in {v.name for v in ENV_VARS}:
                found[(section, field)] = (name, parse_env_value(name, environ[name], section, field))
    return found
