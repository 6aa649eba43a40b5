"""`lego train`'s progress for a stderr that is no terminal (cli/progress_log.py): a line per (step, phase), a
heartbeat with the counts of the moment when nothing else was printed for ``every_s``, a summary per finished
step read back from its metrics row (an SFT loss on the step that computed it), and no carriage returns."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text

from lego_rl.cli.console import FOREIGN_BARS_OFF, quiet_foreign_progress
from lego_rl.cli.progress_log import LineLog, step_summary
from lego_rl.cli.train_cmd import sft_progress_line
from lego_rl.driver.sft import SftProgress
from lego_rl.runstore import StepMetrics
from lego_rl.runstore import metric_catalog as mc
from lego_rl.runstore.log import MetricsLog


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _train_row(step: int) -> StepMetrics:
    values = mc.declared_values(mc.TRAIN, {
        mc.TRAINED: 1.0, mc.ROLLOUTS: 4.0, mc.ADMITTED_ROLLOUTS: 4.0, mc.EXCLUDED_ROLLOUTS: 0.0,
        mc.REWARD_MEAN: 0.5, mc.SOLVE_RATE: 0.5, mc.SAMPLED_TOKENS: 1234.0, mc.TOKENS: 1200.0,
        mc.TIME_STEP_S: 12.0, mc.TIME_ROLLOUT_S: 10.0, mc.TIME_TRAIN_S: 1.5, mc.TIME_SYNC_S: 0.5})
    return StepMetrics(step=step, started_at=0.0, finished_at=12.0, values=values)


def test_phase_lines_heartbeats_and_step_summaries(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    log = MetricsLog(metrics)
    log.append(_train_row(0))  # an earlier launch's row (a resume): summarised by that launch, not again
    lines: list[str] = []
    clock = Clock()
    ll = LineLog(metrics, every_s=30.0, total_steps=3, sft=False, emit=lines.append, clock=clock)

    def status(done: int) -> Text:
        return Text(f"step 2/3  rollout   rollouts {done}/4 (in flight 1)")

    ll.show(status(0), (1, "rollout"))
    clock.t += 10
    ll.show(status(1), (1, "rollout"))  # same phase, 10 s: nothing
    clock.t += 25
    ll.show(status(3), (1, "rollout"))  # 35 s since the last line: a heartbeat with the counts of now
    clock.t += 5
    ll.show(status(3), (1, "rollout"))
    log.append(_train_row(1))
    ll.show(Text("step 3/3  rollout   rollouts 0/4 (in flight 4)"), (2, "rollout"))
    log.close()
    assert lines == [
        "step 2/3  rollout   rollouts 0/4 (in flight 1)",
        "heartbeat 0m35s  step 2/3  rollout   rollouts 3/4 (in flight 1)",
        "step 2/3 done  rollouts 4 (admitted 4, excluded 0)  reward 0.500  solved 50%  tokens sampled 1,234 "
        "trained 1,200  time 12.0s = rollout 10.0s + train 1.5s + sync 0.5s",
        "step 3/3  rollout   rollouts 0/4 (in flight 4)",
    ]
    assert not any("\r" in line or "\x1b" in line for line in lines)


def test_sft_summary_carries_the_loss_of_its_own_step() -> None:
    row = StepMetrics(step=2, started_at=0.0, finished_at=1.0, values=mc.declared_values(mc.SFT, {
        mc.LOSS: 4.0125, mc.GRAD_NORM: 1.25, mc.DEMONSTRATIONS: 2.0, mc.TOKENS: 800.0, mc.TIME_TRAIN_S: 1.5}))
    assert step_summary(row, 5, sft=True) == ("SFT step 3/5 done  loss 4.013  grad norm 1.250  demonstrations 2  "
                                              "tokens 800  time 1.5s")
    # The live line names the step a loss belongs to: during step 4 the last loss known is step 3's.
    line = sft_progress_line(SftProgress(step=3, total_steps=5, last_loss=4.0125, last_loss_step=2, phase="sft"))
    assert line.plain == "SFT step 4/5  sft       last loss 4.013 (step 3)"


def test_a_step_without_signal_says_nothing_trained() -> None:
    row = _train_row(0)
    quiet = StepMetrics(step=0, started_at=0.0, finished_at=1.0, values={**row.values, mc.TRAINED: 0.0})
    assert step_summary(quiet, 1, sft=False).endswith("(no signal: nothing trained)")
    assert "nothing trained" not in step_summary(row, 1, sft=False)


def test_foreign_bars_are_switched_off_off_a_terminal_and_an_operators_setting_wins() -> None:
    env = {"TQDM_DISABLE": "0"}
    assert quiet_foreign_progress(env, terminal=False)
    assert env == {**FOREIGN_BARS_OFF, "TQDM_DISABLE": "0"}
    on_a_terminal: dict[str, str] = {}
    assert not quiet_foreign_progress(on_a_terminal, terminal=True) and on_a_terminal == {}
