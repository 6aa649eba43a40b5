"""Cross-parameter checks run by ``lego validate``.

Each check is a named pure-ish function of the resolved config returning ``Finding``s; all checks run and
all findings are collected, so the operator sees every problem at once. A message quotes the values
involved; ``fix`` names the key (or variable) to change. Checks that touch the network live in
``remote.py`` and run only with ``--remote``.

The config knows no harness plugin: what the harness checks need (installed names, options the plugins
refused) comes in as a ``HarnessInventory`` built by the caller (``lego_rl.compose.harnesses``).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lego_rl.config.dataset_scan import DatasetScan, scan_dataset
from lego_rl.config.findings import Finding, Severity, error, warning
from lego_rl.config.resolve import ResolvedConfig, did_you_mean, is_path_key, trainer_devices
from lego_rl.config.schema import HARNESS, SECTIONS
from lego_rl.config.unwired import UNWIRED
from lego_rl.errors import ConfigError

__all__ = ["CHECKS", "Finding", "HarnessInventory", "Severity", "error", "opens_sandboxes", "run_checks",
           "warning"]

Check = Callable[[ResolvedConfig], Iterator[Finding]]
CHECKS: list[Check] = []


def check(fn: Check) -> Check:
    CHECKS.append(fn)
    return fn


@dataclass(frozen=True)
class HarnessInventory:
    """What the caller found out about harness plugins (see ``lego_rl.compose.harnesses``)."""

    installed: frozenset[str]
    """Names of the installed harnesses."""
    load_error: str | None = None
    """Why the plugins could not be loaded at all (then ``installed`` is empty)."""
    option_errors: tuple[ConfigError, ...] = ()
    """One error per harness whose plugin refused its ``[harness.<name>]`` options."""


def opens_sandboxes(r: ResolvedConfig) -> bool:
    """Whether ``lego train`` with this config opens sandboxes and runs coding CLIs and graders in them. An
    environment (``train.environment``) samples and scores text in-process, and SFT (``train.sft_data``)
    trains on recorded demonstrations: neither opens one, so the checks of sandboxes, CLIs and graders
    (providers, memory, disk, time budgets, cluster.json, toolchain files) say nothing about such a run and
    are skipped."""
    t = r.config.train
    return not (t.environment or t.sft_data)


@check
def global_batch(r: ResolvedConfig) -> Iterator[Finding]:
    ro, tr = r.config.rollout, r.config.train
    produced = ro.batch_size * ro.samples_per_prompt
    gbs = tr.global_batch_size or produced
    if produced % gbs:
        yield error(
            "global_batch",
            f"train.global_batch_size={gbs} does not divide the {produced} samples of a rollout step "
            f"(rollout.batch_size={ro.batch_size} × rollout.samples_per_prompt={ro.samples_per_prompt})",
            f"set train.global_batch_size (GLOBAL_BATCH_SIZE) to a divisor of {produced}, or unset it",
            "train.global_batch_size", "rollout.batch_size", "rollout.samples_per_prompt",
        )


@check
def group_size(r: ResolvedConfig) -> Iterator[Finding]:
    n = r.config.rollout.samples_per_prompt
    if n == 1:
        yield warning(
            "group_size_one",
            "rollout.samples_per_prompt=1: every GRPO group holds one rollout, so every advantage is zero "
            "and training learns nothing",
            "set rollout.samples_per_prompt (SAMPLES_PER_PROMPT) to 2 or more (8 is common)",
            "rollout.samples_per_prompt",
        )


def _default(section: str, key: str) -> Any:
    info = SECTIONS[section].model_fields[key]
    return info.get_default(call_default_factory=True)


@check
def not_implemented(r: ResolvedConfig) -> Iterator[Finding]:
    """A key nothing reads yet (``unwired.UNWIRED``) set to anything but its default is refused."""
    for key, until in UNWIRED.items():
        section, field = key.split(".")
        value = getattr(getattr(r.config, section), field)
        default = _default(section, field)
        if not r.is_explicit(key) or value == default:
            continue
        shown = "**********" if hasattr(value, "get_secret_value") else json.dumps(value, default=str)
        yield error(
            "not_implemented",
            f"not implemented yet: {key} = {shown} (from {r.source(key)}) — it has no effect until {until}",
            f"remove it, or set it back to its default {json.dumps(default, default=str)}", key,
        )


@check
def cluster_mode(r: ResolvedConfig) -> Iterator[Finding]:
    """Ray mode places the trainer ranks and embedded-engine replicas: a setting it would override is refused."""
    c = r.config
    if c.cluster.mode != "ray":
        return
    if c.serving.backend != "embedded":
        yield error("cluster_serving", f"cluster.mode = \"ray\" places embedded-engine replicas (cluster.engine_replicas), "
                    f"but serving.backend = {c.serving.backend!r} names engines started elsewhere",
                    "set serving.backend = \"embedded\", or cluster.mode = \"local\" to train against the vLLM URLs",
                    "cluster.mode", "serving.backend")
    cl = c.cluster
    if cl.train_workers and not cl.train_head:
        yield error("cluster_train_head", f"cluster.train_workers = {cl.train_workers} without cluster.train_head: "
                    "the workers join the head's Ray cluster", "set cluster.train_head (TRAIN_HEAD) to the first "
                    "training node", "cluster.train_head", "cluster.train_workers")
    if cl.start_ray and cl.train_head and cl.ray_address:
        yield error("cluster_ray_conflict", f"cluster.start_ray = true with cluster.train_head = {cl.train_head!r} "
                    f"starts a new Ray cluster there, but cluster.ray_address = {cl.ray_address!r} names one to join",
                    "unset cluster.ray_address to start Ray on the training nodes, or set cluster.start_ray = false "
                    "to join the running cluster", "cluster.ray_address", "cluster.start_ray", "cluster.train_head")


@check
def parallelism(r: ResolvedConfig) -> Iterator[Finding]:
    tr, cl = r.config.train, r.config.cluster
    devices = trainer_devices(r.config)
    dp = tr.data_parallel or 1
    total = tr.tensor_parallel * tr.pipeline_parallel * dp
    if total != devices:
        yield error(
            "parallelism",
            f"TP×PP×DP = {tr.tensor_parallel}×{tr.pipeline_parallel}×{dp} = {total} but the trainer has "
            f"{devices} device(s) (cluster.trainer_nodes={cl.trainer_nodes} × cluster.gpus_per_node={cl.gpus_per_node})",
            "change train.tensor_parallel / train.pipeline_parallel / train.data_parallel or the cluster size",
            "train.tensor_parallel", "train.pipeline_parallel", "train.data_parallel", "cluster.gpus_per_node",
        )
    if tr.backend == "torch" and (tr.tensor_parallel > 1 or tr.pipeline_parallel > 1):
        yield error(
            "parallelism_backend",
            f"the torch backend has no model parallelism (TP={tr.tensor_parallel}, PP={tr.pipeline_parallel})",
            "set train.backend = \"megatron\" or TP = PP = 1", "train.backend",
        )
    layers = (_checkpoint_config(r) or {}).get("num_hidden_layers")
    if tr.backend == "megatron" and isinstance(layers, int) and layers % tr.pipeline_parallel:
        yield error(
            "parallelism_pipeline",
            f"train.pipeline_parallel = {tr.pipeline_parallel} does not divide the model's {layers} layers "
            f"(num_hidden_layers in {r.config.model.checkpoint}/config.json): every pipeline stage holds the same "
            "number of layers",
            f"set train.pipeline_parallel to a divisor of {layers}", "train.pipeline_parallel",
        )
    if tr.backend == "megatron" and tr.tensor_parallel > 1 and not tr.sequence_parallel and is_moe(r):
        yield error(
            "parallelism_moe_tp",
            f"train.tensor_parallel = {tr.tensor_parallel} with a mixture-of-experts model "
            f"({r.config.model.checkpoint}): megatron-core trains MoE layers under tensor parallelism only with "
            "sequence parallelism",
            "set train.sequence_parallel = true, or train.tensor_parallel = 1 and split the experts with "
            "train.expert_parallel",
            "train.tensor_parallel", "train.sequence_parallel",
        )
    if tr.sequence_parallel:
        yield from _sequence_parallelism(r)
    if tr.expert_parallel > 1:
        yield from _expert_parallelism(r, devices)
    if tr.backend == "megatron" and importlib.util.find_spec("megatron") is None:
        yield error(
            "backend_missing", "train.backend = \"megatron\" but megatron-core is not installed here",
            "pip install 'lego-rl[megatron]' (the megatron extra)", "train.backend",
        )


def _sequence_parallelism(r: ResolvedConfig) -> Iterator[Finding]:
    """``train.sequence_parallel``: the Megatron backend, TP > 1 (else it does nothing), one pipeline stage."""
    tr = r.config.train
    if tr.backend != "megatron":
        yield error("sequence_parallel_backend", f"train.sequence_parallel needs the Megatron backend; "
                    f"train.backend = {tr.backend!r} has no tensor parallelism to split the sequence over",
                    "set train.backend = \"megatron\" or train.sequence_parallel = false", "train.sequence_parallel",
                    "train.backend")
    elif tr.tensor_parallel == 1:
        yield warning("sequence_parallel_tp1", "train.sequence_parallel with train.tensor_parallel = 1 does "
                      "nothing: the sequence is split over the tensor-parallel ranks",
                      "set train.tensor_parallel > 1, or leave train.sequence_parallel = false",
                      "train.sequence_parallel", "train.tensor_parallel")
    if tr.pipeline_parallel > 1:
        yield error("sequence_parallel_pp", f"train.sequence_parallel with train.pipeline_parallel = "
                    f"{tr.pipeline_parallel} is not built (the pipeline schedule sends whole-sequence activations)",
                    "use one of the two: train.sequence_parallel = false or train.pipeline_parallel = 1",
                    "train.sequence_parallel", "train.pipeline_parallel")
    if tr.expert_parallel > 1 and tr.tensor_parallel > 1:
        yield error("sequence_parallel_ep", f"expert parallelism (train.expert_parallel = {tr.expert_parallel}) "
                    f"with tensor parallelism (train.tensor_parallel = {tr.tensor_parallel}) is not built",
                    "split a MoE model either by experts (train.expert_parallel, TP = 1) or by TP with "
                    "train.sequence_parallel, not both", "train.expert_parallel", "train.tensor_parallel")


def _expert_parallelism(r: ResolvedConfig, devices: int) -> Iterator[Finding]:
    """``train.expert_parallel`` > 1: the Megatron backend, a MoE model whose experts it divides, and a DP size it
    divides (the expert-parallel ranks are data-parallel ranks)."""
    tr = r.config.train
    ep = tr.expert_parallel
    if tr.backend != "megatron":
        yield error("expert_parallel_backend", f"train.expert_parallel = {ep} needs the Megatron backend; "
                    f"train.backend = {tr.backend!r} holds every expert on every rank",
                    "set train.backend = \"megatron\" or train.expert_parallel = 1", "train.expert_parallel",
                    "train.backend")
    if not is_moe(r):
        yield error("expert_parallel_dense", f"train.expert_parallel = {ep} but the model "
                    f"({r.config.model.checkpoint}) is not a mixture-of-experts model: there are no experts to split",
                    "set train.expert_parallel = 1, or model.moe = true if detection is wrong",
                    "train.expert_parallel")
    experts = next((n for k in ("num_experts", "num_local_experts")
                    if isinstance(n := (_checkpoint_config(r) or {}).get(k), int) and n > 1), None)
    if experts is not None and experts % ep:
        yield error("expert_parallel_experts", f"train.expert_parallel = {ep} does not divide the model's {experts} "
                    f"experts (num_experts in {r.config.model.checkpoint}/config.json): every rank holds as many",
                    f"set train.expert_parallel to a divisor of {experts}", "train.expert_parallel")
    dp = tr.data_parallel or max(1, devices // (tr.tensor_parallel * tr.pipeline_parallel))
    if dp % ep:
        yield error("expert_parallel_dp", f"train.expert_parallel = {ep} does not divide the data-parallel size "
                    f"{dp}: the expert-parallel ranks are data-parallel ranks",
                    f"set train.expert_parallel to a divisor of {dp}, or train.data_parallel / the trainer GPUs to "
                    f"a multiple of {ep}",
                    "train.expert_parallel", "train.data_parallel")


@check
def response_fits_context(r: ResolvedConfig) -> Iterator[Finding]:
    m = r.config.model
    if m.max_response_tokens > m.max_context_tokens:
        yield error(
            "response_len",
            f"model.max_response_tokens={m.max_response_tokens} exceeds model.max_context_tokens={m.max_context_tokens}",
            "lower MAX_RESPONSE_LEN or raise MAX_CONTEXT_LEN", "model.max_response_tokens", "model.max_context_tokens",
        )


@check
def timeouts(r: ResolvedConfig) -> Iterator[Finding]:
    """The rollout's guard outlives the agent's budget plus grading, and sandboxes outlive the guard: agent
    rollouts only (``opens_sandboxes``)."""
    if not opens_sandboxes(r):
        return
    c = r.config
    need = c.agent.time_budget_s + c.grader.timeout_s + c.rollout.guard_slack_s
    guard = c.rollout.guard_s or need
    if guard < need:
        yield error(
            "timeouts_guard",
            f"rollout.guard_s={guard:g} is shorter than agent.time_budget_s={c.agent.time_budget_s:g} + "
            f"grader.timeout_s={c.grader.timeout_s:g} + rollout.guard_slack_s={c.rollout.guard_slack_s:g} = {need:g}",
            f"raise SWE_ROLLOUT_GUARD_SEC to at least {need:g} or unset it", "rollout.guard_s",
        )
    lifetime = c.sandbox.lifetime_s
    if lifetime is not None and lifetime <= guard:
        yield error(
            "timeouts_lifetime",
            f"sandbox.lifetime_s={lifetime:g} does not outlive rollout.guard_s={guard:g}: sandboxes would die "
            "before the rollout's own deadline",
            f"set sandbox.lifetime_s above {guard:g} or unset it", "sandbox.lifetime_s", "rollout.guard_s",
        )


@check
def sampling(r: ResolvedConfig) -> Iterator[Finding]:
    ro = r.config.rollout
    if ro.temperature < 0 or ro.temperature > 10:
        yield error("temperature", f"rollout.temperature={ro.temperature} is outside [0, 10]",
                    "set rollout.temperature to e.g. 1.0", "rollout.temperature")
    elif ro.temperature == 0:
        yield warning("temperature_greedy", "rollout.temperature=0 samples greedily: every group is uniform and "
                      "GRPO advantages are zero", "use temperature 1.0 for training", "rollout.temperature")
    if not 0 < ro.top_p <= 1:
        yield error("top_p", f"rollout.top_p={ro.top_p} is outside (0, 1]", "set rollout.top_p to e.g. 0.95",
                    "rollout.top_p")
    if ro.top_k != -1 and ro.top_k < 1:
        yield error("top_k", f"rollout.top_k={ro.top_k}: use -1 to disable or a positive k",
                    "set rollout.top_k = -1", "rollout.top_k")


@check
def objective(r: ResolvedConfig) -> Iterator[Finding]:
    """Combinations the policy loss refuses (train.losses.LossConfig), caught before anything starts."""
    t = r.config.train
    if t.algorithm == "gspo" and t.loss_agg == "token":
        yield error("loss_agg_gspo", "train.loss_agg = \"token\" weighs tokens, but train.algorithm = \"gspo\" has one "
                    "ratio per sequence", "set train.loss_agg = \"rollout\" (or train.algorithm = \"grpo\")",
                    "train.loss_agg", "train.algorithm")
    if t.algorithm == "gspo" and t.use_score_centering:
        yield error("score_centering_gspo", "train.use_score_centering is a token-level objective, but "
                    "train.algorithm = \"gspo\" is per sequence", "set train.algorithm = \"grpo\"",
                    "train.use_score_centering", "train.algorithm")


LONG_SEGMENT_TOKENS = 32768
"""From this segment length on, holding every layer's activations is a memory problem even for small models: a
0.6B Qwen3 needs more than an H200's 140 GiB at 64k tokens without checkpointing (benchmarks/RESULTS.md)."""


