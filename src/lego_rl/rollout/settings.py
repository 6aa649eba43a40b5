"""What a rollout needs to know, typed: built once from the resolved config at the edge
(``compose.rollout_check.settings_from_config``), never by rollout code reading the config itself.

No field has a default of its own: each value comes from the config, whose schema holds the one default
(a second default here once disagreed with it: ``bwrap`` against the config's ``sunabako``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from lego_rl.swe.task_sandbox import SandboxTarget
from lego_rl.trajectory.manager import TrajectoryOptions


@dataclass(frozen=True)
class RolloutSettings:
    agent_sandbox: SandboxTarget
    """Where the agent's sandbox is created."""
    grader_sandbox: SandboxTarget
    """Where the grader's fresh sandbox is created (another provider is allowed: its own options)."""
    default_harness: str
    """Harness of a row without ``metadata.agent``."""
    agent_time_budget_s: float
    grader_timeout_s: float
    guard_s: float
    """Whole-rollout deadline (sandbox setup + agent + grading)."""
    max_turns: int
    max_context_tokens: int
    max_response_tokens: int
    max_requests_per_session: int
    """Model calls one adapter session serves; a harness's adapter options may lower it, never raise it."""
    prompt_template: str
    """The task prompt, with ``{problem}``, ``{workdir}`` and ``{problem_file}`` filled in per row."""
    model_name: str
    boot_concurrency: int
    """Agent sandboxes being created at once (creation is the memory- and I/O-heavy part)."""
    suspect_policy: Literal["zero", "keep"]
    """``grader.suspect_policy``: what a patch labelled ``suspect_patch`` scores."""
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Chat-template keyword arguments for every turn of every session."""
    trajectory: TrajectoryOptions = field(default_factory=TrajectoryOptions)
    """How turn records become samples (its defaults are the trajectory package's own)."""
    agent_user: str = "agent"
    """The unprivileged user the CLI runs as (no config key: the workspace is prepared for it)."""
