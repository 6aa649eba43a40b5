"""KV-cache bookkeeping for the embedded engine: one left-padded batch cache, and a small prefix cache.

The batch cache is one transformers ``DynamicCache`` whose layers hold ``[B, H, T, D]`` tensors. Row ``i``
has ``pads[i]`` leading padding positions (masked out) followed by ``lengths[i]`` real positions, so
rows of different lengths decode together in one forward. A request joins by left-padding the shorter
side to a common length and concatenating along the batch dimension; it leaves by ``index_select``,
after which leading columns that are padding in every row are trimmed. Only full-attention layers
(``DynamicLayer``) are supported; anything else is refused with a clear error.

The prefix cache keeps the KV of recently finished requests (prompt + output minus the last sampled id)
so that an agent's next turn, whose prompt extends the previous one, only prefills the new suffix.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer ``(keys, values)``, each ``[B, H, T, D]``."""


def new_cache(config: Any) -> Any:
    from transformers import DynamicCache

    return DynamicCache(config=config)


def cache_from_kv(config: Any, kv: KV) -> Any:
    """A ``DynamicCache`` holding exactly these tensors (no copy)."""
    cache = new_cache(config)
    for i, (k, v) in enumerate(kv):
        cache.update(k, v, i)
    return cache


def kv_of(cache: Any) -> KV:
    """The ``(keys, values)`` tensors of a cache, refusing layer kinds we cannot pad and slice."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError("this transformers version's cache has no .layers; the embedded engine needs >= 4.56")
    out: KV = []
    for i, layer in enumerate(layers):
        if type(layer).__name__ != "DynamicLayer":
            raise TypeError(f"cache layer {i} is a {type(layer).__name__}: the embedded engine supports only "
                            "full-attention models (no sliding-window or linear-attention layers)")
        out.append((layer.keys, layer.values))
    return out


def _left_pad(t: torch.Tensor, n: int) -> torch.Tensor:
    if n == 0:
        return t
    shape = list(t.shape)
    shape[2] = n
    return torch.cat([t.new_zeros(shape), t], dim=2)


class BatchCache:
    """The running batch's KV cache plus per-row padding and length."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.cache: Any = None
        self.pads: list[int] = []
        self.lengths: list[int] = []

    @property
    def size(self) -> int:
        return len(self.pads)

    @property
    def width(self) -> int:
        return self.pads[0] + self.lengths[0] if self.pads else 0

    def add(self, kv: KV, length: int) -> None:
        """Append one row whose cache ``kv`` (batch 1, no padding) holds ``length`` positions."""
        if self.cache is None or not self.pads:
            self.cache = cache_from_kv(self.config, kv)
            self.pads, self.lengths = [0], [length]
            return
        width = self.width
        grow = max(length - width, 0)
        merged: KV = []
        for (bk, bv), (k, v) in zip(kv_of(self.cache), kv, strict=True):
            target = width + grow
            merged.append((
                torch.cat([_left_pad(bk, grow), _left_pad(k, target - length)], dim=0),
                torch.cat([_left_pad(bv, grow), _left_pad(v, target - length)], dim=0),
            ))
        self.pads = [p + grow for p in self.pads] + [width + grow - length]
        self.lengths.append(length)
        self.cache = cache_from_kv(self.config, merged)

    def row_kv(self, row: int) -> KV:
        """Row ``row``'s real positions as a batch-1 cache (views, no padding)."""
        start = self.pads[row]
        return [(k[row : row + 1, :, start:], v[row : row + 1, :, start:]) for k, v in kv_of(self.cache)]

    def remove(self, rows: list[int]) -> None:
        """Drop ``rows`` and trim leading columns that are padding everywhere."""
        if not rows:
            return
        keep = [i for i in range(self.size) if i not in set(rows)]
        if not keep:
            self.cache, self.pads, self.lengths = None, [], []
            return
        pads = [self.pads[i] for i in keep]
        trim = min(pads)
        index = torch.tensor(keep, device=kv_of(self.cache)[0][0].device)
        kv = [(k.index_select(0, index)[:, :, trim:], v.index_select(0, index)[:, :, trim:])
              for k, v in kv_of(self.cache)]
        self.cache = cache_from_kv(self.config, kv)
        self.pads = [p - trim for p in pads]
        self.lengths = [self.lengths[i] for i in keep]

    def attention_mask(self, extra: int = 1) -> torch.Tensor:
        """``[B, width + extra]`` mask: 0 on padding, 1 on real and new positions."""
        mask = torch.ones(self.size, self.width + extra, dtype=torch.long)
        for i, p in enumerate(self.pads):
            mask[i, :p] = 0
        return mask


class PrefixCache:
    """LRU of finished sequences' KV (batch 1), looked up by longest common token prefix."""

    def __init__(self, max_entries: int = 8, max_bytes: int = 2 * 1024**3) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, tuple[torch.Tensor, KV]] = OrderedDict()
        self._sizes: dict[int, int] = {}
        self._next = 0
        self.hits = 0
        self.reused_tokens = 0

    def clear(self) -> None:
        """Forget everything (after a weight change the cached KV belongs to old weights)."""
        self._entries.clear()
        self._sizes.clear()

    @property
    def bytes(self) -> int:
        return sum(self._sizes.values())

    def put(self, tokens: list[int], kv: KV) -> None:
        size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
        if not tokens or self.max_entries <= 0 or size > self.max_bytes:
            return
        # Clone: the views point into the batch cache, which is about to be rebuilt.
        owned = [(k.clone(), v.clone()) for k, v in kv]
        key = self._next
        self._next += 1
        self._entries[key], self._sizes[key] = (torch.tensor(tokens), owned), size
        while self._entries and (len(self._entries) > self.max_entries or self.bytes > self.max_bytes):
            old, _ = self._entries.popitem(last=False)
            self._sizes.pop(old, None)

    def lookup(self, prompt: list[int]) -> tuple[int, KV | None]:
        """Longest reusable prefix of ``prompt``: ``(n, kv cropped to n)``; leaves >= 1 id to prefill."""
        if not self._entries or len(prompt) < 2:
            return 0, None
        query = torch.tensor(prompt)
        best_key, best = None, 0
        for key, (tokens, _) in self._entries.items():
            m = min(len(tokens), len(query) - 1)
            diff = torch.nonzero(tokens[:m] != query[:m])
            n = int(diff[0]) if diff.numel() else m
            if n > best:
                best_key, best = key, n
        if best_key is None or best == 0:
            return 0, None
        self._entries.move_to_end(best_key)
        self.hits += 1
        self.reused_tokens += best
        kv = self._entries[best_key][1]
        return best, [(k[:, :, :best], v[:, :, :best]) for k, v in kv]
