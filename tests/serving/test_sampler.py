"""The sampler: truncation, seeding, and the logprob convention (the truncated, renormalised distribution)."""

from __future__ import annotations

import pytest
import torch

from lego_rl.serving import sampler
from lego_rl.serving.sampler import RowParams, sample_rows, truncation_mask
from support.numerics import rounding_tolerance


def row(t: float = 1.0, p: float = 1.0, k: int = 0, seed: int = 0, nucleus: bool = True, n: int = 0) -> RowParams:
    return RowParams(temperature=t, top_p=p, top_k=k, num_logprobs=n, want_nucleus=nucleus,
                     generator=torch.Generator().manual_seed(seed))


def test_truncation_mask_top_p_and_top_k() -> None:
    probs = torch.tensor([0.05, 0.5, 0.3, 0.15])
    assert truncation_mask(probs, 0, 0.5).tolist() == [False, True, False, False]
    assert truncation_mask(probs, 0, 0.51).tolist() == [False, True, True, False]
    assert truncation_mask(probs, 0, 0.95).tolist() == [False, True, True, True]
    assert truncation_mask(probs, 2, 1.0).tolist() == [False, True, True, False]
    assert truncation_mask(probs, 0, 1e-9).sum() == 1  # always at least one


def test_logprob_is_of_the_distribution_sampled_from() -> None:
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(1)) * 3
    for t, p, k in [(0.7, 1.0, 0), (1.3, 0.8, 0), (1.0, 0.9, 5)]:
        d = sample_rows(logits, [row(t, p, k, n=60)])[0]
        full = torch.log_softmax(logits[0] / t, dim=-1)
        assert d.nucleus_ids is not None and d.token in d.nucleus_ids
        # log p(token) - log(nucleus mass): the untruncated value when nothing is truncated.
        expected = full[d.token] - torch.logsumexp(full[d.nucleus_ids], dim=0)
        # Same formula, possibly other kernels: two 50-term log-sum-exps (magnitude 1) and a few roundings
        # at |logit / T| (below 14 here); a probability (<= 1) errs by at most as much.
        tol = (rounding_tolerance(torch.float32, magnitude=1.0, terms=2 * 50)
               + rounding_tolerance(torch.float32, magnitude=float((logits / t).abs().max())))
        assert abs(d.logprob - float(expected)) < tol
        # Probabilities <= 1 of at most 50 ids, each exp'd and summed: magnitude 1, 2 * 50 roundings.
        mass_tol = rounding_tolerance(torch.float32, magnitude=1.0, terms=100)
        assert abs(sum(d.nucleus_probs or []) - 1.0) < mass_tol
        assert abs(d.nucleus_probs[d.nucleus_ids.index(d.token)] - float(expected.exp())) < tol  # type: ignore[index]
        assert sorted(i for i, _ in d.top) == sorted(d.nucleus_ids)  # alternatives: the nucleus only
        if k:
            assert len(d.nucleus_ids) <= k


def test_top_k_keeps_ties_with_the_kth() -> None:
    probs = torch.tensor([0.1, 0.3, 0.2, 0.2, 0.2])
    assert truncation_mask(probs, 2, 1.0).tolist() == [False, True, True, True, True]  # as vLLM: >= k-th
    batch = torch.stack([probs, torch.tensor([0.05, 0.5, 0.3, 0.15, 0.0])])
    assert truncation_mask(batch, 0, 0.51).tolist() == [[False, True, True, True, False],
                                                         [False, True, True, False, False]]


def test_greedy_reports_untempered_logprob() -> None:
    logits = torch.tensor([[0.0, 2.0, 1.0]])
    d = sample_rows(logits, [row(t=0.0, n=2)])[0]
    assert d.token == 1 and d.rank == 1 and d.nucleus_ids == [1]
    # log_softmax of three logits <= 2: a 3-term log-sum-exp and a few roundings at magnitude 2.
    assert abs(d.logprob - float(torch.log_softmax(logits[0], -1)[1])) < rounding_tolerance(
        torch.float32, magnitude=2.0, terms=3)
    assert [i for i, _ in d.top] == [1, 2]


def test_seeded_rows_reproduce_and_rows_are_independent() -> None:
    logits = torch.randn(3, 100, generator=torch.Generator().manual_seed(2))
    a = [d.token for d in sample_rows(logits, [row(seed=5), row(seed=6), row(seed=7)])]
    b = [d.token for d in sample_rows(logits[1:2], [row(seed=6)])]
    c = [d.token for d in sample_rows(logits, [row(seed=5), row(seed=6), row(seed=7)])]
    assert a == c and a[1] == b[0]


