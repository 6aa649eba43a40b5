"""Per-step metrics rows: what the trainer writes to ``metrics.jsonl`` after each optimizer step.

One row per step: when it ran, named scalar values (loss, reward mean, KL, throughput... the trainer
chooses the names) and how many of the step's rollouts ended for each termination reason, so the monitor
can chart infrastructure failures next to the policy's outcomes without reading every rollout.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lego_rl.termination import TerminationReason


class StepMetrics(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    step: int = Field(ge=0)
    """Optimizer step, counted from 0; resume continues the count."""
    started_at: float
    """Unix seconds when the step's first rollout was scheduled."""
    finished_at: float
    """Unix seconds when the optimizer step (and weight sync) ended."""
    values: dict[str, float] = Field(default_factory=dict)
    """Named scalars, finite only (a NaN loss is an error to report, not a point to plot)."""
    terminations: dict[TerminationReason, int] = Field(default_factory=dict)
    """Rollouts of this step per termination reason."""
    zero_variance_tasks: dict[str, int] = Field(default_factory=dict)
    """Tasks whose group this step had zero reward variance (no GRPO signal), each with its zero-variance
    groups in a row so far (``driver.task_signal``); a task absent had signal or no group."""
    retired_tasks: list[str] = Field(default_factory=list)
    """Tasks retired at this step (``train.retire_zero_variance_after``): never drawn again."""

    @field_validator("values")
    @classmethod
    def _finite(cls, values: dict[str, float]) -> dict[str, float]:
        bad = {k: v for k, v in values.items() if not math.isfinite(v)}
        if bad:
            raise ValueError(f"metric values must be finite; got {bad}")
        return values

    @field_validator("terminations")
    @classmethod
    def _counts(cls, counts: dict[TerminationReason, int]) -> dict[TerminationReason, int]:
        bad = {k.value: v for k, v in counts.items() if v < 0}
        if bad:
            raise ValueError(f"termination counts must be >= 0; got {bad}")
        return counts

    @model_validator(mode="after")
    def _ordered(self) -> StepMetrics:
        if self.finished_at < self.started_at:
            raise ValueError(
                f"step {self.step} finished at {self.finished_at} before it started at {self.started_at}"
            )
        return self


def parse_metrics(line: str | bytes) -> StepMetrics:
    """One ``metrics.jsonl`` line as a row; ``pydantic.ValidationError`` when it is not one."""
    return StepMetrics.model_validate_json(line)
