"""Two runs side by side: curves aligned by step, per-task solve-rate deltas (B - A) for tasks both ran.

A task's solve rate is estimated from however many rollouts each run gave it, so a delta is an observed
change, not a measure of learning or forgetting (with 8 samples a task moves in steps of 0.125).
"""

from __future__ import annotations

from pydantic import BaseModel

from lego_rl.monitor.snapshot import Point, overview, quantile
from lego_rl.monitor.state import RunState


class TaskDelta(BaseModel):
    instance_id: str
    a: float
    b: float
    delta: float


class Comparison(BaseModel):
    a: str
    b: str
    reward_a: list[Point]
    reward_b: list[Point]
    solve_a: list[Point]
    solve_b: list[Point]
    deltas: list[TaskDelta]
    """Largest changes first."""
    up: int
    down: int
    median_up: float | None
    median_down: float | None


def compare(a: RunState, b: RunState, now: float) -> Comparison:
    oa, ob = overview(a, now), overview(b, now)
    deltas = []
    for task_id, ta in a.tasks.items():
        tb = b.tasks.get(task_id)
        if tb is None or ta.solve_rate is None or tb.solve_rate is None:
            continue
        deltas.append(
            TaskDelta(
                instance_id=task_id, a=ta.solve_rate, b=tb.solve_rate, delta=tb.solve_rate - ta.solve_rate
            )
        )
    deltas.sort(key=lambda d: (-abs(d.delta), d.instance_id))
    ups = sorted(d.delta for d in deltas if d.delta > 0)
    downs = sorted(d.delta for d in deltas if d.delta < 0)
    return Comparison(
        a=str(a.root),
        b=str(b.root),
        reward_a=oa.reward,
        reward_b=ob.reward,
        solve_a=oa.solve_rate,
        solve_b=ob.solve_rate,
        deltas=deltas,
        up=len(ups),
        down=len(downs),
        median_up=quantile(ups, 0.5) if ups else None,
        median_down=quantile(downs, 0.5) if downs else None,
    )