@check
def activation_memory(r: ResolvedConfig) -> Iterator[Finding]:
    """A long rollout is one micro-batch whatever train.micro_batch_tokens says: all its activations must fit."""
    longest = r.config.model.max_context_tokens
    if r.config.train.gradient_checkpointing is False and longest >= LONG_SEGMENT_TOKENS:
        yield warning(
            "activations_long_segment",
            f"train.gradient_checkpointing is off while model.max_context_tokens = {longest}: a segment is never "
            f"split, so one rollout of up to {longest} tokens is one micro-batch with every layer's activations "
            "held at once (a 0.6B Qwen3 at 64k tokens needs more than an H200's 140 GiB; 20 GiB with checkpointing)",
            "set train.gradient_checkpointing = true (or leave it unset: on by default), or a lower "
            "model.max_context_tokens",
            "train.gradient_checkpointing", "model.max_context_tokens",
        )


@check
def attention_precision(r: ResolvedConfig) -> Iterator[Finding]:
    """varlen attention is flash attention: it has no fp32 kernel, so an fp32 trainer cannot take it."""
    t = r.config.train
    if t.packed_attention == "varlen" and t.precision == "fp32":
        yield error(
            "varlen_fp32",
            "train.packed_attention = \"varlen\" with train.precision = \"fp32\": varlen attention is flash "
            "attention, which computes in bf16 or fp16 only",
            "set train.packed_attention = \"auto\" (fp32 then attends through SDPA) or \"sdpa\", or "
            "train.precision = \"bf16\"",
            "train.packed_attention", "train.precision",
        )