def test_samples_follow_the_truncated_distribution() -> None:
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.1]]))
    r = row(p=0.85, seed=3)
    counts = [0, 0, 0]
    for _ in range(600):
        counts[sample_rows(logits, [r])[0].token] += 1
    assert counts[2] == 0  # outside the nucleus
    assert 0.6 < counts[0] / 600 < 0.73  # 0.6/0.9 = 0.667


def test_a_batch_with_mixed_parameters_equals_each_row_alone() -> None:
    """Per-row top-k/top-p/temperature in one batched pass: every row's draw, logprob, rank, alternatives and
    nucleus are what the same row gives alone (a shared truncation must not leak across rows)."""
    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(4)) * 2
    params = [dict(t=1.0), dict(t=0.7, p=0.9), dict(t=1.2, k=7), dict(t=0.0, n=3), dict(t=1.0, p=0.5, k=20, n=4)]
    together = sample_rows(logits, [row(seed=i, **kw) for i, kw in enumerate(params)])  # type: ignore[arg-type]
    for i, kw in enumerate(params):
        [alone] = sample_rows(logits[i : i + 1], [row(seed=i, **kw)])  # type: ignore[arg-type]
        assert together[i] == alone, i
    assert len(together[2].nucleus_ids or []) <= 7 and len(together[1].nucleus_ids or []) < 300


def test_candidate_sort_gives_the_full_sorts_mask_at_the_real_vocabulary(monkeypatch: pytest.MonkeyPatch) -> None:
    """``truncation_mask`` sorts only the top candidates and sorts a row in full only when its nucleus may reach
    past them: on 151,936 ids, peaked rows (decided among the candidates), flat rows (redone in full), top-k
    inside and beyond the candidates, and ties straddling the k-th all give the full sort's mask."""
    gen = torch.Generator().manual_seed(0)
    vocab = 151_936
    peaked = torch.softmax(torch.randn(6, vocab, generator=gen) * 6.0, dim=-1)  # [6, V] nuclei of 1 to ~300
    flat = torch.softmax(torch.randn(3, vocab, generator=gen) * 0.1, dim=-1)  # [3, V] nucleus of ~95% of ids
    tied = torch.full((1, vocab), 1e-9)  # [1, V] 40 equal ids straddle k = 20 and the candidate boundary
    tied[0, 1000:1040] = 0.02
    tied = tied / tied.sum()
    probs = torch.cat([peaked, flat, tied])  # [10, V]
    ks = torch.tensor([0, 0, 5, 50, 2000, 0, 0, 0, 7, 20])  # [10] 2000: top-k past 1,024 candidates
    ps = torch.tensor([0.95, 0.5, 0.95, 1.0, 0.9, 1.0, 0.95, 0.3, 1.0, 1.0])  # [10]
    redone: list[int] = []
    full_mask = sampler._full_mask

    def counted(p: torch.Tensor, k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
        redone.append(p.shape[0])
        return full_mask(p, k, top_p)

    for candidates, n_redone in ((16, 6), (1024, 3)):
        monkeypatch.setattr(sampler, "_full_mask", counted)
        got = truncation_mask(probs, ks, ps, candidates=candidates)  # [10, V]
        monkeypatch.setattr(sampler, "_full_mask", full_mask)
        want = truncation_mask(probs, ks, ps, candidates=vocab)  # [10, V] the full sort
        assert torch.equal(got, want), (candidates, (got != want).sum(dim=1).tolist())
        # Among 1,024 candidates only the two flat top-p rows and top-k 2000 are sorted in full (the flat
        # top_p = 1 row keeps everything with no sort at all).
        assert sum(redone) == n_redone, redone
        redone.clear()
    full = truncation_mask(probs, ks, ps, candidates=vocab)
    assert full[9].sum().item() == 40  # all 40 ties with the 20th kept
    assert full[5].all() and 1 < full[6].sum().item() < vocab  # top_p 1 keeps all; the flat row's nucleus
    assert 0.5 <= probs[1][full[1]].sum().item() < 0.5 + probs[1].max().item()  # the smallest prefix >= p
    # One value for all rows, and a single row, take the same route.
    assert torch.equal(truncation_mask(peaked, 0, 0.9, candidates=64), truncation_mask(peaked, 0, 0.9,
                                                                                         candidates=vocab))
    assert torch.equal(truncation_mask(peaked[0], 10, 1.0), truncation_mask(peaked[:1], 10, 1.0)[0])
