"""Batch KV bookkeeping (left padding, removal, trimming) and the prefix cache, on plain tensors."""

from __future__ import annotations

import torch
from transformers import Qwen3Config

from lego_rl.serving.kv import BatchCache, PrefixCache

CONFIG = Qwen3Config(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                     hidden_size=8, intermediate_size=16, vocab_size=32)


def row(length: int, fill: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
    t = torch.full((1, 1, length, 4), fill)
    t[:, :, :, 0] = torch.arange(length, dtype=torch.float)  # position marker
    return [(t.clone(), -t.clone()) for _ in range(CONFIG.num_hidden_layers)]


def test_rows_of_different_lengths_pad_left_and_come_back_intact() -> None:
    b = BatchCache(CONFIG)
    rows = {0: row(3, 1.0), 1: row(5, 2.0), 2: row(2, 3.0)}
    for i in range(3):
        b.add(rows[i], rows[i][0][0].shape[2])
    assert b.pads == [2, 0, 3] and b.lengths == [3, 5, 2] and b.width == 5
    for i in range(3):
        for (k, v), (k0, v0) in zip(b.row_kv(i), rows[i], strict=True):
            assert torch.equal(k, k0) and torch.equal(v, v0)
    mask = b.attention_mask()
    assert mask.tolist()[2] == [0, 0, 0, 1, 1, 1]
    b.remove([1])  # the longest row leaves: two leading columns are padding everywhere
    assert b.pads == [0, 1] and b.width == 3
    for new_i, old_i in ((0, 0), (1, 2)):
        assert torch.equal(b.row_kv(new_i)[0][0], rows[old_i][0][0])
    b.remove([0, 1])
    assert b.size == 0 and b.cache is None


def test_prefix_cache_longest_match_and_eviction() -> None:
    pc = PrefixCache(max_entries=2)
    pc.put([1, 2, 3, 4], row(4, 1.0))
    pc.put([1, 2, 9, 9, 9], row(5, 2.0))
    n, kv = pc.lookup([1, 2, 3, 4, 5, 6])
    assert n == 4 and kv is not None and kv[0][0].shape[2] == 4 and float(kv[0][0][0, 0, 0, 1]) == 1.0
    n, _ = pc.lookup([1, 2, 3, 4])  # at least one id is left to prefill
    assert n == 3
    assert pc.lookup([7, 7])[0] == 0
    pc.put([5, 5], row(2, 3.0))  # third entry evicts the least recently used ([1, 2, 9, ...])
    assert pc.lookup([1, 2, 9, 9, 9, 1])[0] == 2  # only the shared [1, 2] of [1, 2, 3, 4] remains
    one = row(1, 0.0)
    small = PrefixCache(max_bytes=sum(k.numel() * 4 * 2 for k, _ in one) * 3)
    small.put([1, 2], row(2, 1.0))
    small.put([3, 4], row(2, 1.0))  # over the byte budget: the older entry goes
    assert small.lookup([1, 2, 5])[0] == 0 and small.lookup([3, 4, 5])[0] == 2
    small.clear()
    assert small.bytes == 0 and small.lookup([3, 4, 5])[0] == 0
