"""``lego rollout-check``: generate() over a dataset with N samples per task, no trainer.

It is the first real job an operator runs: it proves the chain task row → CLI → adapter → engine →
patch → grader → samples works for these tasks, saves tokens, loss masks, logprobs and outcomes, and
succeeds only when at least one sample earned reward 1 (the reference example's contract).

``settings_from_config`` is the one projection of the resolved config into ``RolloutSettings``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lego_rl.config.resolve import ResolvedConfig
from lego_rl.harness.toolchain import Toolchain
from lego_rl.driver.runner import ProgressFn, RolloutRunner, plan
from lego_rl.rollout.generate import RolloutContext, RolloutResult
from lego_rl.compose.harnesses import harness_factory
from lego_rl.rollout.settings import RolloutSettings
from lego_rl.compose.stack import Stack
from lego_rl.runstore import RolloutFiles, RunDir, write_new
from lego_rl.sandbox.base import ImageSpec
from lego_rl.sandbox.egress import parse_allow, parse_endpoint, url_endpoint
from lego_rl.swe.task_sandbox import RunProviders, SandboxTarget
from lego_rl.tasks.model import TaskRow
from lego_rl.trajectory.manager import TrajectoryOptions
from lego_rl.trajectory.sample import save_samples


def settings_from_config(r: ResolvedConfig, adapter_url: str | None = None) -> RolloutSettings:
    """Everything a rollout reads from the config, read here once (``adapter_url``: where the CLI goes)."""
    c = r.config
    grader_provider = c.grader.provider or c.sandbox.provider
    return RolloutSettings(
        agent_sandbox=SandboxTarget(c.sandbox.provider, provider_options(r, c.sandbox.provider),
                                    agent_sandbox_options(r, adapter_url)),
        # The grader never needs a network: the tests run offline, and a patch must not fetch anything.
        grader_sandbox=SandboxTarget(grader_provider, provider_options(r, grader_provider),
                                     {"memory_mb": c.sandbox.memory_mb, "network": "none", **disk_cap(r)}),
        default_harness=c.agent.default_harness, agent_time_budget_s=c.agent.time_budget_s,
        grader_timeout_s=c.grader.timeout_s, guard_s=c.rollout.guard_s or 0.0, max_turns=c.agent.max_turns,
        max_context_tokens=c.model.max_context_tokens, max_response_tokens=c.model.max_response_tokens,
        max_requests_per_session=c.adapter.max_requests_per_session, prompt_template=c.agent.prompt,
        model_name=c.model.served_name, boot_concurrency=c.sandbox.boot_concurrency,
        suspect_policy=c.grader.suspect_policy,
        template_kwargs=dict(c.model.chat_template_kwargs),
        # What the adapter asks the engine for (nucleus spans, R3 routes) must be in every turn it records.
        trajectory=TrajectoryOptions(
            fork_merge_max_response_tokens=c.rollout.fork_merge_max_response_tokens,
            require_nucleus=c.rollout.capture_nucleus, require_routing=c.rollout.use_rollout_routing_replay,
        ),
    )


def agent_sandbox_options(r: ResolvedConfig, adapter_url: str | None) -> dict[str, object]:
    """Per-sandbox options of the agent's sandboxes: ``sandbox.network`` resolved (``auto`` -> ``adapter``
    where the adapter is local to the sandbox: bwrap, a sunabako node without cluster.json), and under
    ``adapter`` the provider's ``allowlist`` of the adapter's endpoint plus ``sandbox.network_allow``."""
    c = r.config
    mode = c.sandbox.network
    if mode == "auto":
        local = c.sandbox.provider == "bwrap" or (c.sandbox.provider == "sunabako" and not c.sandbox.cluster)
        mode = "adapter" if local else "host"
    if mode != "adapter":
        return {"memory_mb": c.sandbox.memory_mb, "network": mode, **disk_cap(r)}
    allow = [url_endpoint(adapter_url)] if adapter_url else []
    for entry in c.sandbox.network_allow:
        allow.append(parse_endpoint(entry, what="sandbox.network_allow entry"))
    return {"memory_mb": c.sandbox.memory_mb, "network": "allowlist", "allow": parse_allow(allow), **disk_cap(r)}


def disk_cap(r: ResolvedConfig) -> dict[str, object]:
    """``disk_mb`` for every sandbox when ``sandbox.disk_mb`` is set (bwrap only: `lego validate` refuses it for
    the other providers, which have no such option)."""
    disk = r.config.sandbox.disk_mb
    return {} if disk is None else {"disk_mb": disk}


def provider_options(r: ResolvedConfig, provider: str) -> dict[str, object]:
    """Constructor options of ``provider`` from the config (only the providers that take them; sunabako's
    options mean nothing to bwrap and are refused by it)."""
    c = r.config
    if provider == "sunabako":
        opts: dict[str, object] = {"allow_test_memory": bool(c.sandbox.allow_test_memory)}
        if c.sandbox.warm_pool:
            opts["warm_pool"] = c.sandbox.warm_pool
        if c.sandbox.cluster:
            opts["cluster"] = c.sandbox.cluster
            opts["ssh_port"] = c.cluster.ssh_port
            if c.cluster.ssh_config:
                opts["ssh_config"] = c.cluster.ssh_config
        else:
            opts["state_dir"] = c.sandbox.sunabako_state_dir
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
    async with RunProviders() as providers:  # one per run: the warm pool serves every rollout of it
        ctx = rollout_context(r, stack, run, dataset_dir=dataset_dir, images=images, providers=providers)
        runner = RolloutRunner(ctx, concurrency=concurrency)
        return CheckReport(await runner.run(plan(rows, samples_per_task, harness), progress))


def rollout_context(r: ResolvedConfig, stack: Stack, run: RunDir, *, dataset_dir: Path | None,
                    images: dict[str, ImageSpec] | None, providers: RunProviders | None = None) -> RolloutContext:
    """What every rollout of a run without a trainer shares (rollout-check, task screening); ``providers``:
    the run's shared sandbox providers (None: one provider per sandbox)."""
    return RolloutContext(
        settings=settings_from_config(r, stack.adapter_url), run=run, sessions=stack.sessions, adapter_url=stack.adapter_url,
        harness_for=harness_factory(r), toolchain=Toolchain(Path(r.config.paths.toolchain_dir or "")),
        images=images, dataset_dir=dataset_dir, providers=providers,
    )


def save_report(report: CheckReport, output: Path) -> Path:
    """Write every sample (tokens, loss masks, logprobs) and per-rollout outcomes under ``output``."""
    output.mkdir(parents=True, exist_ok=True)
    samples = [s for res in report.results for s in res.samples]
    if samples:
        save_samples(samples, output / RolloutFiles.SAMPLES)
    write_new(output / RolloutFiles.REPORT_OUTCOMES, "".join(json.dumps(res.summary()) + "\n" for res in report.results),
              what="rollout outcomes")
    return output
