"""Chunked head logprobs (``train.head_logprobs``) against the same computation on the full logits: values and
gradients, with and without top-p/top-k truncation and a captured nucleus; then the torch backend's chunked
path against its unchunked one on the real tiny model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from lego_rl.serving.logprobs import sampler_logprobs
from lego_rl.serving.tiny_model import ensure_tiny_model
from lego_rl.train.batching import MicroBatch, plan_steps
from lego_rl.train.head_logprobs import head_logprobs
from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings
from lego_rl.trajectory.sample import Sample
from support.numerics import log_softmax_tolerance, rounding_tolerance

N, H, V = 37, 16, 50
F32 = torch.float32


def setup(seed: int = 0) -> tuple[torch.nn.Linear, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(H, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=g) * 0.5)  # [V, H]
    hidden = torch.randn(N, H, generator=g)  # [N, H]
    targets = torch.randint(0, V, (N,), generator=g)  # [N]
    return head, hidden, targets


def nucleus(targets: torch.Tensor, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] ids holding the target and some others, ragged (padding), a few rows without a nucleus."""
    g = torch.Generator().manual_seed(seed)
    k = 6
    ids = (targets.unsqueeze(1) + 7 * torch.arange(k).unsqueeze(0)) % V  # [N, K] distinct, target first
    sizes = torch.randint(1, k + 1, (N,), generator=g)  # [N]
    valid = torch.arange(k).unsqueeze(0) < sizes.unsqueeze(1)  # [N, K]
    valid[::5] = False  # every fifth position has no captured nucleus (context)
    return ids, valid


def run(head: torch.nn.Linear, hidden: torch.Tensor, targets: torch.Tensor, chunk: int, **kw):
    """Values and the gradients of a weighted sum of every output w.r.t. hidden and the head."""
    head.zero_grad()
    h = hidden.clone().requires_grad_(True)
    out = head_logprobs(head, h, targets, chunk=chunk, with_entropy=True, **kw)
    w = torch.linspace(-1.0, 2.0, N)  # [N]
    total = (w * out.logprobs).sum()
    if out.candidate_logprobs is not None:
        total = total + (w.unsqueeze(1) * out.candidate_logprobs).sum()
    total.backward()
    assert head.weight.grad is not None and h.grad is not None
    return out, h.grad.clone(), head.weight.grad.clone()


def logprob_tol(head: torch.nn.Linear, hidden: torch.Tensor, temperature: float) -> float:
    """Tolerance between two fp32 computations of these logprobs that use different matmul kernels (the
    chunked head and the whole matrix: BLAS picks its kernel by shape and CPU): the logits' dot products of
    H terms, bounded by sum |h||w| / T, then up to two log-sum-exps over V (softmax, truncation/nucleus)."""
    t = temperature if temperature > 0 else 1.0  # greedy scores at T = 1
    bound = float((hidden.abs() @ head.weight.abs().T).max()) / t
    return log_softmax_tolerance(F32, logit_magnitude=bound, inner=H, vocab=V, normalisations=2)


CASES = [
    dict(temperature=1.0),
    dict(temperature=0.7, top_p=0.8),
    dict(temperature=1.0, top_k=5),
    dict(temperature=1.0, top_p=0.9, top_k=8),
    dict(temperature=0.0, top_p=0.5),  # greedy ignores the truncation
]


@pytest.mark.parametrize("kw", CASES)
@pytest.mark.parametrize("with_nucleus", [False, True])
def test_chunked_equals_one_piece_in_values_and_gradients(kw, with_nucleus):
    head, hidden, targets = setup()
    if with_nucleus:
        ids, valid = nucleus(targets)
        kw = {**kw, "nucleus_ids": ids, "nucleus_valid": valid}
    whole, gh_whole, gw_whole = run(head, hidden, targets, chunk=N, checkpoint_chunks=False, **kw)
    chunked, gh, gw = run(head, hidden, targets, chunk=4, **kw)
    # A chunk of 4 rows and all 37 may take different matmul kernels: the difference is rounding only.
    lp_tol = logprob_tol(head, hidden, kw["temperature"])
    torch.testing.assert_close(chunked.logprobs, whole.logprobs, rtol=0, atol=lp_tol)
    # Entropy -sum p log p: the logprob error weighted by p (1 + |log p|) sums to at most (1 + log V) times
    # it, plus the V-term sum itself (values up to log V).
    ent_tol = lp_tol * (1 + math.log(V)) + rounding_tolerance(F32, magnitude=math.log(V), terms=V)
    torch.testing.assert_close(chunked.entropy, whole.entropy, rtol=0, atol=ent_tol)
    if with_nucleus:
        torch.testing.assert_close(chunked.candidate_logprobs, whole.candidate_logprobs, rtol=0, atol=lp_tol)
    # Gradients: the softmax's V-term normaliser, then a V-term sum (hidden's) or an N-term sum over positions
    # in another order (the head's: per chunk, then across); partial sums of the size of the largest gradient.
    gh_tol = rounding_tolerance(F32, magnitude=float(gh_whole.abs().max()), terms=2 * V)
    gw_tol = rounding_tolerance(F32, magnitude=float(gw_whole.abs().max()), terms=N + V)
    torch.testing.assert_close(gh, gh_whole, rtol=0, atol=gh_tol)
    torch.testing.assert_close(gw, gw_whole, rtol=0, atol=gw_tol)
    assert torch.isfinite(gh).all() and torch.isfinite(gw).all()