@check
def score_centering(r: ResolvedConfig) -> Iterator[Finding]:
    if r.config.train.use_score_centering and not r.config.rollout.capture_nucleus:
        yield error(
            "score_centering",
            "train.use_score_centering needs each token's nucleus probabilities, but rollout.capture_nucleus is off",
            "set rollout.capture_nucleus = true", "train.use_score_centering", "rollout.capture_nucleus",
        )
    if r.config.rollout.capture_nucleus and r.config.serving.backend == "vllm":
        # return_sampling_mask is lego's extension (serving.server); vLLM ignores it and the reply has no
        # nucleus, so every generate request would fail validation at the first rollout.
        yield error(
            "nucleus_unavailable",
            "rollout.capture_nucleus needs the engine to return each token's nucleus, which only lego's embedded "
            "engine does (serving.backend = \"vllm\" replies without it)"
            + ("; train.use_score_centering depends on it" if r.config.train.use_score_centering else ""),
            "set serving.backend = \"embedded\", or rollout.capture_nucleus = false and "
            "train.use_score_centering = false",
            "rollout.capture_nucleus", "serving.backend", "train.use_score_centering",
        )


@check
def off_policy_correction(r: ResolvedConfig) -> Iterator[Finding]:
    """The trainer's PPO ratio is taken against ``old_logprobs``, which it recomputes with the weights it
    holds at the step; a rollout sampled by an older policy is only reweighted towards its real sampler by
    TIS/MIS (``exp(old - rollout logprob)``). Without them its tokens train as if the current policy had
    sampled them: a bias that grows with the lag and the learning rate. Bounded (``max_staleness`` policies,
    the default 1) it is a warning, not an error: asynchronous training at staleness 1 is the default and
    the common trade. ``partial_rollouts = "keep"`` trains tokens of any age, and its contract is that each
    is corrected by its own sampling logprob: without a correction that promise is silently broken, so
    that is an error."""
    ro, tr = r.config.rollout, r.config.train
    if tr.is_correction != "none":
        return
    if ro.partial_rollouts == "keep":
        yield error(
            "off_policy_uncorrected",
            f"rollout.partial_rollouts=\"keep\" trains tokens sampled by policies older than "
            f"rollout.max_staleness={ro.max_staleness}, with no bound on their age, but train.is_correction="
            "\"none\" trains them as if the current policy had sampled them (keep relies on the correction)",
            "set train.is_correction = \"tis\" (or \"mis\"), or rollout.partial_rollouts = \"drop\"",
            "train.is_correction", "rollout.partial_rollouts", "rollout.max_staleness",
        )
    elif ro.max_staleness > 0:
        yield warning(
            "off_policy_uncorrected",
            f"rollout.max_staleness={ro.max_staleness} trains rollouts sampled up to {ro.max_staleness} "
            "policies ago, and train.is_correction=\"none\" trains their tokens as if the current policy had "
            "sampled them: the PPO ratio is against the trainer's own logprobs, so nothing corrects the lag "
            "(a bias that grows with the lag and the learning rate)",
            "set train.is_correction = \"tis\" (truncated importance weights, is_low/is_high) or \"mis\", or "
            "rollout.max_staleness = 0 (synchronous: on-policy, slower)",
            "train.is_correction", "rollout.max_staleness",
        )


