"""Which tasks still carry a learning signal during training: zero-variance groups per task.

A GRPO group whose admitted rewards are all equal has zero advantage: the task taught nothing that step.
One such group says little (the policy may be lucky); a run of them says the task stopped carrying
signal, typically because the policy now always solves it. ``TaskSignal`` counts, per task, its
*consecutive* zero-variance groups (a group with reward variance resets the count; a group with fewer than
two admitted rollouts says nothing and leaves it), and with ``train.retire_zero_variance_after = N`` retires
a task after N in a row: the prompt stream stops drawing it. The last task still drawn is never retired
(a step always has a prompt to draw).

The counts go in each step's metrics row (``StepMetrics.zero_variance_tasks``, ``retired_tasks``) and in
the checkpoint's loop state, so a resumed run retires on the same counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from lego_rl.driver.scheduler import Group, uniform_reward
from lego_rl.runstore.checkpoint_state import TaskSignalState
from lego_rl.train.advantages import AdmissionPolicy


class TaskSignal:
    """Consecutive zero-variance groups per task, and the tasks retired for them."""

    def __init__(self, task_ids: Sequence[str], *, retire_after: int = 0) -> None:
        if retire_after < 0:
            raise ValueError(f"retire_after must be >= 0 (0: never retire), got {retire_after}")
        self.task_ids = list(dict.fromkeys(task_ids))
        self.retire_after = retire_after
        self.streaks: dict[str, int] = {}
        """Task id -> its zero-variance groups in a row so far (absent: 0)."""
        self.retired: list[str] = []
        """Retired task ids, in the order they were retired."""

    def observe(self, groups: Iterable[Group], admission: AdmissionPolicy) -> tuple[dict[str, int], list[str]]:
        """Count one step's groups, in order. Returns the tasks whose group had zero variance (with their
        streak after it) and the tasks retired by this step."""
        zero: dict[str, int] = {}
        retired_now: list[str] = []
        for g in groups:
            iid = g.prompt.id
            admitted = [r for r in g.results if r.termination not in admission.excluded]
            if len(admitted) < 2:
                continue  # one rollout or none: no evidence either way
            if uniform_reward(g.results, admission) is None:
                self.streaks.pop(iid, None)
                zero.pop(iid, None)
                continue
            self.streaks[iid] = zero[iid] = self.streaks.get(iid, 0) + 1
            if self.retire_after and zero[iid] >= self.retire_after and iid not in self.retired:
                if len(self.task_ids) - len(self.retired) > 1:  # keep one task to draw
                    self.retired.append(iid)
                    retired_now.append(iid)
        return zero, retired_now

    def state(self) -> TaskSignalState:
        """What a checkpoint keeps."""
        return TaskSignalState(streaks=dict(self.streaks), retired=list(self.retired))

    def load(self, state: TaskSignalState | None) -> None:
        """Restore ``state()`` (None: a checkpoint written before tasks were tracked)."""
        state = state or TaskSignalState()
        self.streaks = dict(state.streaks)
        self.retired = list(state.retired)
