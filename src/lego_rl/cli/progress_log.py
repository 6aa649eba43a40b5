"""`lego train`'s progress when stderr is no terminal (a log file, a pipe, ``nohup``, ``make run``).

A live line would be redrawn with cursor moves and carriage returns that a file keeps as garbage, so the log
gets whole lines instead, each saying what is true when it is printed:

* ``step 2/5  train  rollouts 8/8 ...``: the status line, when the step or the phase changes;
* ``heartbeat 3m10s  step 2/5  rollout  rollouts 5/8 (in flight 3) ...``: the same status with the counts of
  the moment, when nothing else was printed for ``log.heartbeat_s`` (a long rollout phase is not silence);
* ``step 2/5 done  rollouts 8 (admitted 8) ...``: one summary per finished step, read back from the row the
  step wrote to ``metrics.jsonl`` (reward, solve rate, tokens, the time split), so the log says what the run
  recorded; SFT: the step's loss, on the step that computed it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from rich.text import Text

from lego_rl.runstore import JsonlFollower, StepMetrics, follow_metrics
from lego_rl.runstore import metric_catalog as mc


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def num(value: float | None, fmt: str = ".3f") -> str:
    return "-" if value is None else format(value, fmt)


def _count(value: float | None) -> str:
    return "-" if value is None else f"{int(value):,}"


def step_summary(row: StepMetrics, total_steps: int, *, sft: bool) -> str:
    """One line for a finished step, from its metrics row (what the run recorded, not a live guess)."""
    v = row.values
    head = f"{'SFT ' if sft else ''}step {row.step + 1}/{total_steps} done"
    if sft:
        return (f"{head}  loss {num(mc.read(v, mc.LOSS))}  grad norm {num(mc.read(v, mc.GRAD_NORM))}  "
                f"demonstrations {_count(mc.read(v, mc.DEMONSTRATIONS))}  tokens {_count(mc.read(v, mc.TOKENS))}  "
                f"time {num(mc.read(v, mc.TIME_TRAIN_S), '.1f')}s")
    trained = "" if mc.read(v, mc.TRAINED) != 0.0 else "  (no signal: nothing trained)"
    return (f"{head}  rollouts {_count(mc.read(v, mc.ROLLOUTS))} (admitted {_count(mc.read(v, mc.ADMITTED_ROLLOUTS))}, "
            f"excluded {_count(mc.read(v, mc.EXCLUDED_ROLLOUTS))})  reward {num(mc.read(v, mc.REWARD_MEAN))}  "
            f"solved {num(mc.read(v, mc.SOLVE_RATE), '.0%')}  tokens sampled {_count(mc.read(v, mc.SAMPLED_TOKENS))}"
            f" trained {_count(mc.read(v, mc.TOKENS))}  time {num(mc.read(v, mc.TIME_STEP_S), '.1f')}s = rollout "
            f"{num(mc.read(v, mc.TIME_ROLLOUT_S), '.1f')}s + train {num(mc.read(v, mc.TIME_TRAIN_S), '.1f')}s + "
            f"sync {num(mc.read(v, mc.TIME_SYNC_S), '.1f')}s{trained}")


class LineLog:
    """Whole lines for a stderr that is no terminal (see the module docstring). ``show`` is called on every
    poll with the current status line and its (step, phase); ``emit`` prints one line."""

    def __init__(self, metrics: Path, *, every_s: float, total_steps: int, sft: bool,
                 emit: Callable[[str], None], clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self.total_steps = total_steps
        self.sft = sft
        self.emit = emit
        self.clock = clock
        self._rows: JsonlFollower[StepMetrics] = follow_metrics(metrics)
        for _ in self._rows.read():  # rows of earlier launches (a resume) were summarised then
            pass
        self._last: tuple[int, str] | None = None
        self._started = clock()
        self._printed = self._started

    def show(self, status: Text | None, at: tuple[int, str] | None) -> None:
        for row in self._rows.read():
            self._print(step_summary(row, self.total_steps, sft=self.sft))
        now = self.clock()
        if status is None or at is None:
            if now - self._printed >= self.every_s:
                self._print(f"heartbeat {duration(now - self._started)}  starting: the engine and the trainer load")
            return
        if at != self._last:
            self._last = at
            self._print(status.plain)
        elif now - self._printed >= self.every_s:
            self._print(f"heartbeat {duration(now - self._started)}  {status.plain}")

    def _print(self, line: str) -> None:
        self.emit(line)
        self._printed = self.clock()
