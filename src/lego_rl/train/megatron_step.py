"""A Megatron rank's forwards and its share of one optimizer step.

``compute_logprobs`` and ``train_step`` run this rank's micro-batches (``megatron_parallel.rounds``) through the
pipeline (``train.pipeline``: forward-only, or 1F1B), score tokens on the last stage with vocab-parallel logprobs,
and bring the results to every rank. The step's bookkeeping around the forwards (its checks, the per-rollout
totals, the optimizer update) is ``train.step``'s, shared with the torch backend; what is Megatron's own is the
gradient reduction over DP, TP, EP and the pipeline (``reduce_grads``) and the global gradient norm.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from lego_rl.serving.sampler import GREEDY_EPS
from lego_rl.train.backend import LossFn
from lego_rl.train.batching import MicroBatch, OptimizerStep
from lego_rl.train.megatron_convert import Split, mcore_split
from lego_rl.train.megatron_parallel import from_last_stage, from_last_stage_object, rounds, share_over_dp, sum_over_dp
from lego_rl.train.megatron_setup import MegatronRank
from lego_rl.train.step import StepTotals, add_metrics, check_step, segment_starts

_PER_HEAD_NORMS = ("self_attention.q_layernorm.weight", "self_attention.k_layernorm.weight")
"""Replicated parameters whose gradient is split across TP ranks (each rank normalises only its heads)."""


@contextlib.contextmanager
def replaying(r: MegatronRank, model: Any, mb: MicroBatch) -> Iterator[None]:
    """Hand ``mb``'s routes to every router of ``model`` inside the block (forward, and the recomputed forward
    of backward); a no-op without ``routing_replay``. megatron-core replays every row, so a position without a
    route (one no trained token depends on: ``check_routes``) gets experts 0..k-1."""
    if not r.settings.routing_replay:
        yield
        return
    from megatron.core.transformer.moe.router_replay import RouterReplayAction

    from lego_rl.train.routing_replay import check_routes

    k = r.shape.experts_per_token
    experts, valid = check_routes(mb, layers=r.shape.num_layers, k=k,
                                  num_experts=r.shape.num_experts)  # [T, L, K], [T]
    fallback = torch.arange(k).expand(experts.shape[0], k)  # [T, K]
    replays = [layer.mlp.router.router_replay for layer in model.decoder.layers]
    numbers = [layer.layer_number - 1 for layer in model.decoder.layers]  # global: a stage's layers
    for layer, replay in zip(numbers, replays, strict=True):
        chosen = torch.where(valid[:, None], experts[:, layer].long(), fallback)  # [T, K]
        replay.set_target_indices(chosen.to(r.device))
        replay.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
    try:
        yield
    finally:
        for replay in replays:
            replay.clear_indices()
            replay.clear_router_replay_action()


def token_logprobs(r: MegatronRank, logits: torch.Tensor, mb: MicroBatch, temperature: float, with_entropy: bool,
                   top_p: float = 1.0, top_k: int = -1) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``([T] logprob of each token given its segment's prefix, 0 at segment starts; [T] entropy or None)``
    from the last stage's ``logits`` [T, V/tp], on the rank's device, identical on every TP rank. Carries the
    gradient under grad mode."""
    greedy = temperature < GREEDY_EPS
    temp = 1.0 if greedy else temperature
    targets = mb.input_ids[1:].to(r.device)  # [T-1] position i predicts token i+1
    picked, ent = r.mm.vocab_parallel_logprobs(
        logits[:-1], targets, vocab=r.shape.vocab, temperature=temp, top_p=1.0 if greedy else top_p,
        top_k=-1 if greedy else top_k, with_entropy=with_entropy)  # [T-1], [T-1] or None
    starts = segment_starts(mb).to(r.device)  # [T]
    lp = torch.where(starts, 0.0, torch.cat([picked.new_zeros(1), picked]))  # [T] aligned with input_ids
    entropy = None
    if ent is not None:
        entropy = torch.where(starts, 0.0, torch.cat([ent.new_zeros(1), ent]))  # [T]
    return lp, entropy


def stage_forward(r: MegatronRank, model: Any, mb: MicroBatch, hidden: torch.Tensor | None) -> torch.Tensor:
    """This stage's forward of ``mb``: [T, V/tp] logits on the last stage, [T, 1, H] hidden states elsewhere
    (the caller wraps it in ``replaying``)."""
    return r.mm.stage_forward(model, mb.input_ids, mb.cu_seqlens, r.device, bf16=r.settings.bf16, hidden=hidden)


