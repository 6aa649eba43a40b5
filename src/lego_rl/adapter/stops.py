"""Client stop sequences: where a sampled output ends for the client, and which sampled tokens are kept.

A stop sequence is matched on the decoded text of the sampled output (special tokens kept, the final
end-of-message token stripped), the text vLLM matches its ``stop`` strings on. The match that completes
first wins, as an engine watching its output grow would see it; the reply's text ends before it.

The recorded output keeps the sampled tokens up to and including the one that completes the match, and
drops the rest. That is exactly what an engine stopping on the string itself returns (vLLM's ``stop``,
which keeps the completing token even when the string ends inside it), and it is still an exact sample:
each kept token's id and logprob depend only on the tokens before it, so a prefix of a sample is a sample
of that prefix. The dropped tokens were never shown to the client and influenced nothing, so training on
them would credit the reward to text the environment never saw.

The kept output does not end with the template's end-of-message token, so the next turn cannot be
bridged token for token: it is fully rendered from the history the client echoes (text cut before the
stop sequence) and the trajectory starts a new segment there. The earlier segment keeps its exact ids.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lego_rl.serving.protocol import GenerateResult

MAX_STOP_SEQUENCES = 4
"""Most stop sequences one request may carry: OpenAI's documented limit for Chat Completions ``stop``,
and vLLM's default ``VLLM_MAX_STOP_STRINGS`` on its OpenAI and Anthropic front ends. Refusing more with
a 400 names the problem; passing them on could make a vLLM engine refuse the turn, failing the rollout."""


@dataclass(frozen=True)
class StopMatch:
    """Where a client stop sequence ended the output."""

    sequence: str
    """The client's stop string that matched."""
    text: str
    """The visible text before the match: what the client is sent."""
    n_tokens: int
    """Sampled tokens kept: the shortest prefix of the output whose text contains the match."""


def find_stop(
    ids: Sequence[int], text: str, stops: Sequence[str], decode: Callable[[Sequence[int]], str]
) -> StopMatch | None:
    """The first stop sequence in ``text`` (``decode(ids)``), or None when none occurs.

    The kept prefix is found by bisection over ``decode(ids[:k])`` (a few decodes, not one per token):
    decoding a prefix gives a prefix of the text, except that a character split across tokens decodes
    as a replacement character until its last byte arrives, which only delays the match to the token
    that completes it.
    """
    hits = [(pos + len(s), pos, s) for s in stops if s and (pos := text.find(s)) >= 0]
    if not hits:
        return None
    end, start, sequence = min(hits)
    needed = text[:end]
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if decode(ids[:mid]).startswith(needed):
            hi = mid
        else:
            lo = mid + 1
    return StopMatch(sequence=sequence, text=text[:start], n_tokens=lo)


def keep_prefix(result: GenerateResult, n: int) -> GenerateResult:
    """``result`` cut to its first ``n`` output tokens, every per-token field with them, finished by
    ``stop`` (what an engine stopping on the string reports)."""
    if n == len(result.output_ids) and result.finish_reason == "stop":
        return result
    spans = [s.model_copy(update={"end": min(s.end, n)}) for s in result.weight_versions if s.start < n]
    return result.model_copy(
        update={
            "output_ids": result.output_ids[:n],
            "logprobs": result.logprobs[:n],
            "finish_reason": "stop",
            "weight_versions": spans,
            "nucleus": result.nucleus[:n] if result.nucleus is not None else None,
            "routed_experts": result.routed_experts[:n] if result.routed_experts is not None else None,
        }
    )
