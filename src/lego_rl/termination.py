"""The closed termination taxonomy: every rollout ends with exactly one of these reasons.

Two families, and the difference matters for training:

* **Policy outcomes** (``completed``, ``agent_error_exit``, ``turn_limit``, ``context_limit``,
  ``time_budget``): the agent itself ended the episode, ran out of turns, context or wall-clock
  budget. These are consequences of the policy's behaviour, so the rollout keeps its verifier reward
  (usually 0 for an unfinished task) and enters the GRPO statistics like any other run.
* **Infrastructure failures** (``sandbox_setup``, ``sandbox_lost``, ``harness_install``, ``adapter_error``,
  ``engine_error``, ``grader_error``, ``guard_timeout``, ``weight_sync_interrupted``,
  ``internal_error``): something outside the policy broke. A reward of 0 here would punish the policy for our outage, so by default
  these rollouts are excluded from advantages and loss, and counted (see
  ``lego_rl.train.advantages.AdmissionPolicy``, which the operator can change).

``weight_sync_interrupted`` means a weight update interrupted generation and the resumed prefix was not
token-exact; an exact resume is not a termination at all.
"""

from __future__ import annotations

from enum import StrEnum

from lego_rl.errors import (
    GraderError,
    HarnessError,
    ProtocolError,
    ProviderError,
    SandboxError,
    TrajectoryError,
)


class TerminationReason(StrEnum):
    """Why a rollout ended. The string values are what run logs and samples store."""

    COMPLETED = "completed"
    """The CLI exited normally after finishing its work."""
    AGENT_ERROR_EXIT = "agent_error_exit"
    """The CLI gave up or exited non-zero for reasons of its own (not an infrastructure fault)."""
    TURN_LIMIT = "turn_limit"
    """The CLI hit its configured maximum number of turns."""
    CONTEXT_LIMIT = "context_limit"
    """The conversation no longer fits the model's context window."""
    TIME_BUDGET = "time_budget"
    """The agent's wall-clock budget ran out."""

    SANDBOX_SETUP = "sandbox_setup"
    """The agent sandbox could not be created or its workspace prepared."""
    SANDBOX_LOST = "sandbox_lost"
    """The agent sandbox died or stopped answering after setup (mid-run, or at patch capture)."""
    HARNESS_INSTALL = "harness_install"
    ADAPTER_ERROR = "adapter_error"
    ENGINE_ERROR = "engine_error"
    GRADER_ERROR = "grader_error"
    GUARD_TIMEOUT = "guard_timeout"
    """The whole-rollout guard (sandbox setup + agent + grading) expired."""
    WEIGHT_SYNC_INTERRUPTED = "weight_sync_interrupted"
    INTERNAL_ERROR = "internal_error"
    """A bug in lego itself (an exception outside our error model); the traceback is in the run log.
    Excluded like an infrastructure failure: the policy did nothing to earn it."""


POLICY_OUTCOMES: frozenset[TerminationReason] = frozenset(
    {
        TerminationReason.COMPLETED,
        TerminationReason.AGENT_ERROR_EXIT,
        TerminationReason.TURN_LIMIT,
        TerminationReason.CONTEXT_LIMIT,
        TerminationReason.TIME_BUDGET,
    }
)
INFRASTRUCTURE_FAILURES: frozenset[TerminationReason] = frozenset(TerminationReason) - POLICY_OUTCOMES


def parse_termination(value: str | TerminationReason) -> TerminationReason:
    """Parse a stored reason; an unknown string is an error that lists the valid ones."""
    if isinstance(value, TerminationReason):
        return value
    try:
        return TerminationReason(value)
    except ValueError:
        valid = ", ".join(r.value for r in TerminationReason)
        raise ValueError(f"unknown termination reason {value!r}; expected one of: {valid}") from None


def is_infrastructure_failure(reason: str | TerminationReason) -> bool:
    """True when ``reason`` is an infrastructure failure (excluded by the default admission policy)."""
    return parse_termination(reason) in INFRASTRUCTURE_FAILURES


def is_policy_outcome(reason: str | TerminationReason) -> bool:
    """True when ``reason`` is a policy outcome, which keeps its verifier reward."""
    return parse_termination(reason) in POLICY_OUTCOMES


# Default translation of the error model into reasons. Order matters: subclasses first.
_ERROR_REASONS: tuple[tuple[type[BaseException], TerminationReason], ...] = (
    (GraderError, TerminationReason.GRADER_ERROR),
    (HarnessError, TerminationReason.HARNESS_INSTALL),
    (SandboxError, TerminationReason.SANDBOX_SETUP),
    (ProviderError, TerminationReason.ENGINE_ERROR),
    (TrajectoryError, TerminationReason.ADAPTER_ERROR),
    (ProtocolError, TerminationReason.ADAPTER_ERROR),
)


def reason_for_error(exc: BaseException) -> TerminationReason | None:
    """The default infrastructure reason for an exception of our error model, or None if unknown.

    A caller that knows the stage better (a ``SandboxError`` while grading, say) overrides this.
    """
    for cls, reason in _ERROR_REASONS:
        if isinstance(exc, cls):
            return reason
    return None
