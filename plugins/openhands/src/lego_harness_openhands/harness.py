"""The OpenHands SDK (``openhands-sdk`` + ``openhands-tools`` from PyPI) as a lego harness.

The SDK needs Python >= 3.12 *inside the sandbox*. By default (``runtime = "toolchain"``) that
interpreter comes with the toolchain: a relocatable Python ``python_version`` with its own loader and C
libraries (``lego_rl.harness.pyruntime_build``), mounted at ``/opt/lego/python/<X.Y>``, so OpenHands
runs on any task image, also Debian bookworm's (Python 3.11, glibc 2.36). ``runtime = "image"`` (or
setting ``python``) uses the image's own interpreter instead, which must be that minor version.
``lego toolchain fetch`` builds a site-packages tree for that Python version (``pip install --target``
run by an interpreter of that version, ``--python``) and the runtime from the same interpreter;
install mounts (bwrap) or uploads them to ``/opt/lego/...`` with a small runner script, so the sandbox
needs neither pip nor network. Binary wheels are built for one minor version: install refuses an image
interpreter of another.

The runner drives one ``Conversation`` with an ``LLM(model="openai/<m>")`` at the adapter's
Chat Completions front end, the session id as API key, ``max_iteration_per_run`` as the turn limit
and ``LITELLM_LOCAL_MODEL_COST_MAP=True`` so litellm makes no DNS look-ups.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from lego_rl.errors import HarnessError
from lego_rl.harness import CommandSpec, HarnessConfig, HarnessOutcome, HarnessPlugin, RunRequest, Toolchain
from lego_rl.harness.install import INSTALL_ROOT, install_archive, python_version, sh, version_of
from lego_rl.harness.models import ToolchainPin
from lego_rl.harness.toolchain import cached_integrity
from lego_rl.sandbox.base import Sandbox

SDK = "openhands-sdk"
TOOLS = "openhands-tools"
DEFAULT_VERSION = "1.58.2"
RUNNER = "lego_openhands_runner.py"
HOME = "/tmp/lego-openhands"
"""One fixed path in every (fresh) sandbox: nothing per-session in what the agent may show the model (see
the Claude Code plugin's HOME)."""
ADAPTER_ERRORS = {
    "LLMServiceUnavailableError", "LLMAuthenticationError", "LLMTimeoutError", "LLMRateLimitError",
    "LLMBadRequestError", "APIConnectionError",
}  # fmt: skip
"""SDK error codes that mean the adapter / engine failed, not the policy."""


class OpenHandsConfig(HarnessConfig):
    """``[harness.openhands]``; env: ``LEGO_AGENT_OPENHANDS_*`` (or ``VIME_AGENT_OPENHANDS_*``)."""

    version: str = DEFAULT_VERSION
    runtime: Literal["toolchain", "image"] = "toolchain"
    """``toolchain``: the toolchain's Python ``python_version`` (any image). ``image``: the image's ``python``.
    Setting ``python`` without ``runtime`` selects ``image``."""
    python: str = "python3.13"
    """Interpreter inside the sandbox image when ``runtime = "image"`` (>= 3.12, minor version
    ``python_version``)."""
    python_version: str = Field(default="3.13", pattern=r"^3\.(1[2-9]|[2-9]\d)$")
    """Minor version the site tree is built for."""
    site_tree: Path | None = None
    """Host copy of the packed site tree (``LEGO_AGENT_OPENHANDS_SITE_TREE``)."""
    num_retries: int = Field(default=2, ge=0)
    """LLM retries on an adapter error before the conversation fails."""

    @model_validator(mode="after")
    def _python_selects_image(self) -> OpenHandsConfig:
        if "python" in self.model_fields_set and "runtime" not in self.model_fields_set:
            self.runtime = "image"
        return self

    def interpreter(self) -> str:
        """The ``python`` the harness runs: the mounted runtime's launcher, or the image's."""
        if self.runtime == "image":
            return self.python
        return f"{INSTALL_ROOT}/python/{self.python_version}/bin/python{self.python_version}"


class OpenHandsHarness(HarnessPlugin[OpenHandsConfig]):
    name: ClassVar[str] = "openhands"
    protocol: ClassVar[Literal["chat"]] = "chat"
    cli_package: ClassVar[str] = SDK
    summary: ClassVar[str] = "OpenHands SDK conversation (its Python mounted from the toolchain)"
    Config = OpenHandsConfig
    env_names: ClassVar[dict[str, str]] = {
        "site_tree": "OPENHANDS_SITE_TREE", "python": "OPENHANDS_PYTHON",
        "extra_args": "OPENHANDS_EXTRA_ARGS", "extra_envs": "OPENHANDS_EXTRA_ENVS", "version": "OPENHANDS_VERSION",
    }  # fmt: skip
    enforces_turn_limit: ClassVar[bool] = True  # max_iteration_per_run

    @staticmethod
    def _home(o: OpenHandsConfig) -> str:
        return f"{INSTALL_ROOT}/openhands/{o.version}-py{o.python_version}"

    @classmethod
    def _runner(cls, o: OpenHandsConfig) -> str:
        return f"{cls._home(o)}-{RUNNER}"

    def _pin(self, o: OpenHandsConfig) -> ToolchainPin:
        return ToolchainPin(
            role="site", kind="pypi", name=SDK, version=o.version, with_dependencies=True,
            python_version=o.python_version, companions=(f"{TOOLS}=={o.version}",),
        )  # fmt: skip

    @staticmethod
    def _runtime_pin(o: OpenHandsConfig) -> ToolchainPin:
        return ToolchainPin(role="runtime", kind="runtime", name="python", version=o.python_version,
                            with_dependencies=True)  # fmt: skip

    def toolchain(self, options: OpenHandsConfig) -> list[ToolchainPin]:
        runtime = [self._runtime_pin(options)] if options.runtime == "toolchain" else []
        return [*runtime, self._pin(options)]

    def _env(self, o: OpenHandsConfig, home: str) -> dict[str, str]:
        return {
            "PYTHONPATH": f"{self._home(o)}/site",
            "PYTHONDONTWRITEBYTECODE": "1",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "HOME": home,
        }

    async def install(self, sandbox: Sandbox, toolchain: Toolchain, o: OpenHandsConfig) -> str:
        if o.runtime == "toolchain":
            path = toolchain.resolve(self._runtime_pin(o))
            await install_archive(sandbox, path, f"{INSTALL_ROOT}/python/{o.python_version}",
                                  integrity=cached_integrity(path))  # fmt: skip
        elif (found := await python_version(sandbox, o.python)) != tuple(
            map(int, o.python_version.split("."))
        ):
            raise HarnessError(
                f"openhands needs Python {o.python_version} in the sandbox (its site tree has binary wheels for "
                f"that version), but {o.python!r} is {found[0]}.{found[1]}; set harness.openhands.python / "
                "python_version to match the image, or runtime = 'toolchain' (the default) to bring one"
            )
        path = toolchain.resolve(self._pin(o), override=o.site_tree)
        # The tree's top folder is "site/": kept, as PYTHONPATH names <home>/site.
        await install_archive(
            sandbox, path, self._home(o), integrity=cached_integrity(path), strip_components=0
        )
        # Beside the tree, not in it: a shared tree is mounted read-only.
        script = resources.files(__package__).joinpath("runner_script.py").read_text()
        await sandbox.write_file(self._runner(o), script, user="root")
        await sh(sandbox, f"chmod a+r {self._runner(o)}", what="openhands runner permissions")
        return self._runner(o)

    async def verify(self, sandbox: Sandbox, o: OpenHandsConfig, user: str) -> str:
        code = (
            "import importlib.metadata as m, openhands.sdk, openhands.tools.terminal;"
            f"print('{SDK}', m.version('{SDK}'))"
        )
        return await version_of(sandbox, [o.interpreter(), "-c", code], user=user, expect=o.version,
                                env=self._env(o, "/tmp/lego-openhands-verify"))  # fmt: skip

    def command(self, request: RunRequest, o: OpenHandsConfig) -> CommandSpec:
        run = {
            "model": request.model, "base_url": request.base_url.rstrip("/") + "/v1", "api_key": request.session_id,
            "prompt": request.prompt, "workdir": request.workdir, "max_turns": request.max_turns,
            "max_context_tokens": request.max_context_tokens, "max_response_tokens": request.max_response_tokens,
            "num_retries": o.num_retries,
        }  # fmt: skip
        env = self._env(o, HOME)
        env.update(o.extra_envs)
        return CommandSpec(
            argv=[o.interpreter(), self._runner(o), f"{HOME}/run.json", *o.extra_args],
            env=env, cwd=request.workdir, user=request.user,
            files={f"{HOME}/run.json": json.dumps(run, indent=2) + "\n"},
        )  # fmt: skip

    def classify(self, outcome: HarnessOutcome, request: RunRequest) -> HarnessOutcome:
        """The runner's last line is ``lego_result`` with the conversation status and error code."""
        for line in reversed(outcome.event_log.splitlines()):
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict) and event.get("type") == "lego_result":
                error = event.get("error") or {}
                code = error.get("code")
                detail = f"status {event.get('status')}" + (
                    f", {code}: {error.get('detail')}" if error else ""
                )
                return outcome.model_copy(update={
                    "hit_turn_limit": code == "MaxIterationsReached", "adapter_error": code in ADAPTER_ERRORS,
                    "detail": detail[:500],
                })  # fmt: skip
        return outcome


plugin = OpenHandsHarness()