def test_values_follow_the_sampler_convention():
    """Without a nucleus the numbers are ``sampler_logprobs`` of the full logits (the serving convention)."""
    head, hidden, targets = setup()
    with torch.no_grad():
        logits = head(hidden)  # [N, V]
        out = head_logprobs(head, hidden, targets, temperature=0.7, top_p=0.8, chunk=3)
        ref = sampler_logprobs(logits, targets, temperature=0.7, top_p=0.8)  # [N]
        plain = head_logprobs(head, hidden, targets, temperature=0.7, chunk=3)
    # The chunked head (3 rows) and the whole matrix take different BLAS kernels (by shape, and by CPU: 2.9e-6
    # apart on an AMD EPYC, 3 ulps at -10): same convention, rounding only.
    torch.testing.assert_close(out.logprobs, ref, rtol=0, atol=logprob_tol(head, hidden, 0.7))
    # The truncation matters here: it is not the untruncated softmax.
    assert (out.logprobs - plain.logprobs).max() > 1e-3


def test_captured_nucleus_is_replayed_exactly():
    """A position with a captured nucleus is renormalised over exactly those ids (not the trainer's own
    top-p), and its candidates' probabilities sum to one; positions without one keep the untruncated value."""
    head, hidden, targets = setup()
    ids, valid = nucleus(targets)
    with torch.no_grad():
        logp = torch.log_softmax(head(hidden), -1)  # [N, V]
        out = head_logprobs(head, hidden, targets, temperature=1.0, top_p=0.3, nucleus_ids=ids,
                            nucleus_valid=valid, chunk=5)
    has = valid.any(-1)  # [N]
    for i in range(N):
        if has[i]:
            kept = ids[i][valid[i]]
            expect = logp[i, targets[i]] - torch.logsumexp(logp[i, kept], 0)
            mass = out.candidate_logprobs[i][valid[i]].exp()
            # Renormalised over at most K ids: a K-term log-sum-exp and a K-term sum of values <= 1.
            mass_tol = rounding_tolerance(F32, magnitude=1.0, terms=2 * ids.shape[1])
            assert abs(float(mass.sum()) - 1.0) < mass_tol
        else:
            # No nucleus: the configured top_p is recomputed from the trainer's logits.
            expect = sampler_logprobs(logp[i : i + 1], targets[i : i + 1], temperature=1.0, top_p=0.3)[0]
        # Chunks of 5 rows against the whole matrix: different matmul kernels, rounding only.
        assert abs(float(out.logprobs[i]) - float(expect)) < logprob_tol(head, hidden, 1.0), i


def test_bad_inputs_are_refused():
    head, hidden, targets = setup()
    with pytest.raises(ValueError, match="chunk must be"):
        head_logprobs(head, hidden, targets, temperature=1.0, chunk=0)
    with pytest.raises(ValueError, match="hidden"):
        head_logprobs(head, hidden, targets[:-1], temperature=1.0)
    ids, valid = nucleus(targets)
    with pytest.raises(ValueError, match="together"):
        head_logprobs(head, hidden, targets, temperature=1.0, nucleus_ids=ids)
    with pytest.raises(ValueError, match="nucleus_ids"):
        head_logprobs(head, hidden, targets, temperature=1.0, nucleus_ids=ids[:-1], nucleus_valid=valid[:-1])


# ------------------------------------------------------------------------------------- the torch backend


@pytest.fixture(scope="module")
def tiny() -> Path:
    return ensure_tiny_model()