def wire(r: MegatronRank, mbs: Sequence[MicroBatch]) -> dict[str, Any]:
    """The pipeline messages' shape per micro-batch, dtype and device (``pipeline``'s keywords). fp32: the
    residual stream stays fp32 under bf16 autocast (fp32 parameters), so a stage boundary rounds nothing."""
    return {"shape": lambda j: (mbs[j].num_tokens, 1, r.shape.hidden), "dtype": torch.float32, "device": r.device}


def pipeline_logprobs(r: MegatronRank, model: Any, mbs: Sequence[MicroBatch], temperature: float, top_p: float,
                      top_k: int) -> list[torch.Tensor]:
    """[T] logprobs of each of ``mbs`` through every stage of ``model``, on the last stage (empty list
    elsewhere). Call under ``no_grad`` and the CPU shim."""
    from lego_rl.train import pipeline

    def forward(j: int, hidden: torch.Tensor | None) -> torch.Tensor:
        with replaying(r, model, mbs[j]):
            out = stage_forward(r, model, mbs[j], hidden)  # [T, V/tp] or [T, 1, H]
            if not r.stage.last:
                return out
            lp, _ = token_logprobs(r, out, mbs[j], temperature, False, top_p, top_k)  # [T]
            return lp

    return pipeline.forward_only(r.stage, len(mbs), forward, **wire(r, mbs))


def compute_logprobs(r: MegatronRank, micro_batches: Sequence[MicroBatch], *, temperature: float,
                     top_p: float = 1.0, top_k: int = -1) -> list[torch.Tensor]:
    """[T] logprobs of every micro-batch under the policy, on every rank (CPU)."""
    runs = rounds(r, micro_batches)
    mbs = [mb for _, mb in runs]
    with torch.no_grad(), r.mm.cpu_device_shim(r.device):
        lps = pipeline_logprobs(r, r.model, mbs, temperature, top_p, top_k)  # [T] each, last stage
        # Padding is appended after a micro-batch's own tokens: its first num_tokens logprobs are its own.
        local = {i: lp[:micro_batches[i].num_tokens]
                 for (i, _), lp in zip(runs, from_last_stage(r, mbs, lps), strict=True) if i is not None}
    return share_over_dp(r, len(micro_batches), local)


def forward_backward(r: MegatronRank, step: OptimizerStep, loss_fn: LossFn, old_logprobs: Sequence[torch.Tensor], *,
                     temperature: float, top_p: float, top_k: int) -> tuple[float, dict[str, float]]:
    """Run this rank's share of ``step`` forward and backward (gradients accumulate in the parameters); the
    step's loss and metric sums, on every rank."""
    from lego_rl.train import pipeline

    check_step(step, old_logprobs)
    totals = StepTotals.of(step, old_logprobs, loss_fn, lambda mbs: compute_logprobs(
        r, mbs, temperature=temperature, top_p=top_p, top_k=top_k))
    runs = rounds(r, step.micro_batches)
    mbs = [mb for _, mb in runs]
    refs: list[torch.Tensor] = []
    if r.reference is not None:
        with torch.no_grad():
            refs = pipeline_logprobs(r, r.reference, mbs, temperature, top_p, top_k)  # [T] each, last stage
    metrics: dict[str, float] = {}
    loss_sum = 0.0

    def forward(j: int, hidden: torch.Tensor | None) -> torch.Tensor:
        nonlocal loss_sum
        i, mb = runs[j]
        with replaying(r, r.model, mb):
            out = stage_forward(r, r.model, mb, hidden)  # [T, V/tp] or [T, 1, H]
            if not r.stage.last:
                return out
            lp, entropy = token_logprobs(r, out, mb, temperature, True, top_p, top_k)  # [T], [T]
            if i is None:  # padding only (expert parallelism): its backward runs the dispatcher's collectives
                return lp.sum() * 0.0
            old = old_logprobs[i].to(r.device)  # [T_i]
            old = torch.cat([old, old.new_zeros(mb.num_tokens - old.numel())])  # [T] padded like mb
            res = loss_fn(totals.loss_inputs(i, mb, r.device, logprobs=lp, old_logprobs=old, entropy=entropy,
                                             ref_logprobs=refs[j] if refs else None))
        loss_sum += float(res.loss.detach())
        add_metrics(metrics, res.metrics)
        # Summed, not averaged, over micro-batches: the token weights carry 1/(N_r R).
        return res.loss

    # Routes are set again around each backward: recomputed layers re-run their routers there.
    pipeline.one_forward_one_backward(r.stage, len(mbs), forward, **wire(r, mbs),
                                      backward_context=lambda j: replaying(r, r.model, mbs[j]))
    loss_sum, metrics = from_last_stage_object(r, (loss_sum, metrics))
    return loss_sum, metrics


