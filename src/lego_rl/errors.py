"""The lego-rl error model.

Errors are split by the boundary they cross, so that each edge maps them once:

* ``ConfigError``: the operator's configuration or input files are wrong. The CLI prints one line
  (where, what was expected, what to change) and exits with code 2. Never a traceback.
* ``ProviderError``: a serving engine answered badly or not at all. Carries an HTTP-like
  ``status_code`` so the adapter can translate it into the client's protocol error shape.
* ``ProtocolError``: a client request to the adapter is malformed or unsupported (400-class).
* ``SandboxError``: creating, using or destroying a sandbox failed (infrastructure).
* ``HarnessError``: installing or launching a coding CLI failed (infrastructure).
* ``GraderError``: the grader could not reach a verdict (infrastructure, not a reward of 0). Carries
  the ``output`` of the grader steps that ran.
* ``TaskDataError``: a task row or dataset file is malformed; names the row and the reason.
* ``TrajectoryError``: saved turn records cannot become training samples (inconsistent ids/logprobs,
  missing requested metadata). The rollout maps it to an infrastructure failure (``adapter_error``).

Everything raises internally; the CLI, the adapter's HTTP edge and the rollout's termination
taxonomy each translate these once.
"""

from __future__ import annotations

from typing import Any


class LegoError(Exception):
    """Base of every error lego-rl raises on purpose."""


class ConfigError(LegoError):
    """A configuration value or file is invalid.

    ``where`` names the source (``lego.toml:12``, ``$SWE_EVAL_TIMEOUT_SEC``, ``--set ...``),
    ``parameter`` the config key, ``value`` the offending value.
    """

    def __init__(
        self,
        message: str,
        *,
        where: str | None = None,
        parameter: str | None = None,
        value: Any = None,
    ) -> None:
        self.where = where
        self.parameter = parameter
        self.value = value
        super().__init__(message)

    def __str__(self) -> str:
        msg = super().__str__()
        return f"{self.where}: {msg}" if self.where else msg


class RunDirLocked(ConfigError):
    """Another live process holds the run directory's lock (``runstore.lock``): nothing was started. The
    message names the holder (pid, host, since when); ``lego train`` exits with its own code for it."""


class TaskDataError(LegoError):
    """A task row or dataset file cannot be used; ``row`` is 1-based when known."""

    def __init__(self, message: str, *, source: str | None = None, row: int | None = None) -> None:
        self.source = source
        self.row = row
        super().__init__(message)

    def __str__(self) -> str:
        msg = super().__str__()
        loc = self.source or ""
        if self.row is not None:
            loc = f"{loc} row {self.row}" if loc else f"row {self.row}"
        return f"{loc}: {msg}" if loc else msg


class ProviderError(LegoError):
    """The serving engine failed or returned something we refuse to train on."""

    def __init__(self, message: str, *, status_code: int = 502) -> None:
        self.status_code = status_code
        super().__init__(message)


class ProtocolError(LegoError):
    """A client request is malformed or asks for something unsupported.

    ``status`` is the HTTP status to answer with, ``param`` the offending field when known,
    ``kind`` a short machine-readable error type (``invalid_request_error``, ...).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        self.status = status
        self.param = param
        self.kind = kind
        super().__init__(message)


class SandboxError(LegoError):
    """A sandbox could not be created, used or destroyed."""


class SandboxTimeout(SandboxError):
    """A command inside a sandbox exceeded its timeout."""


class SandboxLost(SandboxError):
    """The sandbox died under a running command (its own process was killed from outside).

    ``stdout`` and ``stderr`` are what the command wrote before that (a CLI's event log), kept for the
    rollout's artifacts.
    """

    def __init__(self, message: str, *, stdout: str = "", stderr: str = "") -> None:
        self.stdout = stdout
        self.stderr = stderr
        super().__init__(message)


class SandboxLimitExceeded(SandboxError):
    """The sandbox was killed by its supervisor because its own processes went over a limit it was created
    with (``limit``: the runtime's reason, ``memory_limit_exceeded`` or ``process_limit_exceeded``).

    Unlike ``SandboxLost`` this is no outage: what ran inside caused it, and a policy's tool call can (a
    memory hog), so the rollout judges it like a death of the CLI, by when it happened.
    """

    def __init__(self, message: str, *, limit: str) -> None:
        self.limit = limit
        super().__init__(message)


class HarnessError(LegoError):
    """A coding CLI could not be installed or started."""


class GraderError(LegoError):
    """The grader could not produce a verdict (infrastructure failure, not reward 0).

    ``output`` is the log of every grader step that ran before the failure (as ``GradeResult.output``
    is for a verdict), kept for the rollout's artifacts; empty when the failure came before any step.
    """

    def __init__(self, message: str, *, output: str = "") -> None:
        self.output = output
        super().__init__(message)


class TrainerOutOfMemory(LegoError):
    """The trainer ran out of accelerator memory on one micro-batch; the step was not applied. The message
    names the micro-batch's size, its longest segment and the settings that make it fit."""


class TrajectoryError(LegoError):
    """Turn records cannot be turned into training samples; names the session, turn and field."""

    def __init__(self, message: str, *, session_id: str | None = None, turn: int | None = None) -> None:
        self.session_id = session_id
        self.turn = turn
        super().__init__(message)

    def __str__(self) -> str:
        msg = super().__str__()
        where = []
        if self.session_id is not None:
            where.append(f"session {self.session_id}")
        if self.turn is not None:
            where.append(f"turn {self.turn}")
        return f"{', '.join(where)}: {msg}" if where else msg
