"""Hook specifications of a lego harness plugin (pluggy project ``lego_rl``).

Every hook but ``lego_harness_describe`` takes the harness ``name`` first and is ``firstresult``:
lego calls it on all plugins and the one that owns ``name`` answers, every other returns None.
Hooks that do I/O inside a sandbox return an *awaitable*; lego awaits it. Specs only ever gain
arguments (pluggy's opt-in arguments), so a plugin written today keeps working.

``docs/plugin_hooks.md`` documents each hook; a test keeps it in step with these signatures.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any

import pluggy
from pydantic import BaseModel

from lego_rl.harness.models import CommandSpec, Harness, HarnessOutcome, RunRequest, ToolchainPin

if TYPE_CHECKING:
    from lego_rl.harness.toolchain import Toolchain
    from lego_rl.sandbox.base import Sandbox

PROJECT = "lego_rl"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def lego_harness_describe() -> Harness:
    """Describe the harness this plugin provides.

    Called on every plugin; all results are collected (not firstresult).

    :returns: the harness's name, pinned CLI version, adapter protocol and defaults.

    Use in harness plugins:
        Return one ``Harness``. Its ``name`` is what task rows put in ``metadata.agent`` and
        what every other hook receives as ``harness``.
    """


@hookspec(firstresult=True)
def lego_harness_options(harness: str, overrides: Mapping[str, Any], environ: Mapping[str, str]) -> BaseModel:
    """Build the harness's validated options from config values and the environment.

    firstresult: the owning plugin answers; others return None.

    :param harness: harness name.
    :param overrides: the ``[harness.<name>]`` table of lego's config, resolved (lego.toml < mapped
        variables < ``--set``) and parsed from TOML; empty when the operator set nothing.
    :param environ: the process environment, for ``LEGO_AGENT_*`` (and old ``VIME_AGENT_*``) variables.
    :returns: the plugin's own pydantic config model instance.

    Use in harness plugins:
        Validate strictly with your own model: raise ``lego_rl.errors.ConfigError`` with
        ``parameter="harness.<name>.<key>"`` on bad input (a malformed ``*_EXTRA_ENVS`` JSON, an
        unknown key), or let the model's ``ValidationError`` escape (lego names the key). Config
        values win over the environment. ``HarnessPlugin`` does all of this.
    """


@hookspec(firstresult=True)
def lego_harness_toolchain(harness: str, options: BaseModel) -> list[ToolchainPin]:
    """List the host-side artifacts (npm tarballs, wheels) the install needs.

    firstresult: the owning plugin answers; others return None.

    :param harness: harness name.
    :param options: the model returned by ``lego_harness_options``.
    :returns: pins; ``lego toolchain fetch`` downloads and integrity-checks exactly these.

    Use in harness plugins:
        Pin exact versions and, for your default versions, the registry's ``dist.integrity``
        so install refuses anything else. List only what the selected install path needs.
    """


@hookspec(firstresult=True)
def lego_harness_adapter_options(harness: str, options: BaseModel) -> dict[str, Any]:
    """Declare adapter-side settings this CLI needs for a session.

    firstresult: the owning plugin answers; others return None.

    :param harness: harness name.
    :param options: the harness options.
    :returns: a dict such as ``{"protocol": "chat", "force_stream": True, "max_requests": 400}``.

    Use in harness plugins:
        Report quirks the adapter must absorb: a CLI that loops on JSON replies needs
        ``force_stream``; one without its own turn limit needs ``max_requests``.
    """


@hookspec(firstresult=True)
def lego_harness_install(
    harness: str, sandbox: Sandbox, toolchain: Toolchain, options: BaseModel
) -> Awaitable[str]:
    """Install the CLI into a running sandbox, offline, from host-side artifacts.

    firstresult: the owning plugin answers; others return None.

    :param harness: harness name.
    :param sandbox: the agent sandbox (install commands run as root).
    :param toolchain: resolves pins to verified host files (refuses a hash mismatch).
    :param options: the harness options.
    :returns: an awaitable giving the absolute path of the installed executable in the sandbox.

    Use in harness plugins:
        Use ``lego_rl.harness.install.install_archive``: it checks the hash, then mounts the host's
        shared read-only tree or uploads and extracts. Never write into an installed tree (it may be
        read-only); never reach the network from the sandbox. Raise ``HarnessError`` on failure.
    """


@hookspec(firstresult=True)
def lego_harness_verify(harness: str, sandbox: Sandbox, options: BaseModel, user: str) -> Awaitable[str]:
    """Prove the installed CLI starts: run its ``--version`` inside the sandbox.

    firstresult: the owning plugin answers; others return None.

    :param harness: harness name.
    :param sandbox: a sandbox where ``lego_harness_install`` already ran.
    :param options: the harness options.
    :param user: sandbox user to run it as (the agent user).
    :returns: an awaitable giving the version line the CLI printed.

    Use in harness plugins:
        Raise ``HarnessError`` if it does not start or reports another version than pinned.
    """


@hookspec(firstresult=True)
def lego_harness_command(harness: str, request: RunRequest, options: BaseModel) -> CommandSpec:
    """Build the exact non-interactive command line, environment and config files.

    firstresult: the owning plugin answers; others return None.

    :param harness: harness name.
    :param request: session URL and key, prompt, workdir, limits.
    :param options: the harness options (extra args / env overrides included).
    :returns: the command to run; pure data, no I/O.

    Use in harness plugins:
        Point the CLI at ``request.base_url`` with ``request.session_id`` as its key, turn off
        every call that would leave the sandbox (telemetry, updates, web search, model lists),
        and apply the operator's ``*_EXTRA_ARGS`` / ``*_EXTRA_ENVS`` last.
    """


@hookspec(firstresult=True)
def lego_harness_run(
    harness: str, sandbox: Sandbox, request: RunRequest, options: BaseModel
) -> Awaitable[HarnessOutcome]:
    """Run the CLI once inside the sandbox within ``request.time_budget_s``.

    firstresult: the owning plugin answers; a built-in default (registered last) runs
    ``lego_harness_command`` and classifies the result for any harness that does not.

    :param harness: harness name.
    :param sandbox: a sandbox where the CLI is installed and the workspace prepared.
    :param request: the rollout's run request.
    :param options: the harness options.
    :returns: an awaitable giving the run's outcome; it never raises for a policy outcome.

    Use in harness plugins:
        Usually do not implement it: implement ``lego_harness_command`` and
        ``lego_harness_classify`` and let the default run it.
    """


@hookspec(firstresult=True)
def lego_harness_classify(harness: str, outcome: HarnessOutcome, request: RunRequest) -> HarnessOutcome:
    """Refine a finished run's outcome from the CLI's own event log.

    firstresult: the owning plugin answers; the built-in default returns the outcome unchanged.

    :param harness: harness name.
    :param outcome: exit status, event log and timing as the sandbox reported them.
    :param request: the run request (for its limits).
    :returns: the outcome with ``hit_turn_limit`` / ``crashed`` / ``detail`` set.

    Use in harness plugins:
        Parse your CLI's final event (e.g. a ``result`` event with subtype ``error_max_turns``)
        and return ``outcome.model_copy(update=...)``.
    """


@hookspec
def lego_harness_artifacts(
    harness: str, sandbox: Sandbox, request: RunRequest
) -> Awaitable[dict[str, bytes]]:
    """Collect extra files worth saving after a run (CLI session transcripts, config used).

    Called on every plugin; all results are merged (not firstresult). Return None for other harnesses.

    :param harness: harness name.
    :param sandbox: the sandbox after the run (still alive).
    :param request: the run request.
    :returns: an awaitable giving artifact name -> content; lego saves them before cleanup.

    Use in harness plugins:
        Read only small, bounded files; a missing file is not an error.
    """
