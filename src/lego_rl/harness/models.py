"""Typed records that flow between lego and its harness plugins.

A plugin *describes* itself with ``Harness``, asks for host-side artifacts with ``ToolchainPin``,
receives one ``RunRequest`` per rollout, turns it into a ``CommandSpec`` and reports a
``HarnessOutcome``. Only these models cross the plugin boundary, so a third-party harness never
imports lego's internals.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

AdapterProtocol = Literal["anthropic", "responses", "chat"]
"""The adapter front end a CLI talks to: Anthropic Messages, OpenAI Responses, Chat Completions."""

_NAME = r"^[a-z][a-z0-9_]{0,39}$"


class Harness(BaseModel):
    """What ``lego harnesses`` lists: one installable coding CLI."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=_NAME)
    """Registry name, used by ``metadata.agent`` in task rows (``claude_code``, ``codex``, ...)."""
    version: str = Field(min_length=1)
    """Pinned version of the CLI it installs (the npm / PyPI version, not the plugin's)."""
    protocol: AdapterProtocol
    """Adapter front end the CLI speaks."""
    cli_package: str = Field(min_length=1)
    """Registry package of the CLI (``@openai/codex``, ``openhands-sdk``)."""
    summary: str = ""
    """One line for tables."""
    defaults: dict[str, Any] = Field(default_factory=dict)
    """The harness's config model dumped with its defaults (turn limit, extra args, ...)."""
    capabilities: dict[str, bool] = Field(default_factory=dict)
    """Capability flags, e.g. ``enforces_turn_limit``: whether the CLI itself stops at the turn limit."""


class ToolchainPin(BaseModel):
    """One host-side artifact a harness installs from: an npm tarball, a PyPI wheel set, or a runtime."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: str = Field(pattern=r"^[a-z][a-z0-9_-]*$")
    """Why the harness needs it (``node``, ``cli``, ``native``, ``plugin``, ``wheels``)."""
    kind: Literal["npm", "pypi", "runtime"]
    """``runtime``: an interpreter tree built on the host (name ``python``, version the minor version,
    ``with_dependencies``), mounted so a harness runs on any image (``harness.pyruntime_build``)."""
    name: str
    """Registry package name; for ``pypi`` the top-level requirement."""
    version: str
    integrity: str | None = None
    """Expected ``sha512-<base64>`` (npm ``dist.integrity``); None: take it from the lockfile."""
    with_dependencies: bool = False
    """npm: also fetch the package's dependency tree (packed as one tree tarball).
    pypi: resolve and download every wheel the requirement needs."""
    python_version: str | None = None
    """pypi: target interpreter (``3.12``) for wheel resolution."""
    companions: tuple[str, ...] = ()
    """pypi: further exact requirements installed into the same tree (``openhands-tools==1.58.2``)."""

    @property
    def key(self) -> str:
        return lock_key(self.kind, self.name, self.version, self.python_version)


def lock_key(kind: str, name: str, version: str, python_version: str | None = None) -> str:
    """``npm:name@version``; a PyPI site tree also names its Python (``pypi:name@version+py3.13``): its
    binary wheels load on that minor version only, so trees for two Pythons are two artifacts."""
    key = f"{kind}:{name}@{version}"
    return f"{key}+py{python_version}" if python_version else key


class RunRequest(BaseModel):
    """Everything a harness needs to run one rollout's CLI inside an already-prepared sandbox."""

    model_config = ConfigDict(extra="forbid")

    session_id: str = Field(min_length=1)
    """Adapter session id; the CLI sends it as its API key / bearer token."""
    base_url: str = Field(pattern=r"^https?://")
    """Adapter root as reachable from inside the sandbox, without ``/v1`` (``http://127.0.0.1:18091``)."""
    model: str = Field(min_length=1)
    """Model name the CLI is told to use (the adapter serves whatever it is configured with)."""
    prompt: str = Field(min_length=1)
    workdir: str = Field(pattern=r"^/")
    """Repository directory inside the sandbox; the CLI runs there."""
    time_budget_s: float = Field(gt=0)
    """Wall-clock budget of the CLI process; past it the run ends as timed out."""
    max_turns: int = Field(default=40, ge=1)
    max_context_tokens: int = Field(default=65536, ge=1024)
    max_response_tokens: int = Field(default=8192, ge=1)
    user: str = "agent"
    """Sandbox user the CLI runs as."""
    artifacts_dir: Path | None = None
    """Host folder where the event log is saved (never overwritten); None keeps it in memory only."""


class CommandSpec(BaseModel):
    """The exact non-interactive command a harness runs (pure data: testable without a sandbox)."""

    model_config = ConfigDict(extra="forbid")

    argv: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str
    user: str
    files: dict[str, str] = Field(default_factory=dict)
    """Config files to write before launch: sandbox path -> text (owned by ``user``)."""
    path_prepend: list[str] = Field(default_factory=list)
    """Folders put in front of the image's own ``PATH`` (which the harness cannot know)."""
    prelude: str = ""
    """Shell run as ``user`` right before the CLI (e.g. copy a pre-installed tree into $HOME)."""


TerminationKind = Literal["completed", "agent_error", "turn_limit", "timed_out", "adapter_error", "crashed"]


class HarnessOutcome(BaseModel):
    """How one CLI run ended, as the harness saw it (the rollout maps it to a termination reason)."""

    harness: str
    exit_code: int | None
    """Process exit status; None when it was killed at the time budget."""
    duration_s: float = Field(ge=0)
    event_log: str = ""
    """The CLI's machine-readable event stream (stdout: stream-json / JSONL)."""
    event_log_path: Path | None = None
    """Host copy of ``event_log`` when the request named an artifacts folder."""
    stderr_tail: str = ""
    hit_turn_limit: bool = False
    timed_out: bool = False
    crashed: bool = False
    """The CLI died abnormally (signal, missing binary, no event at all). A fact, not a verdict: the rollout
    calls it infrastructure only when no policy answer had reached the CLI yet (``lego_rl.termination``)."""
    adapter_error: bool = False
    """The CLI ended because the adapter was unreachable or answered with an error: infrastructure."""
    detail: str = ""
    """Why the flags above were set, in words."""

    @property
    def kind(self) -> TerminationKind:
        """Single classification, most severe first."""
        if self.crashed:
            return "crashed"
        if self.adapter_error:
            return "adapter_error"
        if self.timed_out:
            return "timed_out"
        if self.hit_turn_limit:
            return "turn_limit"
        return "completed" if self.exit_code == 0 else "agent_error"
