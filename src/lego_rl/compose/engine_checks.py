"""Checks of the installed engine that the config names, run with ``config.checks`` by the commands that
validate a config (``lego validate``, ``lego train``, ``lego rollout``). Config knows no engine (its import
contract), so these live above it and are handed down: ``run_checks(r, harnesses=..., extra=ENGINE_CHECKS)``.
"""

from __future__ import annotations

from collections.abc import Iterator

from lego_rl.config.checks import Check, Finding, error
from lego_rl.config.resolve import ResolvedConfig
from lego_rl.errors import ConfigError
from lego_rl.serving.vllm_launch import require_routed_experts, vllm_install, vllm_python


def routing_replay_vllm(r: ResolvedConfig) -> Iterator[Finding]:
    """R3 with vLLM: the vLLM lego launches (``serving.vllm_launch``: ``$LEGO_VLLM_PYTHON`` or .venv-vllm)
    must know ``--enable-return-routed-experts``. Without that interpreter the servers are elsewhere; their
    replies are checked one by one (a reply without routes is refused as ``UnsupportedExtra``)."""
    if not (r.config.rollout.use_rollout_routing_replay and r.config.serving.backend == "vllm"):
        return
    python = vllm_python()
    if not python.exists():
        return
    try:
        install = vllm_install(python)
    except ConfigError as exc:
        yield error("r3_vllm", str(exc), "fix the vLLM environment (scripts/setup_vllm.sh) or set LEGO_VLLM_PYTHON",
                    "rollout.use_rollout_routing_replay")
        return
    try:
        require_routed_experts(install)
    except ConfigError as exc:
        yield error("r3_vllm_flag", str(exc), "install a vLLM that has the flag in that environment, or turn R3 "
                    "off (rollout.use_rollout_routing_replay = false)", "rollout.use_rollout_routing_replay")


ENGINE_CHECKS: list[Check] = [routing_replay_vllm]
