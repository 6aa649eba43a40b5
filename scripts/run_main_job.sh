#!/usr/bin/env bash
# The main job on the embedded defaults: `lego rollout-check` over the example tasks with lego.toml.
#
# It runs inside a loopback-only network namespace: the engine, the adapter, the sandboxes and the CLI all
# live on 127.0.0.1, and nothing the CLI tries to reach outside can leave. Arguments are passed on to
# `lego rollout-check` (e.g. `--harness codex`, `-n 4`, `--ids lego-example-median`).
#
# Exit status: that of rollout-check (its --help lists the codes), except that exactly one failure is
# accepted: 1, "rollouts ran to a policy outcome and none earned reward 1", which is what the random tiny
# model in lego.toml does. Everything else stays a failure, in particular 3 (every rollout failed in our
# infrastructure, so nothing was learnt about the model) and 4 (a baseline already passes: nothing was
# rolled out at all).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
lego="${LEGO:-${here}/.venv/bin/lego}"
cd "${here}"
unshare -n bash -c 'ip link set lo up && exec "$0" rollout-check -c lego.toml --baseline "$@"' "${lego}" "$@"
rc=$?
case ${rc} in
    1)
        echo "main job: every rollout ran, and none solved its task; expected of the random tiny model in lego.toml." >&2
        echo "          Point model.checkpoint (HF_CHECKPOINT) at a real model to see rewards." >&2
        exit 0 ;;
    3)
        echo "main job: FAILED: infrastructure, not the model (every rollout, or the baseline grader);" >&2
        echo "          read the run's events.jsonl and skills/diagnose/SKILL.md." >&2 ;;
    4)
        echo "main job: FAILED: a task already passes without any change, so nothing was rolled out." >&2 ;;
esac
exit ${rc}
