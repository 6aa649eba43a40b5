"""Wire and result models of the token-in/token-out serving contract.

The wire shape is vLLM's ``POST /inference/v1/generate`` (enabled with ``--enable-scale-out``):
request ``{"token_ids": [...], "sampling_params": {...}}``, reply
``{"choices": [{"token_ids": [...], "logprobs": {"content": [{"token_id", "logprob", ...}]},
"finish_reason": ...}], "weight_versions": [{"version", "start", "end"}], ...}``.
Both real vLLM and lego's embedded engine answer it, and one client speaks it.

Logprob convention (shared by the embedded engine, the documented vLLM flags and the trainer's
recomputation): the log-probability of the sampled token under the distribution it was sampled from:
``softmax(logits / T)`` truncated by top-k then top-p and renormalised over the kept ids (the nucleus).
Without truncation that is ``log_softmax(logits / T)``; greedy requests ignore the truncation and take T as 1.
This is what vLLM returns with ``--logprobs-mode processed_logprobs`` (its top-k/top-p mask the logits before
the log-softmax), and what the trainer recomputes with ``logprobs.sampler_logprobs`` given the same
``top_p``/``top_k`` (or the captured nucleus, replayed exactly).
A logprob is at most 0; ``LOGPROB_TOLERANCE`` is the one allowance for rounding above it, used by every
check of sampled-token logprobs (serving reply, adapter turn, trajectory record).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

FinishReason = Literal["stop", "length", "abort"]

LOGPROB_TOLERANCE = 1e-4
"""Largest positive logprob accepted as float rounding of ``log p <= 0``; anything above is refused.

A kernel that rounds ``x`` and ``logsumexp(x)`` separately can report the most likely token slightly
above 0: by one float32 ulp of the scaled logit, which is 6.1e-5 for ``|logit / T|`` in [512, 1024)
(e.g. logits near 60 at T=0.1). 1e-4 covers that (a probability error of 0.01%, nothing for an
importance ratio), while every real fault (a probability sent in place of its log, a raw logit, a flipped
sign) is orders of magnitude larger. One constant for every check, so a value the serving client passes
is never refused later by the adapter or the trajectory. The serving client then clamps accepted values
to 0, so above it every logprob is <= 0."""


class SamplingParams(BaseModel):
    """Sampling parameters sent with every generate request (a subset of vLLM's)."""

    model_config = ConfigDict(extra="allow")

    max_tokens: int = Field(default=256, gt=0)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = -1
    seed: int | None = None
    stop_token_ids: list[int] = Field(default_factory=list)
    logprobs: int | None = 1
    skip_special_tokens: bool = False
    include_stop_str_in_output: bool = True


class GenerateRequest(BaseModel):
    """Body of ``POST /inference/v1/generate``."""

    model_config = ConfigDict(extra="allow")

    token_ids: list[int]
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    request_id: str | None = None
    model: str | None = None


class WeightVersionSpan(BaseModel):
    """Output positions ``[start, end)`` produced by weight ``version``."""

    version: int
    start: int
    end: int


class NucleusEntry(BaseModel):
    """The top-p nucleus a token was sampled from: ids and their sampler probabilities."""

    ids: list[int]
    probs: list[float]


class GenerateResult(BaseModel):
    """A validated generate reply, one choice.

    ``logprobs[i]`` belongs to ``output_ids[i]``. ``weight_versions`` covers every output position.
    ``nucleus`` and ``routed_experts`` are present only when requested and supported. ``routed_experts[i]``
    is ``[layers][k]``, the experts ``output_ids[i]`` went through when it was forwarded; the last output id
    never is, so its entry is empty. ``prompt_routed_experts[j]`` is the same for prompt id ``j``.
    """

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    weight_versions: list[WeightVersionSpan] = Field(default_factory=list)
    nucleus: list[NucleusEntry] | None = None
    routed_experts: list[list[list[int]]] | None = None
    prompt_routed_experts: list[list[list[int]]] | None = None
    replica: str | None = None

    def version_of(self, position: int) -> int | None:
        """Weight version that produced output position ``position`` (None if unknown)."""
        for span in self.weight_versions:
            if span.start <= position < span.end:
                return span.version
        return None
