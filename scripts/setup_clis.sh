#!/usr/bin/env bash
# Install (once) the real coding CLIs the adapter's end-to-end tests drive:
#
#   scripts/setup_clis.sh                    # -> ${LEGO_CLI_DIR:-<repo>/.lego/clis}
#   LEGO_CLI_DIR=/some/dir scripts/setup_clis.sh
#
# Layout of the result (what tests/cli_e2e looks for):
#   $LEGO_CLI_DIR/claude/node_modules/.bin/claude        npm @anthropic-ai/claude-code
#   $LEGO_CLI_DIR/codex/node_modules/.bin/codex          npm @openai/codex (+ linux-x64 native package)
#   $LEGO_CLI_DIR/opencode/node_modules/.bin/opencode    npm opencode-ai
#   $LEGO_CLI_DIR/openhands/bin/python                   Python 3.12 venv with openhands-sdk + -tools
#
# Idempotent and cached: each part carries a stamp naming its package and version; a matching stamp
# means nothing to do. Each part is built in a sibling temp dir that is renamed into place only when
# complete, so an interrupted install never leaves a tree that looks finished.
# Needs node/npm (Node 20 is enough), the npm registry, PyPI and Python 3.12 ($LEGO_PYTHON312).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${LEGO_CLI_DIR:-${here}/.lego/clis}"
CLAUDE_VERSION="${LEGO_CLAUDE_CODE_VERSION:-2.1.332}"
CODEX_VERSION="${LEGO_CODEX_VERSION:-0.162.1}"
OPENCODE_VERSION="${LEGO_OPENCODE_VERSION:-1.18.33}"
OPENHANDS_VERSION="${LEGO_OPENHANDS_VERSION:-1.58.2}"
# The first Python 3.12 that actually runs (a pyenv shim on PATH may exist but refuse to run).
PY312="${LEGO_PYTHON312:-}"
if [[ -z "${PY312}" ]]; then
    for cand in /root/.pyenv/versions/3.12.*/bin/python3.12 "$(command -v python3.12 || true)"; do
        if [[ -n "${cand}" ]] && "${cand}" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
            PY312="${cand}"
            break
        fi
    done
fi
STAMP_NAME=".lego-cli-stamp"

mkdir -p "${DEST}"

# up_to_date NAME STAMP: true when DEST/NAME was finished with exactly this stamp.
up_to_date() {
    [[ -f "${DEST}/$1/${STAMP_NAME}" ]] && [[ "$(cat "${DEST}/$1/${STAMP_NAME}")" == "$2" ]]
}

# finish NAME STAMP TMP: stamp the temp tree and move it into place (replacing an older one).
finish() {
    echo "$2" >"$3/${STAMP_NAME}"
    rm -rf --one-file-system "${DEST}/$1.old"
    [[ -e "${DEST}/$1" ]] && mv "${DEST}/$1" "${DEST}/$1.old"
    mv "$3" "${DEST}/$1"
    rm -rf --one-file-system "${DEST}/$1.old"
    echo "installed $1: $2"
}

# npm_part NAME STAMP PACKAGE...: npm-install packages into DEST/NAME/node_modules.
npm_part() {
    local name="$1" stamp="$2"
    shift 2
    if up_to_date "${name}" "${stamp}"; then
        echo "${name} up to date: ${stamp}"
        return
    fi
    local tmp
    tmp="$(mktemp -d "${DEST}/${name}.tmp.XXXXXX")"
    # --include=optional: the CLIs ship their native binaries as optional platform packages.
    (cd "${tmp}" && echo '{"private": true}' >package.json \
        && npm install --no-audit --no-fund --include=optional --loglevel=error "$@")
    finish "${name}" "${stamp}" "${tmp}"
}

npm_part claude "@anthropic-ai/claude-code@${CLAUDE_VERSION}" "@anthropic-ai/claude-code@${CLAUDE_VERSION}"
# Codex's launcher looks for its native binary in the optional dependency @openai/codex-linux-x64,
# published as the platform build @openai/codex@<version>-linux-x64; name the alias explicitly so a
# registry that skips optional dependencies still yields a working binary.
npm_part codex "@openai/codex@${CODEX_VERSION}+linux-x64" \
    "@openai/codex@${CODEX_VERSION}" "@openai/codex-linux-x64@npm:@openai/codex@${CODEX_VERSION}-linux-x64"
npm_part opencode "opencode-ai@${OPENCODE_VERSION}" "opencode-ai@${OPENCODE_VERSION}"

oh_stamp="openhands-sdk==${OPENHANDS_VERSION} openhands-tools==${OPENHANDS_VERSION}"
if up_to_date openhands "${oh_stamp}"; then
    echo "openhands up to date: ${oh_stamp}"
else
    [[ -n "${PY312}" && -x "${PY312}" ]] || { echo "setup_clis.sh: Python 3.12 not found (set LEGO_PYTHON312)" >&2; exit 2; }
    # A venv hard-codes its own path, so it is built at its final place; the stamp, written last,
    # is what marks it finished (tests and this script trust nothing without it).
    rm -rf --one-file-system "${DEST}/openhands"
    "${PY312}" -m venv "${DEST}/openhands"
    "${DEST}/openhands/bin/pip" install --quiet --disable-pip-version-check \
        "openhands-sdk==${OPENHANDS_VERSION}" "openhands-tools==${OPENHANDS_VERSION}"
    echo "${oh_stamp}" >"${DEST}/openhands/${STAMP_NAME}"
    echo "installed openhands: ${oh_stamp}"
fi

echo "CLIs ready under ${DEST}"
