"""Environment samplers seeded per rollout (``train.seed``): what a rollout samples depends on the seed, its id
and the weights, not on what else shared the engine. Real pieces: the embedded engine over HTTP, the tiny model,
the serving client, the toy environment's rollout function."""

from __future__ import annotations

import asyncio
from pathlib import Path

from lego_rl.chat.messages import Message
from lego_rl.chat.render import ChatRenderer
from lego_rl.driver.environments import Sampler
from lego_rl.serving.client import ServingClient
from lego_rl.serving.server import embedded_server
from lego_rl.serving.tiny_model import ensure_tiny_model

PROMPT = [Message(role="user", content="Say a word that starts with the letter a.")]


async def _draws(sampler: Sampler, rollout_ids: list[str], turns: int = 2) -> dict[str, list[list[int]]]:
    async def one(rid: str) -> list[list[int]]:
        view = sampler.for_rollout(rid)
        return [(await view.chat(PROMPT, max_tokens=8)).output_ids for _ in range(turns)]

    got = await asyncio.gather(*(one(r) for r in rollout_ids))
    return dict(zip(rollout_ids, got, strict=True))


async def test_a_seeded_rollout_samples_the_same_whatever_shares_the_engine(tmp_path: Path) -> None:
    tiny = ensure_tiny_model()
    renderer = ChatRenderer.from_pretrained(tiny)
    async with embedded_server(tiny, device="cpu", dtype="float32", max_batch=8) as url:
        async with ServingClient([url], vocab_size=len(renderer.tokenizer)) as client:
            def sampler(seed: int | None) -> Sampler:
                return Sampler(client, renderer, temperature=1.0, top_p=1.0, top_k=-1, max_tokens=8, seed=seed)

            ids = [f"g00000-fl-0-{i}" for i in range(4)]
            together = await _draws(sampler(7), ids)  # four rollouts batched together
            alone = await _draws(sampler(7), ids[2:3])  # one of them, alone in the engine
            other_seed = await _draws(sampler(8), ids)
    assert alone[ids[2]] == together[ids[2]]
    # Every rollout and every request of a rollout draws from its own stream...
    flat = [tuple(t) for turns in together.values() for t in turns]
    assert len(set(flat)) > len(flat) // 2, flat
    # ...which the run's seed moves.
    assert other_seed != together
