"""scripts/run_main_job.sh (`make run`): SFT warm start, held-out evaluation of its checkpoint, GRPO from it,
the same evaluation of the GRPO checkpoint, then the verdict (scripts/main_job_report.py, run for real on what
the stages wrote); each stage's exit code passed on, the GRPO stage getting the extra arguments. The recording
stage is skipped by naming demonstrations in DEMOS (it needs the engine; tests/driver/test_sft_demos.py runs the
whole job for real)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

STUB = """#!/usr/bin/env bash
# TEST DOUBLE for the `lego` executable: records each call's arguments. `train --sft` and `train` leave a
# checkpoints/latest under their --run-root as the real ones do (GRPO also one metrics row of a trained step),
# `tasks screen` writes its --report with $STUB_SOLVED of $STUB_K solved per task; then each exits with its
# stage's $STUB_EXIT_*.
printf '%s\\n' "$*" >> "$STUB_ARGS"
root=""; report=""; sft=0; prev=""
for a in "$@"; do
    [ "$prev" = "--run-root" ] && root="$a"
    [ "$prev" = "--report" ] && report="$a"
    [ "$a" = "--sft" ] && sft=1
    prev="$a"
done
if [ "$1" = tasks ]; then
    for t in lego-example-median lego-example-slugify; do
        printf '{"instance_id":"%s","attempts":%s,"solved":%s,"pass_rate":null,"decision":"kept"}\\n' \\
            "$t" "$STUB_K" "$STUB_SOLVED" >> "$report"
    done
    exit "$STUB_EXIT_EVAL"
fi
mkdir -p "$root/checkpoints" && echo step-000007 > "$root/checkpoints/latest"
if [ "$sft" = 1 ]; then exit "$STUB_EXIT_SFT"; fi
echo '{"step":0,"started_at":0,"finished_at":1,"values":{"trained":1.0,"optimizer_steps":1.0,"weight_version":1.0,"consistency/max_abs_diff":0.0}}' > "$root/metrics.jsonl"
exit "$STUB_EXIT_GRPO"
"""


@pytest.mark.root  # the script runs the job in a network namespace (unshare -n)
@pytest.mark.parametrize(("sft_exit", "eval_exit", "grpo_exit", "script_exit", "calls"), [
    (0, 0, 0, 0, 4), (2, 0, 0, 2, 1), (3, 0, 0, 3, 1), (0, 3, 0, 3, 2), (0, 0, 3, 3, 3), (0, 0, 130, 130, 3),
], ids=["trained", "sft-data-refused", "sft-infra", "eval-short", "grpo-infra", "grpo-stopped"])
def test_main_job_runs_its_stages_in_order(tmp_path: Path, sft_exit: int, eval_exit: int, grpo_exit: int,
                                           script_exit: int, calls: int) -> None:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) for the loopback-only namespace")
    stub = tmp_path / "lego_test_double"
    stub.write_text(STUB)
    stub.chmod(0o755)
    args = tmp_path / "args"
    demos = tmp_path / "demos.jsonl"
    demos.write_text("")
    runs = tmp_path / "runs"
    env = {**os.environ, "LEGO": str(stub), "PYTHON": sys.executable, "STUB_ARGS": str(args), "STUB_K": "3",
           "STUB_SOLVED": "1", "STUB_EXIT_SFT": str(sft_exit), "STUB_EXIT_EVAL": str(eval_exit),
           "STUB_EXIT_GRPO": str(grpo_exit), "DEMOS": str(demos), "RUNS": str(runs), "EVAL_K": "3",
           "GRPO_STEPS": "5"}
    proc = subprocess.run([str(REPO / "scripts" / "run_main_job.sh"), "--set", "rollout.batch_size=1"], env=env,
                          check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == script_exit, proc.stderr
    lines = args.read_text().splitlines()
    assert len(lines) == calls, lines
    assert lines[0] == f"train -c lego.toml --sft {demos} --run-root {runs}/sft --set train.lr=2e-3"
    sft = f"{runs}/sft/checkpoints/step-000007"
    if calls >= 2:
        assert lines[1] == (f"tasks screen -c lego.toml -k 3 --min-solved 0 --max-solved 3 --report "
                            f"{runs}/eval-before.jsonl --set model.checkpoint=\"{sft}\" --set "
                            f"paths.run_root=\"{runs}/eval-before\"")
    if calls >= 3:
        assert lines[2] == (f"train -c lego.toml --run-root {runs}/grpo --set model.checkpoint=\"{sft}\" --steps 5 "
                            "--set rollout.batch_size=1")
    if calls == 4:
        assert lines[3].startswith("tasks screen -c lego.toml -k 3 ") and "grpo/checkpoints/step-000007" in lines[3]
    if script_exit == 0:
        # the verdict, computed from the reports and the GRPO metrics the stages left
        assert "GRPO stage: steps 1, trained 1 (optimizer steps 1), engine weights at version 1, metrics rows " \
               "with consistency figures 1" in proc.stdout, proc.stdout
        # 1 of 3 per task, 2 of 6 pooled, before and after; Wilson 95 % bounds worked by hand (0.062, 0.792) and
        # (0.097, 0.700)
        assert proc.stdout.count(" 1/3  =  33% [  6%,  79%]") == 4, proc.stdout
        assert proc.stdout.count(" 2/6  =  33% [ 10%,  70%]") == 2, proc.stdout
        assert (runs / "pass_at_1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "main job: done" in proc.stderr
    else:
        assert "FAILED" in proc.stderr
        assert not (runs / "pass_at_1.png").exists()


def test_the_verdict_refuses_an_evaluation_short_of_its_rollouts(tmp_path: Path) -> None:
    """A task whose evaluation lost rollouts to the infrastructure has no rate at k: the verdict names the file,
    the task and the losses instead of printing a rate over fewer attempts than it claims."""
    sys.path.insert(0, str(REPO / "scripts"))
    from main_job_report import read_report, wilson_interval

    report = tmp_path / "eval-after.jsonl"
    report.write_text('{"instance_id":"t1","attempts":8,"solved":8}\n'
                      '{"instance_id":"t2","attempts":6,"solved":0,"decision":"too few attempts",'
                      '"infrastructure_reasons":{"sandbox_setup":2}}\n')
    with pytest.raises(SystemExit, match=r"eval-after.jsonl:2: t2 has 6 of 8 attempts .*sandbox_setup"):
        read_report(report, 8)
    assert read_report(report, 6)["t1"].solved == 8
    # never zero-width at 0/k or k/k (hand-worked: 1 - 0.324 = 0.676)
    assert wilson_interval(0, 8) == (0.0, pytest.approx(0.3244, abs=1e-4))
    assert wilson_interval(8, 8) == (pytest.approx(0.6756, abs=1e-4), 1.0)
    with pytest.raises(ValueError, match="solved=3 of attempts=2"):
        wilson_interval(3, 2)
