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
#   $LEGO_CLI_DIR/openhands/bin/python                   trixie's python3.13 (scripts/trixie_python.sh)
#                                                        with openhands-sdk + -tools in openhands/site
#
# Idempotent and cached: each part carries a stamp naming its package and version; a matching stamp
# means nothing to do. Each part is built in a sibling temp dir that is renamed into place only when
# complete, so an interrupted install never leaves a tree that looks finished.
# Needs node/npm (Node 20 is enough), the npm registry, PyPI, bwrap and the Debian trixie rootfs of
# scripts/build_rootfs_trixie.sh (its python3.13 and pip run the SDK; the host needs no Python 3.13).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${LEGO_CLI_DIR:-${here}/.lego/clis}"
CLAUDE_VERSION="${LEGO_CLAUDE_CODE_VERSION:-2.1.332}"
CODEX_VERSION="${LEGO_CODEX_VERSION:-0.162.1}"
OPENCODE_VERSION="${LEGO_OPENCODE_VERSION:-1.18.33}"
OPENHANDS_VERSION="${LEGO_OPENHANDS_VERSION:-1.58.2}"
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

# The SDK runs on the trixie rootfs's Python, as the openhands harness does inside a sandbox; its site
# tree is pip-installed by that same interpreter, so every binary wheel matches it.
oh_stamp="openhands-sdk==${OPENHANDS_VERSION} openhands-tools==${OPENHANDS_VERSION} python3.13 (trixie rootfs)"
if up_to_date openhands "${oh_stamp}"; then
    echo "openhands up to date: ${oh_stamp}"
else
    tmp="$(mktemp -d "${DEST}/openhands.tmp.XXXXXX")"
    # Compiled here (pip's default): the tree is read-only where it runs, and litellm is slow to compile.
    (cd "${tmp}" && nice "${here}/scripts/trixie_python.sh" -m pip install --quiet \
        --disable-pip-version-check --target site \
        "openhands-sdk==${OPENHANDS_VERSION}" "openhands-tools==${OPENHANDS_VERSION}")
    mkdir "${tmp}/bin"
    # It finds its site tree through its own path, so the tree still works after the rename below.
    cat >"${tmp}/bin/python" <<EOF
#!/bin/sh
# Written by scripts/setup_clis.sh: the OpenHands SDK on the trixie rootfs's python3.13.
site="\$(dirname "\$(dirname "\$(readlink -f "\$0")")")/site"
PYTHONPATH="\${site}" exec "${here}/scripts/trixie_python.sh" --ro "\${site}" -- "\$@"
EOF
    chmod 0755 "${tmp}/bin/python"
    finish openhands "${oh_stamp}" "${tmp}"
fi

echo "CLIs ready under ${DEST}"
