"""Chunked head logprobs (``train.head_logprobs``) against the same computation on the full logits: values and
gradients, with and without top-p/top-k truncation and a captured nucleus; then the torch backend's chunked
path against its unchunked one on the real tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lego_rl.serving.logprobs import sampler_logprobs
from lego_rl.serving.tiny_model import ensure_tiny_model
from lego_rl.train.batching import MicroBatch, plan_steps
from lego_rl.train.head_logprobs import head_logprobs
from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings
from lego_rl.trajectory.sample import Sample

N, H, V = 37, 16, 50


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
    torch.testing.assert_close(chunked.logprobs, whole.logprobs, rtol=0, atol=1e-6)
    torch.testing.assert_close(chunked.entropy, whole.entropy, rtol=0, atol=1e-6)
    if with_nucleus:
        torch.testing.assert_close(chunked.candidate_logprobs, whole.candidate_logprobs, rtol=0, atol=1e-6)
    # The head's gradient sums over positions in another order (per chunk, then across): fp32 rounding.
    torch.testing.assert_close(gh, gh_whole, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gw, gw_whole, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(gh).all() and torch.isfinite(gw).all()


def test_values_follow_the_sampler_convention():
    """Without a nucleus the numbers are ``sampler_logprobs`` of the full logits (the serving convention)."""
    head, hidden, targets = setup()
    with torch.no_grad():
        logits = head(hidden)  # [N, V]
        out = head_logprobs(head, hidden, targets, temperature=0.7, top_p=0.8, chunk=3)
        ref = sampler_logprobs(logits, targets, temperature=0.7, top_p=0.8)  # [N]
        plain = head_logprobs(head, hidden, targets, temperature=0.7, chunk=3)
    torch.testing.assert_close(out.logprobs, ref, rtol=0, atol=1e-6)
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
            assert abs(float(mass.sum()) - 1.0) < 1e-5
        else:
            # No nucleus: the configured top_p is recomputed from the trainer's logits.
            expect = sampler_logprobs(logp[i : i + 1], targets[i : i + 1], temperature=1.0, top_p=0.3)[0]
        assert abs(float(out.logprobs[i]) - float(expect)) < 1e-5, i


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
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    lp_a, g_a = grads(chunked, mb, **kw)
    lp_b, g_b = grads(whole, mb, **kw)
    torch.testing.assert_close(lp_a, lp_b, rtol=0, atol=1e-5)
    assert g_a.keys() == g_b.keys() and len(g_a) > 0
    for name in g_a:
        # fp32 sums in another order: differences of ~1e-6 of the gradient's scale, nothing systematic.
        scale = float(g_b[name].abs().max())
        torch.testing.assert_close(g_a[name], g_b[name], rtol=0, atol=1e-5 * scale, msg=name)


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