@check
def logprob_convention(r: ResolvedConfig) -> Iterator[Finding]:
    """Rollout logprobs are of the top-k/top-p truncated, renormalised distribution (``serving.protocol``); the
    trainer matches them by applying the same truncation to its own logits, or by replaying the captured
    nucleus. In half precision the engine's and the trainer's logits differ by ~1e-2, enough to move the
    nucleus boundary, so without the captured nucleus the two renormalisations cannot agree."""
    ro, m = r.config.rollout, r.config.model
    truncated = ro.top_p < 1 or ro.top_k > 0
    half = m.dtype in ("bfloat16", "float16") or (m.dtype == "auto" and r.config.serving.device == "cuda")
    if truncated and ro.temperature > 0 and half and not ro.capture_nucleus:
        yield error(
            "logprob_convention",
            f"rollout.top_p={ro.top_p} / rollout.top_k={ro.top_k} truncate sampling, model.dtype={m.dtype} "
            f"(serving.device={r.config.serving.device}) is half precision and rollout.capture_nucleus is off: "
            "the trainer cannot reproduce the sampler's nucleus, so rollout and trainer logprobs cannot agree",
            "set rollout.capture_nucleus = true (the trainer replays it), or rollout.top_p = 1 and "
            "rollout.top_k = -1, or model.dtype = \"float32\"",
            "rollout.capture_nucleus", "rollout.top_p", "model.dtype",
        )


