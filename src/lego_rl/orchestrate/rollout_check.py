"""``lego rollout-check``: generate() over a dataset with N samples per task, no trainer.

It is the first real job an operator runs: it proves the chain task row → CLI → adapter → engine →
patch → grader → samples works for these tasks, saves tokens, loss masks, logprobs and outcomes, and
succeeds only when at least one sample earned reward 1 (the reference example's contract).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lego_rl.config.resolve import ResolvedConfig
from lego_rl.harness.toolchain import Toolchain
from lego_rl.rollout.generate import RolloutContext, RolloutResult, RolloutSettings, RolloutSpec, generate
from lego_rl.rollout.harnesses import harness_factory
from lego_rl.rollout.rundir import RunDir, write_new
from lego_rl.rollout.stack import Stack
from lego_rl.sandbox.base import ImageSpec
from lego_rl.tasks.model import TaskRow
from lego_rl.trajectory.manager import TrajectoryOptions
from lego_rl.trajectory.sample import save_samples

ProgressFn = Callable[[str, RolloutSpec, RolloutResult | None], None]
"""Called with ``("started", spec, None)`` and ``("finished", spec, result)``."""


def settings_from_config(r: ResolvedConfig) -> RolloutSettings:
    c = r.config
    return RolloutSettings(
        provider=c.sandbox.provider, grader_provider=c.grader.provider,
        provider_options=provider_options(r, c.sandbox.provider),
        grader_provider_options=provider_options(r, c.grader.provider or c.sandbox.provider),
        sandbox_options={"memory_mb": c.sandbox.memory_mb, "network": c.sandbox.network},
        default_harness=c.agent.default_harness, agent_time_budget_s=c.agent.time_budget_s,
        grader_timeout_s=c.grader.timeout_s, guard_s=c.rollout.guard_s or 0.0, max_turns=c.agent.max_turns,
        max_context_tokens=c.model.max_context_len, max_output_tokens=c.model.max_response_len,
        max_requests_per_session=c.adapter.max_requests_per_session, prompt_template=c.agent.prompt,
        model_name=c.model.served_name,
        trajectory=TrajectoryOptions(fork_merge_max_response_tokens=c.rollout.fork_merge_max_response_tokens),
    )


def provider_options(r: ResolvedConfig, provider: str) -> dict[str, object]:
    """Constructor options of ``provider`` from the config (only the providers that take them)."""
    c = r.config
    if provider == "sunabako":
        opts: dict[str, object] = {"allow_test_memory": bool(c.sandbox.allow_test_memory)}
        if c.sandbox.cluster:
            opts["cluster"] = c.sandbox.cluster
        return opts
    if provider == "e2b" and c.sandbox.e2b_api_key is not None:
        return {"api_key": c.sandbox.e2b_api_key.get_secret_value()}
    return {}


@dataclass
class CheckReport:
    results: list[RolloutResult] = field(default_factory=list)

    @property
    def rewarded(self) -> int:
        return sum(1 for r in self.results if r.reward is not None and r.reward >= 1.0)

    @property
    def terminations(self) -> Counter[str]:
        return Counter(r.termination.value for r in self.results)


def plan(rows: Sequence[TaskRow], samples_per_task: int, harness: str | None) -> list[RolloutSpec]:
    """One spec per (task, sample); group_index is the task's position, index the sample number."""
    specs = []
    for g, row in enumerate(rows):
        if harness:
            row = row.model_copy(update={"metadata": row.metadata.model_copy(update={"agent": harness})})
        for i in range(samples_per_task):
            specs.append(RolloutSpec(row=row, rollout_id=f"{row.metadata.instance_id}-s{i}", group_index=g, index=i))
    return specs


async def run_rollout_check(
    r: ResolvedConfig,
    stack: Stack,
    run: RunDir,
    rows: Sequence[TaskRow],
    *,
    samples_per_task: int,
    dataset_dir: Path | None,
    images: dict[str, ImageSpec] | None,
    harness: str | None = None,
    concurrency: int = 4,
    progress: ProgressFn | None = None,
) -> CheckReport:
    ctx = RolloutContext(
        settings=settings_from_config(r), run=run, sessions=stack.sessions, adapter_url=stack.adapter_url,
        harness_for=harness_factory(r), toolchain=Toolchain(Path(r.config.paths.toolchain_dir or "")),
        images=images, dataset_dir=dataset_dir, boot=asyncio.Semaphore(r.config.sandbox.boot_concurrency),
    )
    ctx.settings.template_kwargs = dict(r.config.model.chat_template_kwargs)
    report = CheckReport()
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(spec: RolloutSpec) -> None:
        async with gate:
            if progress:
                progress("started", spec, None)
            result = await generate(ctx, spec)
            report.results.append(result)
            if progress:
                progress("finished", spec, result)

    await asyncio.gather(*(one(spec) for spec in plan(rows, samples_per_task, harness)))
    report.results.sort(key=lambda res: (res.group_index, res.index))
    return report


def save_report(report: CheckReport, output: Path) -> Path:
    """Write every sample (tokens, loss masks, logprobs) and per-rollout outcomes under ``output``."""
    output.mkdir(parents=True, exist_ok=True)
    samples = [s for res in report.results for s in res.samples]
    if samples:
        save_samples(samples, output / "samples.jsonl")
    write_new(output / "outcomes.jsonl", "".join(json.dumps(res.summary()) + "\n" for res in report.results))
    return output
