"""The trainer's recomputation of sampled-token logprobs, under the serving logprob convention.

``teacher_forced_logprobs`` runs one forward pass over prompt + output and returns, for each output
position, ``log_softmax(logits / T)[token]``: after temperature, before top-k/top-p truncation, with
``T < 1e-5`` (greedy) taken as 1. This is what the embedded engine reports and what vLLM reports with
``--logprobs-mode processed_logprobs`` when top-k/top-p are off (with top-p/top-k on, vLLM reports the
truncated, renormalised value instead; lego's RL sampling uses ``top_p=1, top_k=-1``).
"""

from __future__ import annotations

from typing import Any

import torch

from lego_rl.serving.sampler import GREEDY_EPS


def teacher_forced_logprobs(model: Any, ids: list[int] | torch.Tensor, prompt_len: int,
                            temperature: float) -> torch.Tensor:
    """Logprobs ``[len(ids) - prompt_len]`` (float32) of ``ids[prompt_len:]`` given everything before them."""
    seq = torch.as_tensor(ids, dtype=torch.long).flatten()
    if not 0 < prompt_len < seq.numel():
        raise ValueError(f"prompt_len must be in [1, {seq.numel() - 1}] for {seq.numel()} ids, got {prompt_len}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    temp = temperature if temperature >= GREEDY_EPS else 1.0
    device = next(model.parameters()).device
    with torch.inference_mode():
        # Logits at positions prompt_len-1 .. n-2 predict ids prompt_len .. n-1.
        n_out = seq.numel() - prompt_len
        out = model(input_ids=seq[:-1].unsqueeze(0).to(device), use_cache=False, logits_to_keep=n_out)
        logits = out.logits[0, -n_out:].float()  # [n_out, V]
        logp = torch.log_softmax(logits / temp, dim=-1)
        return logp.gather(-1, seq[prompt_len:].to(device).unsqueeze(-1)).squeeze(-1).cpu()