def _checkpoint_config(r: ResolvedConfig) -> dict[str, object] | None:
    ckpt = r.config.model.checkpoint
    if ckpt.startswith("lego:"):
        return None
    try:
        return json.loads((Path(ckpt) / "config.json").read_text())
    except (OSError, ValueError):
        return None


def is_moe(r: ResolvedConfig) -> bool:
    if r.config.model.moe is not None:
        return r.config.model.moe
    cfg = _checkpoint_config(r) or {}
    counts = (cfg.get(k) for k in ("num_experts", "num_local_experts", "n_routed_experts"))
    return any(isinstance(n, int) and n > 1 for n in counts)


@check
def routing_replay(r: ResolvedConfig) -> Iterator[Finding]:
    if r.config.rollout.use_rollout_routing_replay and not is_moe(r):
        yield error(
            "r3_dense",
            f"rollout.use_rollout_routing_replay (R3) is on but the model ({r.config.model.checkpoint}) is not "
            "a mixture-of-experts model: there are no routes to replay",
            "turn R3 off, or set model.moe = true if detection is wrong", "rollout.use_rollout_routing_replay",
        )


@check
def true_on_policy(r: ResolvedConfig) -> Iterator[Finding]:
    """train.true_on_policy: combinations whose logprobs cannot be bit-identical between engine and trainer."""
    c = r.config
    if not c.train.true_on_policy:
        return
    keys = ("train.true_on_policy",)
    if c.serving.backend != "embedded":
        yield error("true_on_policy_vllm", f"train.true_on_policy with serving.backend = \"{c.serving.backend}\": "
                    "vLLM samples with its own kernels, which the trainer does not run (vLLM's batch-invariant "
                    "mode makes vLLM agree with itself, not with this trainer: docs/training.md)",
                    "set serving.backend = \"embedded\", or train.true_on_policy = false", *keys, "serving.backend")
    if c.train.backend != "torch":
        yield error("true_on_policy_backend", f"train.true_on_policy with train.backend = \"{c.train.backend}\": only "
                    "the torch backend runs the engine's batch-invariant ops", "set train.backend = \"torch\"", *keys,
                    "train.backend")
    devices = trainer_devices(c)
    if devices > 1 or c.cluster.mode == "ray":
        yield error("true_on_policy_world", f"train.true_on_policy with {devices} trainer device(s) "
                    f"(cluster.mode = \"{c.cluster.mode}\"): it runs one trainer process beside one embedded engine",
                    "one trainer GPU and cluster.mode = \"local\", or train.true_on_policy = false", *keys,
                    "cluster.mode")
    ro = c.rollout
    if ro.top_p < 1.0 or ro.top_k > 0:
        yield error("true_on_policy_truncation", f"train.true_on_policy with rollout.top_p = {ro.top_p}, "
                    f"rollout.top_k = {ro.top_k}: the engine renormalises a truncated distribution with a second "
                    "log-softmax and the trainer over the nucleus with a log-sum-exp (captured or recomputed), two "
                    "different roundings", "set rollout.top_p = 1.0 and rollout.top_k = -1", *keys, "rollout.top_p",
                    "rollout.top_k")
    if ro.use_rollout_routing_replay or is_moe(r):
        yield error("true_on_policy_moe", "train.true_on_policy with a mixture-of-experts model: the engine's "
                    "invariant path runs dense Llama-family models only", "train a dense model", *keys)
    if c.serving.precision == "weights":
        yield error("true_on_policy_precision", "train.true_on_policy with serving.precision = \"weights\": the engine "
                    "must compute in the trainer's recipe (fp32 weights, bf16 compute on CUDA)",
                    "set serving.precision = \"trainer\" (or \"auto\")", *keys, "serving.precision")
    if c.train.precision == "fp32" and c.serving.device != "cpu":
        yield error("true_on_policy_fp32", "train.true_on_policy with train.precision = \"fp32\": its CUDA kernels "
                    "compute in bf16 (CPU computes in fp32 either way)", "set train.precision = \"bf16\"", *keys,
                    "train.precision")
    if c.train.packed_attention != "auto":
        yield error("true_on_policy_attention", f"train.packed_attention = \"{c.train.packed_attention}\" is not used "
                    "under train.true_on_policy (attention is the engine's batch-invariant kernel)",
                    "leave train.packed_attention = \"auto\"", *keys, "train.packed_attention")


