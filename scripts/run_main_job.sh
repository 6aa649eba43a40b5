#!/usr/bin/env bash
# The main job on the embedded defaults: train the tiny model with lego.toml through real Claude Code in bwrap.
#
# Three stages, all through the real CLI, sandboxes and grader, in one run folder runs/main-<time>/:
#   1. demos/  record demonstrations: `lego rollout-check` with a scripted policy at the model boundary
#              (scripts/record_demos.py) applying the median task's reference fix; its rewarded samples are
#              demos.jsonl. Skipped when DEMOS names an existing demonstrations file.
#   2. sft/    supervised warm start on them: `lego train --sft` (a random model never earns a reward, so
#              GRPO alone would have no signal); the loss falls, checkpoints land in sft/checkpoints/.
#   3. grpo/   `lego train` from the SFT checkpoint: train.num_rollout GRPO steps over the example tasks
#              (metrics.jsonl, events.jsonl, tensorboard/, checkpoints/). Arguments are passed on to this
#              stage (e.g. `--steps 3`, `--set rollout.batch_size=1`).
#
# It runs inside a loopback-only network namespace: the engine, the adapter, the sandboxes and the CLI all
# live on 127.0.0.1, and nothing the CLI tries to reach outside can leave.
#
# Exit status: 0 when every stage completed; otherwise the failing stage's: 1 (recording: no scripted rollout
# earned reward 1, so the CLI, adapter or grader chain is broken), 2 (configuration or data refused: nothing
# started), 3 (infrastructure: engine or every rollout of a step failed), 130 (stopped by a signal).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
lego="${LEGO:-${here}/.venv/bin/lego}"
python="${PYTHON:-${here}/.venv/bin/python}"
runs="${RUNS:-runs/main-$(date +%Y%m%d-%H%M%S)}"
cd "${here}"
started=$(date +%s)
unshare -n env LEGO="${lego}" PY="${python}" RUNS="${runs}" DEMOS="${DEMOS:-}" bash -c '
    set -eo pipefail
    ip link set lo up
    demos="${DEMOS:-${RUNS}/demos.jsonl}"
    if [ -z "${DEMOS}" ]; then
        printf "\n" >&2; echo "main job [1/3]: recording demonstrations through Claude Code (${RUNS}/demos)" >&2
        "${PY}" scripts/record_demos.py -c lego.toml --lego "${LEGO}" --ids lego-example-median -n 1 \
            --run-root "${RUNS}/demos" --out "${demos}"
    fi
    printf "\n" >&2; echo "main job [2/3]: SFT warm start on ${demos} (${RUNS}/sft)" >&2
    "${LEGO}" train -c lego.toml --sft "${demos}" --run-root "${RUNS}/sft"
    checkpoint="${RUNS}/sft/checkpoints/$(cat "${RUNS}/sft/checkpoints/latest")"
    printf "\n" >&2; echo "main job [3/3]: GRPO through Claude Code from ${checkpoint} (${RUNS}/grpo)" >&2
    "${LEGO}" train -c lego.toml --run-root "${RUNS}/grpo" --set "model.checkpoint=\"${checkpoint}\"" "$@"
' main-job "$@"
rc=$?
elapsed=$(( $(date +%s) - started ))
printf "\n" >&2
case ${rc} in
    0)
        echo "main job: trained in ${elapsed}s; metrics, TensorBoard scalars and checkpoints under ${runs}/sft and ${runs}/grpo." >&2 ;;
    1)
        echo "main job: FAILED: the scripted policy's rollout earned no reward: the CLI, adapter or grader chain is broken;" >&2
        echo "          read ${runs}/demos/events.jsonl and skills/diagnose/SKILL.md." >&2 ;;
    3)
        echo "main job: FAILED: infrastructure, not the model (a dead engine, or every rollout of a step failed);" >&2
        echo "          read the stage's events.jsonl under ${runs} and skills/diagnose/SKILL.md." >&2 ;;
    *)
        echo "main job: FAILED with exit ${rc}; see the message above and ${runs}." >&2 ;;
esac
exit ${rc}
