#!/usr/bin/env bash
# The main job on the embedded defaults: train the tiny model with lego.toml through real Claude Code in bwrap,
# and measure whether GRPO moved it.
#
# Six stages, all through the real CLI, sandboxes and grader, in one run folder runs/main-<time>/:
#   1. demos/        record demonstrations: `lego rollout-check` with a scripted policy at the model boundary
#                    (scripts/record_demos.py) applying each example task's reference fix, at lego.toml's
#                    model.max_response_tokens; its rewarded samples are demos.jsonl (one per task). Skipped
#                    when DEMOS names an existing demonstrations file.
#   2. sft/          supervised warm start on them: `lego train --sft` at SFT_LR (default 2e-3; lego.toml's
#                    train.lr is GRPO's): a random model never earns a reward, so GRPO alone would have no
#                    signal; checkpoints land in sft/checkpoints/.
#   3. eval-before/  held-out pass@1 of the SFT checkpoint: `lego tasks screen`, EVAL_K fresh rollouts per task,
#                    none of them trained on (report: eval-before.jsonl).
#   4. grpo/         `lego train` from the SFT checkpoint: GRPO_STEPS steps (default lego.toml's
#                    train.num_rollout) over the example tasks (metrics.jsonl, events.jsonl, tensorboard/,
#                    checkpoints/). Arguments are passed on to this stage (e.g. `--set rollout.batch_size=1`).
#   5. eval-after/   the same evaluation of the GRPO checkpoint (eval-after.jsonl).
#   6. the verdict:  scripts/main_job_report.py prints pass@1 before and after with 95 % Wilson intervals, what
#                    the GRPO stage did (steps trained, optimizer steps, weight version, consistency rows), and
#                    writes pass_at_1.png.
#
# It runs inside a loopback-only network namespace: the engine, the adapter, the sandboxes and the CLI all
# live on 127.0.0.1, and nothing the CLI tries to reach outside can leave.
#
# Variables: RUNS (the run folder), DEMOS (skip recording), SFT_LR, SFT_STEPS (default lego.toml's
# train.sft_steps), GRPO_STEPS (the GRPO schedule: the one knob between
# the default short job and the longer one README's figures come from), EVAL_K (rollouts per task and
# evaluation, default 8).
#
# Exit status: 0 when every stage completed; otherwise the failing stage's: 1 (recording: no scripted rollout
# earned reward 1, so the CLI, adapter or grader chain is broken; or the verdict could not be computed),
# 2 (configuration or data refused: nothing started), 3 (infrastructure: engine or every rollout of a step
# failed, or an evaluation short of EVAL_K attempts), 130 (stopped by a signal).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
lego="${LEGO:-${here}/.venv/bin/lego}"
python="${PYTHON:-${here}/.venv/bin/python}"
runs="${RUNS:-runs/main-$(date +%Y%m%d-%H%M%S)}"
eval_k="${EVAL_K:-8}"
cd "${here}"
started=$(date +%s)
unshare -n env LEGO="${lego}" PY="${python}" RUNS="${runs}" DEMOS="${DEMOS:-}" EVAL_K="${eval_k}" \
        GRPO_STEPS="${GRPO_STEPS:-}" SFT_LR="${SFT_LR:-2e-3}" SFT_STEPS="${SFT_STEPS:-}" bash -c '
    set -eo pipefail
    ip link set lo up
    stage() { printf "\n" >&2; echo "main job [$1/6]: $2" >&2; }
    evaluate() {  # $1: before|after, $2: checkpoint. Every task kept (band 0..k): the rate is the result.
        "${LEGO}" tasks screen -c lego.toml -k "${EVAL_K}" --min-solved 0 --max-solved "${EVAL_K}" \
            --report "${RUNS}/eval-$1.jsonl" --set "model.checkpoint=\"$2\"" --set "paths.run_root=\"${RUNS}/eval-$1\""
    }
    demos="${DEMOS:-${RUNS}/demos.jsonl}"
    if [ -z "${DEMOS}" ]; then
        stage 1 "recording demonstrations through Claude Code (${RUNS}/demos)"
        "${PY}" scripts/record_demos.py -c lego.toml --lego "${LEGO}" -n 1 --run-root "${RUNS}/demos" --out "${demos}"
    fi
    stage 2 "SFT warm start on ${demos} (${RUNS}/sft)"
    sft_steps=()
    [ -n "${SFT_STEPS}" ] && sft_steps=(--steps "${SFT_STEPS}")
    "${LEGO}" train -c lego.toml --sft "${demos}" --run-root "${RUNS}/sft" --set "train.lr=${SFT_LR}" "${sft_steps[@]}"
    sft="${RUNS}/sft/checkpoints/$(cat "${RUNS}/sft/checkpoints/latest")"
    stage 3 "held-out pass@1 of the SFT checkpoint, ${EVAL_K} rollouts per task (${RUNS}/eval-before)"
    evaluate before "${sft}"
    stage 4 "GRPO through Claude Code from ${sft} (${RUNS}/grpo)"
    steps=()
    [ -n "${GRPO_STEPS}" ] && steps=(--steps "${GRPO_STEPS}")
    "${LEGO}" train -c lego.toml --run-root "${RUNS}/grpo" --set "model.checkpoint=\"${sft}\"" "${steps[@]}" "$@"
    grpo="${RUNS}/grpo/checkpoints/$(cat "${RUNS}/grpo/checkpoints/latest")"
    stage 5 "held-out pass@1 of the GRPO checkpoint (${RUNS}/eval-after)"
    evaluate after "${grpo}"
    stage 6 "the verdict"
    "${PY}" scripts/main_job_report.py -k "${EVAL_K}" --before "${RUNS}/eval-before.jsonl" \
        --after "${RUNS}/eval-after.jsonl" --grpo "${RUNS}/grpo" --png "${RUNS}/pass_at_1.png"
' main-job "$@"
rc=$?
elapsed=$(( $(date +%s) - started ))
printf "\n" >&2
case ${rc} in
    0)
        echo "main job: done in ${elapsed}s; metrics, TensorBoard scalars and checkpoints under ${runs}/sft and" \
             "${runs}/grpo, the plot in ${runs}/pass_at_1.png." >&2 ;;
    1)
        echo "main job: FAILED: no scripted demonstration earned reward 1 (the CLI, adapter or grader chain is" \
             "broken), or the verdict could not be computed (message above);" >&2
        echo "          read ${runs}/demos/events.jsonl and skills/diagnose/SKILL.md." >&2 ;;
    3)
        echo "main job: FAILED: infrastructure, not the model (a dead engine, every rollout of a step failed, or" \
             "an evaluation short of its rollouts);" >&2
        echo "          read the stage's events.jsonl under ${runs} and skills/diagnose/SKILL.md." >&2 ;;
    *)
        echo "main job: FAILED with exit ${rc}; see the message above and ${runs}." >&2 ;;
esac
exit ${rc}
