"""What a resume may not change silently: the keys that shape training, and their changes against the run.

A resume continues a run: its checkpoint holds the weights, the optimizer and scheduler state and the data
cursor that the recorded config produced. A key below changes what the resumed steps optimize, on what data,
or how they are scored; changing one on resume would make the run's record (its config files) and its
training disagree, or silently splice two experiments into one curve. So ``config/checks.resume_changes``
refuses a change of any of them unless the operator names it (``lego train --resume --override KEY``,
``train.resume_override``); then the new value takes effect (the torch backend re-applies the optimizer keys
over the restored state, ``train.step.rebase_optimizer``), the new config file records it, and a
``resume_override`` event marks the first step it applies to.

Keys not listed (parallelism, serving, sandbox, checkpoint cadence, evaluation, monitoring, paths) change how
or where the run executes, not what it learns, and may change freely on resume.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SHAPING_KEYS: dict[str, str] = {
    # The objective and the optimizer: what each update does.
    **{f"train.{k}": "the loss or the optimizer update" for k in (
        "algorithm", "lr", "warmup_steps", "max_grad_norm", "weight_decay", "precision", "global_batch_size",
        "dual_clip_c", "is_correction", "is_level", "is_low", "is_high", "kl_coef", "clip_low", "clip_high",
        "use_score_centering", "loss_agg", "infra_failure_policy", "seed", "sft_batch_size", "true_on_policy")},
    # The policy: which model, and what it may see and say.
    **{f"model.{k}": "the policy (its base model, context or output)" for k in (
        "checkpoint", "max_context_tokens", "max_response_tokens", "chat_template_kwargs", "reasoning_effort",
        "dtype")},
    # The data and the environment: what the steps train on.
    "rollout.prompt_data": "the dataset the steps draw from",
    "rollout.input_key": "the dataset the steps draw from",
    "rollout.label_key": "the dataset the steps draw from",
    "rollout.metadata_key": "the dataset the steps draw from",
    "train.sft_data": "the dataset the steps draw from",
    "train.environment": "the environment (its prompts and its reward)",
    "train.environment_options": "the environment (its prompts and its reward)",
    "train.control": "whether the run is a control arm (a control spliced onto training is neither)",
    # The rollouts and their reward: what a group's advantages mean.
    **{f"rollout.{k}": "how rollouts are sampled (the groups the advantages compare)" for k in (
        "batch_size", "samples_per_prompt", "temperature", "top_p", "top_k", "capture_nucleus", "max_staleness",
        "partial_rollouts", "fork_merge_max_response_tokens")},
    **{f"agent.{k}": "the agent's task and limits (the reward)" for k in (
        "default_harness", "prompt", "max_turns", "time_budget_s")},
    "grader.suspect_policy": "the reward",
}
"""Every key that shapes training, with why: a resume refuses a change of any of them unless overridden."""


@dataclass(frozen=True)
class Change:
    """One shaping key whose value differs from the run's newest recorded launch."""

    key: str
    before: Any
    after: Any
    recorded_in: str
    """The config file the old value comes from (``config.json`` or ``config.resume-N.json``)."""


def newest_config(root: Path) -> Path | None:
    """The config file of the run's newest launch in ``root`` (the first run or its latest resume)."""
    resumes = [(int(m.group(1)), p) for p in root.glob("config.resume-*.json")
               if (m := re.fullmatch(r"config\.resume-(\d+)\.json", p.name))]
    if resumes:
        return max(resumes)[1]
    first = root / "config.json"
    return first if first.exists() else None


def _plain(value: Any) -> Any:
    """A value as the run's config file holds it (JSON, ``default=str``)."""
    return json.loads(json.dumps(value, default=str))


def shaping_changes(recorded: dict[str, Any], current: dict[str, Any], *, recorded_in: str) -> list[Change]:
    """The shaping keys whose value in ``current`` differs from ``recorded`` (both ``config_json`` shaped:
    ``{section: {key: {"value", "source"}}}``). A key the recorded file lacks (written by an older version)
    is not a change."""
    changes = []
    for dotted in SHAPING_KEYS:
        section, key = dotted.split(".", 1)
        old = recorded.get(section, {}).get(key)
        new = current.get(section, {}).get(key)
        if not isinstance(old, dict) or "value" not in old or new is None:
            continue
        if _plain(old["value"]) != _plain(new["value"]):
            changes.append(Change(dotted, _plain(old["value"]), _plain(new["value"]), recorded_in))
    return changes


def changes_on_resume(root: Path, current: dict[str, Any]) -> list[Change]:
    """The shaping keys ``current`` (``config_json``) changes against the newest launch recorded in ``root``."""
    path = newest_config(root)
    if path is None:
        return []
    return shaping_changes(json.loads(path.read_text()), current, recorded_in=path.name)