@check
def parsers(r: ResolvedConfig) -> Iterator[Finding]:
    """Parser names are vLLM's; a name only vLLM has runs only where vLLM is importable in lego's process
    (the adapter parses there), else the built-ins read the turns (``lego_rl.chat.turn_parser``)."""
    # Imported here: loading the config loads nothing of the engine's side (tests/config/test_resolve.py).
    from lego_rl.chat.parser_names import (
        BUILTIN_REASONING_PARSERS,
        BUILTIN_TOOL_CALL_PARSERS,
        KNOWN_REASONING_PARSERS,
        KNOWN_TOOL_CALL_PARSERS,
        VLLM_VERSION,
        vllm_importable,
    )

    s = r.config.serving
    with_vllm: bool | None = None
    for key, code, name, known, builtin in (
        ("tool_call_parser", "tool_parser", s.tool_call_parser, KNOWN_TOOL_CALL_PARSERS, BUILTIN_TOOL_CALL_PARSERS),
        ("reasoning_parser", "reasoning_parser", s.reasoning_parser, KNOWN_REASONING_PARSERS,
         BUILTIN_REASONING_PARSERS),
    ):
        if name not in known:
            hint = did_you_mean(name, known)
            yield error(code, f"serving.{key}={name!r} is not a parser name (vLLM's names, {VLLM_VERSION}, "
                        f"or a built-in){hint}", f"use one of: {', '.join(known)}", f"serving.{key}")
            continue
        if name in builtin:
            continue
        with_vllm = vllm_importable() if with_vllm is None else with_vllm
        if not with_vllm:
            yield error(f"{code}_needs_vllm", f"serving.{key}={name!r} is one of vLLM's parsers, and vLLM is not importable in "
                        "lego's process, where the adapter parses turns; the built-in parsers are "
                        f"{', '.join(builtin)}", f"install vllm into lego's environment, or set serving.{key} "
                        f"to one of: {', '.join(builtin)}", f"serving.{key}")


@check
def serving_urls(r: ResolvedConfig) -> Iterator[Finding]:
    s = r.config.serving
    if s.backend == "vllm" and not s.urls:
        yield error("vllm_urls", "serving.backend = \"vllm\" but serving.urls is empty",
                    "list the vLLM servers in serving.urls (LEGO_SERVING_URLS=http://host:port,...)", "serving.urls")


@check
def sunabako_memory(r: ResolvedConfig) -> Iterator[Finding]:
    """sunabako's memory supervision must be chosen explicitly, for a run that opens sunabako sandboxes."""
    if not opens_sandboxes(r):
        return
    c = r.config
    uses = {c.sandbox.provider, c.grader.provider}
    if "sunabako" in uses and c.sandbox.allow_test_memory is None:
        yield error(
            "sunabako_memory",
            "sandbox provider is sunabako but SUNABAKO_ALLOW_TEST_MEMORY (sandbox.allow_test_memory) was not set",
            "set SUNABAKO_ALLOW_TEST_MEMORY=0 for cgroup enforcement (production) or 1 for RSS functional tests",
            "sandbox.allow_test_memory",
        )
    elif c.sandbox.allow_test_memory:
        yield warning("sunabako_test_memory", "SUNABAKO_ALLOW_TEST_MEMORY=1: RSS supervision cannot enforce a hard "
                      "aggregate memory limit", "use 0 with delegated cgroups in production", "sandbox.allow_test_memory")


@check
def sandbox_disk(r: ResolvedConfig) -> Iterator[Finding]:
    """``sandbox.disk_mb`` is a bwrap option (a loop-mounted layer); the other providers have none."""
    if not opens_sandboxes(r):
        return
    c = r.config
    uses = sorted({c.sandbox.provider, c.grader.provider or c.sandbox.provider})
    other = [p for p in uses if p != "bwrap"]
    if c.sandbox.disk_mb is not None and other:
        yield error("sandbox_disk_provider", f"sandbox.disk_mb = {c.sandbox.disk_mb} is enforced by the bwrap "
                    f"provider only; {', '.join(other)} has no per-sandbox disk cap option",
                    "unset sandbox.disk_mb, or use sandbox.provider = \"bwrap\" (and grader.provider)",
                    "sandbox.disk_mb", "sandbox.provider")


