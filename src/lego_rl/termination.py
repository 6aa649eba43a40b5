"""The closed termination taxonomy: every rollout ends with exactly one of these reasons.

Two families, and the difference matters for training:

* **Policy outcomes** (``completed``, ``agent_error_exit``, ``turn_limit``, ``context_limit``,
  ``time_budget``, ``tampered``, ``grading_blocked``, ``suspect_patch``): the agent itself ended the
  episode, ran out of turns, context or wall-clock budget, or its patch attacked the grading. These are
  consequences of the policy's behaviour, so the rollout keeps its verifier reward (usually 0 for an
  unfinished task, always 0 for ``tampered`` and ``grading_blocked``, 0 for ``suspect_patch`` unless
  ``grader.suspect_policy = "keep"``) and enters the GRPO statistics like any other run.
* **Infrastructure failures** (everything else): something outside the policy broke. A reward of 0 here
  would punish the policy for our outage, so by default these rollouts are excluded from advantages and
  loss, and counted (see ``lego_rl.train.advantages.AdmissionPolicy``, which the operator can change).

The rule that keeps the split honest: **an infrastructure label is only given to a failure the policy
cannot cause.** Exclusion is an escape from the penalty: a policy that could turn a bad episode into an
infrastructure failure (kill its own CLI, say) would learn to. So a label is decided from what happened and
when, not from how abnormal it looks:

======================= ====== ==============================================================================
label                   family given when (and why the policy can or cannot cause it)
======================= ====== ==============================================================================
completed               policy the CLI exited 0
agent_error_exit        policy the CLI exited non-zero or died (any signal, any status) *after the policy's
                               first answer reached it*, and the sandbox still answers: from then on the
                               policy's tool calls run as the agent user and can kill the CLI
                               (``kill -9 $PPID``, ``kill -9 -1``), so every such death is the policy's.
                               Graded as usual. Also: the workspace it left defeats the patch capture while
                               the sandbox answers (``git init`` of an empty repository in it), or its
                               processes ran the sandbox over its own memory/process limit and the
                               runtime killed it (``SandboxLimitExceeded``): graded as no change.
turn_limit              policy the CLI or the adapter's request cap stopped the turns
context_limit           policy the conversation no longer fits the context window
time_budget             policy the CLI was killed at its wall-clock budget (hanging tools are the policy's)
tampered                policy reward 0: the graded test run shows evidence that the code under test rewrote
                               results or the runner (a changed assertion method, hook caller, plugin set,
                               test function, interpreter path or import finder; a report that says passed
                               where the test raised; a forged, repeated or dropped record on the grader's
                               channel; a canary that must fail passed). Only code the patch brought runs
                               there, so the evidence is the policy's, whatever the CLI's own outcome
grading_blocked         policy reward 0: the patch made grading impossible: the official test patch or
                               the reset of the test infrastructure fails on the agent's tree but not on
                               the base commit, or the test run's records or files overflow, vanish or
                               are cut (the supervisor killed, a multi-GB report). Never an infrastructure
                               label: an exclusion would reward the sabotage with an escape from its 0
suspect_patch           policy the code the patch added is built to fool comparisons (an ``__eq__`` that returns a
                               constant or ignores its argument, a redefined ``assert*`` helper, patched
                               ``unittest``/``pytest``/``builtins``, ``mock.ANY``; ``swe/suspect.py``), with
                               file, line and what in the grader log. Reward 0 under
                               ``grader.suspect_policy = "zero"`` (default), the verdict's under ``"keep"``
sandbox_setup           infra  the sandbox could not be created or its workspace prepared: before the CLI ran
sandbox_lost            infra  the sandbox stopped answering: its own processes were killed from outside
                               (bwrap killed by a signal; the agent runs in PID and user namespaces below
                               it and cannot signal them), or a fresh command fails after the CLI died
harness_install         infra  the CLI could not be installed, verified or started: it failed before the
                               policy's first answer reached it (nothing the policy wrote had run yet)
adapter_error           infra  the CLI never got a request through to the adapter; turn records that cannot
                               become samples
engine_error            infra  the adapter session failed on the engine side (unreachable, invalid reply)
grader_error            infra  the grader could not produce a verdict from a failure of our own stack: its
                               sandbox, its supervisor's bug, the official tests failing on the base commit,
                               an unusable baseline (a patch that fails or blocks grading is reward 0)
guard_timeout           infra  the whole-rollout guard expired (the agent stage is bounded by its own
                               budget, so this is setup, install, capture or grading far slower than set)
weight_sync_interrupted infra  a weight update interrupted generation and the resumed prefix was not
                               token-exact (an exact resume is not a termination at all)
interrupted             infra  the run was stopped (SIGTERM, Ctrl-C) while the rollout was in flight
internal_error          infra  a bug in lego itself; the traceback is in the run log
======================= ====== ==============================================================================
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
    """The CLI gave up, exited non-zero or died after the policy's first answer reached it (not an
    infrastructure fault: the policy's tool calls can end the CLI)."""
    TURN_LIMIT = "turn_limit"
    """The CLI hit its configured maximum number of turns."""
    CONTEXT_LIMIT = "context_limit"
    """The conversation no longer fits the model's context window."""
    TIME_BUDGET = "time_budget"
    """The agent's wall-clock budget ran out."""
    TAMPERED = "tampered"
    """The grader found evidence that the test run rewrote results or the runner; reward 0."""
    GRADING_BLOCKED = "grading_blocked"
    """The patch made grading impossible (official tests do not apply after it, oversized or destroyed
    records); reward 0, never an infrastructure exclusion."""
    SUSPECT_PATCH = "suspect_patch"
    """The patch's added code is built to fool comparisons (``swe/suspect.py``); reward 0 unless
    ``grader.suspect_policy = "keep"``."""

    SANDBOX_SETUP = "sandbox_setup"
    """The agent sandbox could not be created or its workspace prepared."""
    SANDBOX_LOST = "sandbox_lost"
    """The agent sandbox died or stopped answering after setup (mid-run, or at patch capture)."""
    HARNESS_INSTALL = "harness_install"
    """The CLI could not be installed, verified or started: it failed before the policy's first answer
    reached it. A death after that answer is ``agent_error_exit`` (the policy's tool calls can kill it)."""
    ADAPTER_ERROR = "adapter_error"
    ENGINE_ERROR = "engine_error"
    GRADER_ERROR = "grader_error"
    GUARD_TIMEOUT = "guard_timeout"
    """The whole-rollout guard (sandbox setup + agent + grading) expired."""
    WEIGHT_SYNC_INTERRUPTED = "weight_sync_interrupted"
    INTERRUPTED = "interrupted"
    """The run was stopped (SIGTERM, Ctrl-C) while this rollout was in flight; its sandbox was cleaned up
    and what existed was saved."""
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
        TerminationReason.TAMPERED,
        TerminationReason.GRADING_BLOCKED,
        TerminationReason.SUSPECT_PATCH,
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
