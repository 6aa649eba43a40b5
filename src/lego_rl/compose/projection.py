"""The config projected into the typed settings of the rooms below ``compose``: each function here reads
``LegoConfig`` once and returns what one part needs, so no part below reads the config (import contracts in
pyproject.toml keep it so). A new config key that a part uses is added to that part's settings type and
set here; its one default is the config schema's.

The serving stack reads its keys in ``compose.stack``, rollouts theirs in
``compose.rollout_check.settings_from_config``, the trainer backends and the loss theirs in
``compose.train_session`` (``loss_config``, ``torch_settings``, ``megatron_settings``); the metrics sinks
``log.*`` (``metrics_sinks``).
"""

from __future__ import annotations

from lego_rl.config.schema import LegoConfig
from lego_rl.driver.loop import LoopSettings
from lego_rl.driver.metrics_sink import RowSink, Sinks, TensorBoardSink
from lego_rl.driver.sft import SftSettings
from lego_rl.driver.wandb_sink import WandbSettings, WandbSink
from lego_rl.runstore import RunLayout


def loop_settings(c: LegoConfig) -> LoopSettings:
    """What ``driver.loop.TrainLoop`` (and its scheduler) reads: ``rollout.*`` sampling and slot keys,
    ``train.*`` step, refill, checkpoint and evaluation keys."""
    r = c.rollout
    t = c.train
    return LoopSettings(
        num_rollout=t.num_rollout, batch_size=r.batch_size, samples_per_prompt=r.samples_per_prompt,
        micro_batch_tokens=t.micro_batch_tokens, concurrency=r.concurrency, max_staleness=r.max_staleness,
        global_batch_size=t.global_batch_size, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
        partial_rollouts=r.partial_rollouts, max_refills=t.max_refills,
        oversample_zero_variance=t.oversample_zero_variance, retire_zero_variance_after=t.retire_zero_variance_after,
        checkpoint_every=t.checkpoint_every, eval_every=t.eval_every, eval_samples=t.eval_samples,
        infra_failure_policy=t.infra_failure_policy, seed=t.seed, control=t.control,
    )


def sft_settings(c: LegoConfig) -> SftSettings:
    """What ``driver.sft.SftRunner`` reads: ``train.sft_*`` and the shared step keys."""
    t = c.train
    return SftSettings(steps=t.sft_steps, batch_size=t.sft_batch_size, micro_batch_tokens=t.micro_batch_tokens,
                       checkpoint_every=t.checkpoint_every, seed=t.seed)


def metrics_sinks(c: LegoConfig, layout: RunLayout) -> Sinks:
    """The sinks ``log.*`` asks for, each checked now (a missing package is a ``ConfigError`` before the run
    directory exists, so it starts nothing)."""
    lg = c.log
    sinks: list[RowSink] = []
    if lg.tensorboard:
        sinks.append(TensorBoardSink(layout))
    if lg.wandb:
        sinks.append(WandbSink(layout, WandbSettings(
            project=lg.wandb_project, mode=lg.wandb_mode, name=lg.wandb_name, group=lg.wandb_group,
            entity=lg.wandb_entity, tags=list(lg.wandb_tags), config=c.model_dump(mode="json"))))
    return Sinks(sinks)
