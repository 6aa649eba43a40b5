"""A weight source for sync tests: a real HF model and a version, as a trainer backend exports them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


class ModelWeights:
    """A trainer's weights: an HF model plus its version; ``step()`` changes the parameters like an update."""

    def __init__(self, model: Any, version: int = 0) -> None:
        self.model, self.weight_version = model, version

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from self.model.state_dict().items()

    def step(self, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in self.model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.02)
        self.weight_version += 1
