#!/usr/bin/env bash
# Install the four shipped harness plugins (editable) into lego-rl's environment. Idempotent: a plugin
# already installed editable from this checkout is skipped.
#
#   scripts/install_plugins.sh       # into $LEGO_PYTHON's env, else $VENV (the Makefile's), else .venv, else python3
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${LEGO_PYTHON:-}"
if [[ -z "${py}" && -n "${VENV:-}" ]]; then
    case "${VENV}" in /*) py="${VENV}/bin/python" ;; *) py="${root}/${VENV}/bin/python" ;; esac
fi
if [[ -z "${py}" ]]; then
    if [[ -x "${root}/.venv/bin/python" ]]; then py="${root}/.venv/bin/python"; else py="python3"; fi
fi
for name in claude_code codex opencode openhands; do
    dir="${root}/plugins/${name}"
    dist="lego-harness-${name//_/-}"
    module="lego_harness_${name}"
    # Installed editable from this very folder already? Then there is nothing to do.
    if "${py}" - "${module}" "${dir}" <<'PY' 2>/dev/null; then
import importlib.util, pathlib, sys
spec = importlib.util.find_spec(sys.argv[1])
ok = spec is not None and spec.origin and pathlib.Path(spec.origin).resolve().is_relative_to(pathlib.Path(sys.argv[2]).resolve())
sys.exit(0 if ok else 1)
PY
        echo "${dist}: already installed from ${dir}"
        continue
    fi
    "${py}" -m pip install --quiet --no-deps --no-build-isolation -e "${dir}"
    echo "${dist}: installed (editable) from ${dir}"
done
