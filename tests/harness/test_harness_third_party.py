"""A third-party harness, end to end: pip-install a throwaway plugin package from a temp folder into
lego's venv, see `lego harnesses` list it, `lego toolchain fetch` fetch its pin (from the registry
double), then install and run it in a real bwrap sandbox. The package is uninstalled afterwards.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from subprocess import PIPE
from textwrap import dedent

import pytest
from conftest import MakeSandbox
from harness_helpers import make_tgz, sri, start_registry

from lego_rl.harness import RunRequest, Toolchain, get_harness

DIST = "lego-harness-throwaway-test"
LEGO = str(Path(sys.executable).with_name("lego"))

PLUGIN = dedent('''
    """A throwaway harness written the way docs/plugins.md tells a third party to."""
    from typing import Any, ClassVar, Literal

    from lego_rl.harness import CommandSpec, HarnessConfig, HarnessPlugin, RunRequest
    from lego_rl.harness.install import INSTALL_ROOT, install_archive, version_of
    from lego_rl.harness.models import ToolchainPin
    from lego_rl.harness.toolchain import cached_integrity

    INTEGRITY = "@INTEGRITY@"


    class ThrowawayConfig(HarnessConfig):
        version: str = "1.0.0"


    class ThrowawayHarness(HarnessPlugin[ThrowawayConfig]):
        name: ClassVar[str] = "throwaway"
        protocol: ClassVar[Literal["chat"]] = "chat"
        cli_package: ClassVar[str] = "throwaway-cli"
        Config = ThrowawayConfig
        env_names: ClassVar[dict[str, str]] = {"extra_args": "THROWAWAY_EXTRA_ARGS"}

        def toolchain(self, options: Any) -> list[ToolchainPin]:
            return [ToolchainPin(role="cli", kind="npm", name="throwaway-cli", version=options.version,
                                 integrity=INTEGRITY)]

        async def install(self, sandbox, toolchain, options) -> str:
            path = toolchain.resolve(self.toolchain(options)[0])
            await install_archive(sandbox, path, f"{INSTALL_ROOT}/throwaway", integrity=cached_integrity(path))
            return f"{INSTALL_ROOT}/throwaway/bin/throwaway"

        async def verify(self, sandbox, options, user) -> str:
            return await version_of(sandbox, [f"{INSTALL_ROOT}/throwaway/bin/throwaway", "--version"],
                                    user=user, expect=options.version)

        def command(self, request: RunRequest, options: Any) -> CommandSpec:
            return CommandSpec(argv=[f"{INSTALL_ROOT}/throwaway/bin/throwaway", *options.extra_args, request.prompt],
                               env={"THROWAWAY_KEY": request.session_id}, cwd=request.workdir, user=request.user)


    plugin = ThrowawayHarness()
''')

CLI = '#!/bin/sh\n[ "$1" = --version ] && { echo "throwaway 1.0.0"; exit 0; }\necho "{\\"said\\": \\"$*\\", \\"key\\": \\"$THROWAWAY_KEY\\"}"\n'


async def lego(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    # Async: the registry double answers from this test's event loop, which must keep running.
    proc = await asyncio.create_subprocess_exec(LEGO, *args, env=env, stdout=PIPE, stderr=PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode(), err.decode()


def pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
async def test_pip_installed_plugin_is_listed_fetched_and_used(
    make_sandbox: MakeSandbox, tmp_path: Path
) -> None:
    cli = make_tgz(
        tmp_path / "throwaway-cli.tgz", {"bin/throwaway": CLI}, modes={"bin/throwaway": 0o755}
    ).read_bytes()
    pkg = tmp_path / "pkg"
    (pkg / "src").mkdir(parents=True)
    (pkg / "src" / "lego_throwaway_harness.py").write_text(PLUGIN.replace("@INTEGRITY@", sri(cli)))
    (pkg / "pyproject.toml").write_text(
        dedent(f'''
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "{DIST}"
        version = "0.3.0"
        [project.entry-points."lego_rl.harnesses"]
        throwaway = "lego_throwaway_harness:plugin"
        [tool.setuptools]
        package-dir = {{"" = "src"}}
        py-modules = ["lego_throwaway_harness"]
    ''')
    )
    registry, runner = await start_registry()
    registry.tarballs[("throwaway-cli", "1.0.0")] = cli
    installed = pip("install", "--quiet", "--no-deps", "--no-build-isolation", str(pkg))
    assert installed.returncode == 0, installed.stderr
    try:
        env = {k: v for k, v in os.environ.items() if k != "LEGO_LOAD_PLUGINS"}
        rc, out, err = await lego("harnesses", "--json", env=env)
        assert rc == 0, err
        row = next(r for r in json.loads(out) if r["name"] == "throwaway")
        assert (row["package"], row["package_version"], row["protocol"], row["version"]) == (
            DIST,
            "0.3.0",
            "chat",
            "1.0.0",
        )

        folder = tmp_path / "toolchain"
        rc, out, err = await lego(
            "toolchain",
            "fetch",
            "-H",
            "throwaway",
            "--dir",
            str(folder),
            "--json",
            env=env | {"npm_config_registry": registry.url},
        )
        assert rc == 0, err
        [entry] = json.loads(out)
        assert entry["downloaded"] and entry["integrity"] == sri(cli)

        importlib.invalidate_caches()
        handle = get_harness("throwaway", environ={"LEGO_AGENT_THROWAWAY_EXTRA_ARGS": "--loud"})
        sb = await make_sandbox()
        assert await handle.install(sb, Toolchain(folder)) == "/opt/lego/throwaway/bin/throwaway"
        assert await handle.verify(sb) == "throwaway 1.0.0"
        out = await handle.run(
            sb,
            RunRequest(
                session_id="k9",
                base_url="http://127.0.0.1:1",
                model="m",
                prompt="hello",
                workdir="/testbed",
                time_budget_s=30,
            ),
        )
        assert out.kind == "completed"
        assert json.loads(out.event_log) == {"said": "--loud hello", "key": "k9"}
    finally:
        await runner.cleanup()
        removed = pip("uninstall", "--yes", "--quiet", DIST)
        assert removed.returncode == 0, removed.stderr
