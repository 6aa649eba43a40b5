#!/usr/bin/env bash
# The main job on the embedded defaults: `lego rollout-check` over the example tasks with lego.toml.
#
# It runs inside a loopback-only network namespace: the engine, the adapter, the sandboxes and the CLI all
# live on 127.0.0.1, and nothing the CLI tries to reach outside can leave. Arguments are passed on to
# `lego rollout-check` (e.g. `--harness codex`, `-n 4`, `--ids lego-example-median`).
#
# Exit status: that of rollout-check, except that "ran fine, but no sample earned reward 1" (exit 1) is
# reported and accepted here: the default model is a random tiny model, which cannot solve a task.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
lego="${LEGO:-${here}/.venv/bin/lego}"
cd "${here}"
unshare -n bash -c 'ip link set lo up && exec "$0" rollout-check -c lego.toml --baseline "$@"' "${lego}" "$@"
rc=$?
if [[ ${rc} == 1 ]]; then
    echo "main job: every rollout ran, and none solved its task; expected of the random tiny model in lego.toml." >&2
    echo "          Point model.checkpoint (HF_CHECKPOINT) at a real model to see rewards." >&2
    exit 0
fi
exit ${rc}