def packed_micro_batch(vocab: int, with_nucleus: bool) -> MicroBatch:
    """Three segments packed into one micro-batch of ~60 tokens, trained tokens with a captured nucleus."""
    g = torch.Generator().manual_seed(3)
    samples = []
    for r, (ctx, out) in enumerate([(9, 12), (14, 7), (6, 15)]):
        n = ctx + out
        tokens = torch.randint(0, vocab, (n,), generator=g).tolist()
        nuc_ids = [[] for _ in range(ctx)] + [[t, (t + 1) % vocab, (t + 7) % vocab][: 1 + k % 3]
                                              for k, t in enumerate(tokens[ctx:])]
        nuc_probs = [[1.0 / len(s)] * len(s) if s else [] for s in nuc_ids]
        samples.append(Sample(rollout_id=f"r{r}", group_index=0, index=r, tokens=tokens,
                              loss_mask=[0] * ctx + [1] * out, rollout_logprobs=[0.0] * ctx + [-1.0] * out,
                              nucleus_ids=nuc_ids if with_nucleus else None,
                              nucleus_probs=nuc_probs if with_nucleus else None))
    (step,) = plan_steps(samples, [1.0, -1.0, 0.5], max_tokens_per_micro_batch=80)
    (mb,) = step.micro_batches
    return mb


def grads(backend: TorchBackend, mb: MicroBatch, **kw) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    backend.model.zero_grad(set_to_none=True)
    out = backend._score(backend.model, mb, 0.8, True, **kw)
    total = (mb.token_weights * out.logprobs).sum()
    if out.candidate_logprobs is not None:
        total = total + out.candidate_logprobs.sum()
    total.backward()
    return out.logprobs.detach(), {n: p.grad.clone() for n, p in backend.model.named_parameters()
                                   if p.grad is not None}


@pytest.mark.parametrize("with_nucleus,kw", [(False, {}), (False, {"top_p": 0.9}), (True, {"top_p": 0.9})])
def test_backend_chunked_path_equals_the_full_logits_path(tiny, with_nucleus, kw):
    vocab = int(json.loads((tiny / "config.json").read_text())["vocab_size"])
    mb = packed_micro_batch(vocab, with_nucleus)
    chunked = TorchBackend(tiny, TorchTrainSettings(lr=1e-3, device="cpu", logprob_chunk_tokens=7))
    whole = TorchBackend(tiny, TorchTrainSettings(lr=1e-3, device="cpu", logprob_chunk_tokens=0))
    assert chunked._chunked and not whole._chunked
    [a] = chunked.compute_logprobs([mb], temperature=0.8, **kw)
    [b] = whole.compute_logprobs([mb], temperature=0.8, **kw)
    # Both paths run the same decoder; only the head differs (chunks of 7 rows against the whole matrix:
    # other matmul kernels), so the logprobs differ by the rounding of the head's dot products over the
    # hidden size (bounded by sum |h||w| / T) and of the log-sum-exps over the vocabulary.
    with torch.no_grad():
        hidden = chunked._hidden_states(chunked.model, mb.input_ids, mb.position_ids, chunked._segments(mb))
        weight = chunked.model.get_output_embeddings().weight  # [V, H]
        bound = float((hidden.abs() @ weight.abs().T).max()) / 0.8
    lp_tol = log_softmax_tolerance(torch.float32, logit_magnitude=bound, inner=weight.shape[1], vocab=vocab,
                                   normalisations=2)
    torch.testing.assert_close(a, b, rtol=0, atol=lp_tol)
    lp_a, g_a = grads(chunked, mb, **kw)
    lp_b, g_b = grads(whole, mb, **kw)
    torch.testing.assert_close(lp_a, lp_b, rtol=0, atol=lp_tol)
    assert g_a.keys() == g_b.keys() and len(g_a) > 0
    for name in g_a:
        # The head's gradient differs by the rounding of the softmax's V-term normaliser and of the sum over
        # the T positions (per chunk, then across); the decoder's backward runs the same kernels on both
        # sides and carries that difference back. Partial sums of the gradient's own scale.
        scale = float(g_b[name].abs().max())
        tol = rounding_tolerance(torch.float32, magnitude=scale, terms=vocab + mb.input_ids.numel())
        torch.testing.assert_close(g_a[name], g_b[name], rtol=0, atol=tol, msg=name)


def test_a_post_processed_head_falls_back_to_full_logits(tmp_path):
    """Granite divides its logits by ``logits_scaling`` after the head: ``lm_head(hidden)`` is not the model's
    output there, so the backend must notice and score from the full logits instead of other numbers."""
    from transformers import GraniteConfig, GraniteForCausalLM

    torch.manual_seed(0)
    model = GraniteForCausalLM(GraniteConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=1, logits_scaling=4.0))
    model.save_pretrained(str(tmp_path), safe_serialization=True)
    backend = TorchBackend(tmp_path, TorchTrainSettings(lr=1e-3, device="cpu"))
    assert not backend._chunked
    # The control: the same architecture without the scaling is chunked.
    model.config.logits_scaling = 1.0
    model.save_pretrained(str(tmp_path / "plain"), safe_serialization=True)
    assert TorchBackend(tmp_path / "plain", TorchTrainSettings(lr=1e-3, device="cpu"))._chunked
