"""Typed serving errors: every way an engine can fail us, each a ``ProviderError``.

The client raises these and never patches a reply. Reply-validation failures (``InvalidReply`` and its
subclasses) mean the engine answered 200 with something we refuse to train on; ``EngineRejected`` means
the engine answered 4xx (our request was wrong); ``EngineUnavailable`` means no replica answered within
the deadline. The adapter maps all of them to its protocol's error once, by ``status_code``.
"""

from __future__ import annotations

from typing import Any

from lego_rl.errors import ProviderError


class EngineUnavailable(ProviderError):
    """No replica could be reached (connection refused/reset, 5xx, timeout) before the deadline."""

    def __init__(self, message: str, *, url: str | None = None, attempts: int = 0) -> None:
        self.url = url
        self.attempts = attempts
        super().__init__(message, status_code=503)


class EngineRejected(ProviderError):
    """The engine answered with a 4xx: the request itself is wrong. Not retried.

    ``param`` is the offending field when the engine named it (vLLM's ``error.param``).
    """

    def __init__(self, message: str, *, status: int, param: str | None = None, body: Any = None) -> None:
        self.status = status
        self.param = param
        self.body = body
        super().__init__(message, status_code=status)


class EngineFailed(ProviderError):
    """The engine answered with a 5xx other than 502/503/504: it failed on this request. Not retried."""

    def __init__(self, message: str, *, status: int, body: Any = None) -> None:
        self.status = status
        self.body = body
        super().__init__(message, status_code=502)


class InvalidReply(ProviderError):
    """The engine answered 200 with a reply that fails validation (``request_id`` names the call)."""

    def __init__(self, message: str, *, request_id: str | None = None, url: str | None = None) -> None:
        self.request_id = request_id
        self.url = url
        where = f" (request {request_id} on {url})" if request_id or url else ""
        super().__init__(f"{message}{where}", status_code=502)


class EmptyChoice(InvalidReply):
    """The reply had no choice, or a choice without token ids."""


class MissingLogprobs(InvalidReply):
    """Logprobs were requested but the reply has none (or a position has none)."""


class LogprobCountMismatch(InvalidReply):
    """The number of logprobs differs from the number of output ids, or an entry names another id."""


class NonFiniteLogprob(InvalidReply):
    """A logprob is NaN, +inf or -inf (or positive: a log-probability cannot exceed 0)."""


class TokenOutOfVocab(InvalidReply):
    """An output id is negative or not below the vocabulary size."""


class UnsupportedExtra(InvalidReply):
    """An optional per-token extra (nucleus, routed experts) was requested but the engine gave none."""


class BadWeightVersion(InvalidReply):
    """Weight-version spans are missing, overlap, leave gaps, or carry a label that is not a version."""


class WeightUpdateRejected(ProviderError):
    """A weight update the engine cannot apply: a tensor it has no parameter for, a wrong shape, a parameter
    left unwritten, or an engine whose weights are damaged by an earlier failed update.
    ``parameter`` names the offending weight."""

    def __init__(self, message: str, *, parameter: str | None = None) -> None:
        self.parameter = parameter
        super().__init__(message, status_code=400)


class ListenFailed(OSError):
    """The embedded engine could not listen on its address (the port taken by another process, an address this
    host does not have). An ``OSError``, as the bind's own failure is; the caller that knows which setting
    named the port (``serving.port``, ``lego serve --port``) words the remedy."""

    def __init__(self, host: str, port: int, reason: str) -> None:
        self.host, self.port, self.reason = host, port, reason
        super().__init__(f"cannot listen on {host}:{port}: {reason}")
