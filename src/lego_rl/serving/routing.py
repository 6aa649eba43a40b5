"""Recording a mixture-of-experts model's expert choices as it runs (R3: routing replay).

Routers are found as ``*.mlp.gate`` modules (the Qwen-MoE / Mixtral naming). A forward hook records each
router's choice, in layer order. A hook rather than ``output_router_logits``: that option also computes
an auxiliary load-balancing loss, which fails on a left-padded batch. A router returning
``(logits, weights, indices)`` gives the exact choice; one returning logits gives it as their top-k.
"""

from __future__ import annotations

from typing import Any

import torch


class RouterRecorder:
    """Hooks every router of ``model``; ``take()`` returns ``[tokens, layers, k]`` for the last forward."""

    def __init__(self, model: Any, experts_per_token: int) -> None:
        self.k = experts_per_token
        self._buf: list[torch.Tensor] = []
        routers = [m for name, m in model.named_modules() if name.endswith("mlp.gate")]
        if not routers:
            raise ValueError("no router modules (*.mlp.gate) found")
        self.layers = len(routers)
        for router in routers:
            router.register_forward_hook(self._record)

    def _record(self, _module: Any, _inputs: Any, output: Any) -> None:
        if isinstance(output, tuple) and len(output) >= 3:
            chosen = output[2]
        else:
            logits = output[0] if isinstance(output, tuple) else output
            chosen = logits.topk(self.k, dim=-1).indices
        self._buf.append(chosen.reshape(-1, self.k))

    def clear(self) -> None:
        self._buf.clear()

    def take(self) -> torch.Tensor:
        """The choices recorded since ``clear()``, as int32 on the CPU; clears the buffer."""
        if len(self._buf) != self.layers:
            raise RuntimeError(f"recorded {len(self._buf)} router calls for {self.layers} MoE layers")
        out = torch.stack(self._buf, dim=1).to(torch.int32).cpu()
        self._buf.clear()
        return out