def reduce_grads(r: MegatronRank) -> None:
    """Sum gradients over DP ranks (an expert's over its expert-data-parallel ranks), a tied embedding's two
    pipeline copies, and the TP ranks' shares of replicated parameters each rank applies to its heads only."""
    from megatron.core import parallel_state as ps

    for p in r.params:
        if p.grad is None:  # a DP rank without micro-batches still joins the all-reduce
            p.grad = torch.zeros_like(p)
    if r.shape.tied and r.layout.pp > 1 and (r.stage.first or r.stage.last):
        # The embedding (first stage) and its copy as the output layer (last stage) are one HF tensor: both
        # take the sum of the two gradients, so the two copies stay equal step after step.
        tied = r.params[r.names.index(
            "embedding.word_embeddings.weight" if r.stage.first else "output_layer.weight")]
        dist.all_reduce(tied.grad, group=ps.get_embedding_group())
    if r.layout.dp > 1:
        # An expert's gradient already holds every token of its expert-parallel group (the dispatcher
        # gathered them): it is summed over the expert-data-parallel ranks only (DP / EP of them), which
        # hold the same experts; everything else over all DP ranks.
        dp_group = ps.get_data_parallel_group()
        for name, p in zip(r.names, r.params, strict=True):
            if r.layout.ep == 1 or r.expert(name) is None:
                dist.all_reduce(p.grad, group=dp_group)
            elif r.layout.dp > r.layout.ep:
                dist.all_reduce(p.grad, group=ps.get_expert_data_parallel_group())
    if r.layout.tp > 1:
        # qk-norm weights are replicated but each TP rank applies them to its own heads only: a rank's
        # gradient is its heads' share, and the true gradient is the sum over ranks.
        tp_group = ps.get_tensor_model_parallel_group()
        summed = _PER_HEAD_NORMS + (r.mm.SEQUENCE_PARALLEL_GRADS if r.settings.sequence_parallel else ())
        for name, p in zip(r.names, r.params, strict=True):
            if name.endswith(summed):
                dist.all_reduce(p.grad, group=tp_group)


def grad_norm(r: MegatronRank) -> float:
    """The global gradient 2-norm over the TP shards, expert-parallel ranks and pipeline stages (replicated
    parameters counted once); call after ``reduce_grads``."""
    from megatron.core import parallel_state as ps

    sharded = torch.zeros((), device=r.device)
    replicated = torch.zeros((), device=r.device)
    experts = torch.zeros((), device=r.device)
    for name, p in zip(r.names, r.params, strict=True):
        if r.tied_copy and name == "output_layer.weight":
            continue  # the first stage's embedding counts this gradient
        sq = p.grad.detach().float().pow(2).sum()  # []
        if r.layout.ep > 1 and r.expert(name) is not None:
            experts += sq  # this rank's experts only (TP = 1 under EP)
        elif mcore_split(name) is Split.REPLICATED:
            replicated += sq  # the same on every TP rank: counted once
        else:
            sharded += sq
    if r.layout.tp > 1:
        dist.all_reduce(sharded, group=ps.get_tensor_model_parallel_group())
    if r.layout.ep > 1:  # each expert-parallel rank holds other experts
        dist.all_reduce(experts, group=ps.get_expert_model_parallel_group())
    total = sharded + replicated + experts  # [] this stage's squared norm
    if r.layout.pp > 1:
        dist.all_reduce(total, group=ps.get_pipeline_model_parallel_group())
    return float(total.sqrt())


def clip_grads(r: MegatronRank, norm: float) -> None:
    """Scale the gradients so their global norm is at most ``max_grad_norm`` (torch's ``clip_grad_norm_`` rule)."""
    if r.settings.max_grad_norm is None:
        return
    coef = min(1.0, r.settings.max_grad_norm / (norm + 1e-6))
    if coef < 1.0:
        for p in r.params:
            p.grad.mul_(coef)


def run_share(r: MegatronRank, step: OptimizerStep, loss_fn: LossFn, old_logprobs: Sequence[torch.Tensor], *,
              temperature: float, top_p: float, top_k: int) -> tuple[float, float, dict[str, float]]:
    """Forward and backward of this rank's share of ``step``, gradients reduced: ``(loss, grad_norm,
    metrics)`` over the whole step, the same on every rank. The caller checks the norm and clips."""
    loss_sum, metrics = forward_backward(r, step, loss_fn, old_logprobs, temperature=temperature, top_p=top_p,
                                         top_k=top_k)
    reduce_grads(r)
    norm = grad_norm(r)
    loss_sum, metrics = sum_over_dp(r, loss_sum, metrics)  # the partial sums were over this rank's micro-batches
    return loss_sum, norm, metrics