def _read_json(path: Path, key: str) -> tuple[object | None, Finding | None]:
    try:
        return json.loads(path.read_text()), None
    except FileNotFoundError:
        return None, error("missing_file", f"{key} names {path}, which does not exist",
                           f"create it or point {key} at an existing file", key)
    except (OSError, ValueError) as exc:
        return None, error("bad_file", f"{key}: {path} is not valid JSON ({exc})", f"fix or regenerate {path}", key)


@check
def files(r: ResolvedConfig) -> Iterator[Finding]:
    c = r.config
    ckpt = c.model.checkpoint
    if ckpt.startswith("lego:"):
        if ckpt != "lego:tiny":
            yield error("checkpoint", f"model.checkpoint={ckpt!r}: the only built-in model is lego:tiny",
                        "use lego:tiny or an HF checkpoint directory", "model.checkpoint")
    elif not (Path(ckpt) / "config.json").is_file():
        yield error("checkpoint", f"model.checkpoint={ckpt} is not an HF checkpoint directory (no config.json)",
                    "set HF_CHECKPOINT to the directory holding config.json, weights and tokenizer", "model.checkpoint")
    else:
        _, bad = _read_json(Path(ckpt) / "config.json", "model.checkpoint")
        if bad:
            yield bad
    if not opens_sandboxes(r):
        return  # no sandbox node, CLI or toolchain file is used: only the model above matters
    if c.sandbox.cluster:
        data, bad = _read_json(Path(c.sandbox.cluster), "sandbox.cluster")
        if bad:
            yield bad
        elif not (isinstance(data, dict) and isinstance(data.get("nodes"), list) and data["nodes"]):
            yield error("cluster_json", f"{c.sandbox.cluster} must be an object with a non-empty `nodes` list",
                        "see docs/configuration.md for the cluster.json shape", "sandbox.cluster")
        else:
            for i, node in enumerate(data["nodes"]):
                missing = [k for k in ("name", "host") if not isinstance(node, dict) or k not in node]
                if missing:
                    yield error("cluster_json", f"{c.sandbox.cluster}: node {i} lacks {', '.join(missing)}",
                                "give every node a name and a host", "sandbox.cluster")
    for name, table in sorted(c.harness.items()):
        for key, value in table.items():
            if is_path_key(f"{HARNESS}.{name}", key) and isinstance(value, str) and value \
                    and not Path(value).exists():
                yield error("missing_file", f"{HARNESS}.{name}.{key} names {value} (from "
                            f"{r.source(f'{HARNESS}.{name}.{key}')}), which does not exist",
                            "run `lego toolchain fetch`, or point it at the file", f"{HARNESS}.{name}.{key}")


def image_findings(r: ResolvedConfig, scan: DatasetScan) -> Iterator[Finding]:
    """Every image the dataset uses must be mapped in images.json (and, locally, its rootfs exist)."""
    c = r.config
    images_used = scan.images
    images_path = Path(c.sandbox.images) if c.sandbox.images else None
    needs_mapping = c.sandbox.provider in ("sunabako", "bwrap") and images_used
    if images_path is None or not needs_mapping:
        return
    if not images_path.exists() and c.sandbox.provider == "bwrap" and c.sandbox.rootfs is None \
            and not r.is_explicit("sandbox.images"):
        # Without a mapping a rollout can only open "host" or an absolute rootfs directory
        # (sandbox.factory.resolve_image); any other image name fails every one of its rollouts at setup.
        unmapped = sorted(i for i in images_used if i != "host" and not (Path(i).is_absolute() and Path(i).is_dir()))
        if unmapped:
            shown = ", ".join(unmapped[:5]) + (f" and {len(unmapped) - 5} more" if len(unmapped) > 5 else "")
            yield error("images_unmapped", f"the dataset names image(s) {shown}, but there is no images.json at "
                        f"{images_path}: their rollouts would all end in sandbox_setup",
                        "run `lego images` to import the task images, or set sandbox.images", "sandbox.images")
        return
    mapping, bad = _read_json(images_path, "sandbox.images")
    if bad:
        yield bad
        return
    if not isinstance(mapping, dict):
        yield error("images_json", f"{images_path} must map image names to {{rootfs, workdir, env}}",
                    "regenerate it with `lego images`", "sandbox.images")
        return
    missing = sorted(images_used - set(mapping))
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        yield error("images_missing", f"{len(missing)} image(s) used by the dataset have no entry in "
                    f"{images_path}: {shown}", "run `lego images` for this dataset", "sandbox.images")
    # Root filesystems live on the sandbox nodes; only a local provider can look at them from here.
    local = c.sandbox.provider == "bwrap" or (c.sandbox.provider == "sunabako" and not c.sandbox.cluster)
    if local:
        absent = sorted(
            f"{name} -> {entry['rootfs']}" for name, entry in mapping.items()
            if name in images_used and isinstance(entry, dict) and entry.get("rootfs")
            and not Path(entry["rootfs"]).is_dir()
        )
        if absent:
            yield error("rootfs_missing", f"root filesystem(s) named in {images_path} do not exist: "
                        + ", ".join(absent[:3]), "import the images with `lego images` (for the example tasks: "
                        "scripts/build_rootfs.sh)", "sandbox.images")


