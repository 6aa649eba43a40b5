"""What the embedded engine hands back for one request, and its request-level error."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lego_rl.serving.sampler import Draw


class EngineBadRequest(ValueError):
    """A request the engine cannot run (e.g. too long for the context); ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        self.param = param
        super().__init__(message)


@dataclass
class EngineOutput:
    """One finished request, in engine terms (``server.py`` shapes it as vLLM's reply)."""

    request_id: str
    prompt_len: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)
    nucleus_ids: list[list[int]] | None = None
    nucleus_probs: list[list[float]] | None = None
    finish_reason: str | None = None
    stop_reason: int | None = None
    routing: list[torch.Tensor] | None = None
    """MoE routing, when the engine returns it: ``[n, layers, k]`` chunks, one row per forwarded token
    (prompt, then every output id but the last), as vLLM's ``routed_experts``."""

    def record(self, draw: Draw, version: str) -> None:
        self.token_ids.append(draw.token)
        self.logprobs.append(draw.logprob)
        self.ranks.append(draw.rank)
        self.top.append(draw.top)
        self.versions.append(version)
        if self.nucleus_ids is not None and self.nucleus_probs is not None:
            self.nucleus_ids.append(draw.nucleus_ids or [])
            self.nucleus_probs.append(draw.nucleus_probs or [])