def harness_findings(r: ResolvedConfig, inventory: HarnessInventory, scan: DatasetScan) -> Iterator[Finding]:
    """The default harness, every row's ``metadata.agent`` and every ``[harness.<name>]`` table must name an
    installed harness, and each table must be accepted by its plugin. Training on an environment
    (``train.environment``) runs no CLI: the default harness is not needed then."""
    if inventory.load_error is not None:
        yield error("harness_plugins", f"harness plugins cannot be loaded: {inventory.load_error}",
                    "fix or uninstall the named package (`pip uninstall ...`)", "agent.default_harness")
        return
    installed = sorted(inventory.installed)
    known = ", ".join(installed) or "none"
    wanted = {} if r.config.train.environment else {r.config.agent.default_harness: "agent.default_harness"}
    wanted |= {n: "rollout.prompt_data" for n in scan.agents}
    for name, key in sorted(wanted.items()):
        if name not in inventory.installed:
            where = "the default harness" if key == "agent.default_harness" else "used by the dataset's metadata.agent"
            yield error("harness_missing", f"harness {name!r} ({where}) is not installed; installed: {known}"
                        + did_you_mean(name, installed),
                        "pip install its plugin (the built-in four: scripts/install_plugins.sh) or change "
                        + ("SWE_AGENT" if key == "agent.default_harness" else "the rows' metadata.agent"), key)
    for name in sorted(set(r.config.harness) - inventory.installed):
        sources = sorted({str(r.source(f"{HARNESS}.{name}.{k}")) for k in r.config.harness[name]})
        hint = did_you_mean(name, installed, f"{HARNESS}.")
        yield error("harness_unknown", f"[{HARNESS}.{name}] (from {', '.join(sources)}) configures a harness "
                    f"that is not installed{hint}; installed: {known}",
                    f"rename the table to an installed harness, or install the plugin for {name!r}",
                    f"{HARNESS}.{name}")
    for exc in inventory.option_errors:
        yield error("harness_options", str(exc), f"fix {exc.parameter} (`lego harnesses` shows its defaults)",
                    exc.parameter or HARNESS)


@check
def run_root(r: ResolvedConfig) -> Iterator[Finding]:
    root = Path(r.config.paths.run_root or "")
    holds_run = root.is_dir() and any((root / name).exists() for name in ("events.jsonl", "config.json"))
    if holds_run and not r.config.train.resume:
        yield error(
            "run_root_exists", f"paths.run_root={root} already holds a run; its logs are never overwritten",
            "use a new RUN_ROOT per experiment, or set train.resume = true to continue it", "paths.run_root",
        )
    elif r.config.train.resume and not holds_run:
        yield error("resume_nothing", f"train.resume is set but {root} holds no run to resume",
                    "point RUN_ROOT at the run to continue, or unset train.resume", "train.resume")


@check
def resume_changes(r: ResolvedConfig) -> Iterator[Finding]:
    """A resume that changes a key shaping training (``config.resume_keys.SHAPING_KEYS``) is refused unless
    ``train.resume_override`` names it; an override that names a key outside the list is refused too."""
    from lego_rl.config.resolve import config_json
    from lego_rl.config.resume_keys import SHAPING_KEYS, changes_on_resume

    c = r.config
    for key in c.train.resume_override:
        if key not in SHAPING_KEYS:
            hint = did_you_mean(key, list(SHAPING_KEYS), "")
            yield error("resume_override_unknown", f"train.resume_override names {key!r}, which is not a key that "
                        f"shapes training{hint}; other keys change freely on resume",
                        "drop it from --override (config/resume_keys.py lists the keys)", "train.resume_override")
    if not c.train.resume or not c.paths.run_root:
        return
    for ch in changes_on_resume(Path(c.paths.run_root), config_json(r)):
        if ch.key in c.train.resume_override:
            continue
        yield error("resume_changed", f"{ch.key} = {ch.after!r} (from {r.source(ch.key)}) but the run was trained "
                    f"with {ch.before!r} ({ch.recorded_in}); it shapes training ({SHAPING_KEYS[ch.key]}), and the "
                    "checkpoint's state was made with the old value",
                    f"set {ch.key} back to {ch.before!r}, or pass --override {ch.key} to train on with the new "
                    "value from the next step (recorded, and marked by a resume_override event), or start a new "
                    "run from the checkpoint (model.checkpoint)", ch.key)


def run_checks(
    r: ResolvedConfig, *, harnesses: HarnessInventory, extra: list[Check] | None = None
) -> list[Finding]:
    """Run every check; errors first, then warnings, each in check order. ``harnesses`` comes from the
    caller that can load plugins (``lego_rl.compose.harnesses.harness_inventory``)."""
    findings = [f for fn in [*CHECKS, *(extra or [])] for f in fn(r)]
    scan = scan_dataset(r)  # once: the dataset, its images and its harnesses are checked from one read
    findings += [*scan.findings, *image_findings(r, scan), *harness_findings(r, harnesses, scan)]
    return sorted(findings, key=lambda f: f.severity != "error")
