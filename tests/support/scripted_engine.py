"""TEST DOUBLE: a scripted policy at the model boundary.

A random tiny model never calls tools, so the adapter's tool loop cannot be driven by it. This engine
stands in for the policy: for each generate request it emits *chosen text* (from a script: a list of
texts or a function of the decoded prompt), encoded with the real tiny-model tokenizer and ended with
the template's end-of-message token, and scores those ids with the real tiny model (one teacher-forced
forward pass, ``log_softmax(logits / T)``) so the logprobs are genuine. Everything above the model
boundary (adapter, parsers, bridging, CLIs) is real.

It is usable in process (``generate`` fits ``lego_rl.adapter.core.GenerateBackend``) and over HTTP
(``app()`` serves vLLM's ``POST /inference/v1/generate`` shape). Every call is kept in ``calls`` so a
test can check that recorded turns reproduce exactly the ids the engine produced.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from lego_rl.serving.protocol import GenerateRequest, GenerateResult, SamplingParams, WeightVersionSpan

THINK = "<think>\nI will write the file first.\n</think>\n\n"
"""Reasoning a scripted turn may start with: exercises every protocol's reasoning output."""

Script = Callable[[str, int], str]
"""(decoded prompt, call index) -> the text the policy answers."""


@dataclass
class EngineCall:
    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]
    text: str


@dataclass
class ScriptedPolicyEngine:
    """Answers each generate call from ``script``; scores with the tiny model in ``model_dir``."""

    model_dir: Path
    script: Script | Sequence[str]
    weight_version: int = 0
    score: bool = True
    """Score with the model (real logprobs); False gives logprob 0.0 everywhere (benchmarks only)."""
    calls: list[EngineCall] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    """The prompt of the call being answered, set before the script runs: a script may size its answer to the
    exact prompt length (the decoded text re-encoded can differ by a few tokens at segment boundaries)."""

    def __post_init__(self) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        self.end_id = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self._model: Any = None
        self._lock = asyncio.Lock()

    def _text_for(self, prompt: str, index: int) -> str:
        if callable(self.script):
            return self.script(prompt, index)
        if index >= len(self.script):
            return f"(script exhausted after {len(self.script)} turns)"
        return self.script[index]

    def _logprobs(self, prompt_ids: list[int], output_ids: list[int], temperature: float) -> list[float]:
        if not self.score:
            return [0.0] * len(output_ids)
        import torch

        if self._model is None:
            from transformers import AutoModelForCausalLM

            self._model = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=torch.float32).eval()
        ids = torch.tensor([prompt_ids + output_ids])
        with torch.no_grad():
            logits = self._model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
        logp = torch.log_softmax(logits / max(temperature, 1e-6), dim=-1)
        return logp.gather(1, torch.tensor(output_ids)[:, None])[:, 0].tolist()

    async def generate(
        self, token_ids: list[int], params: SamplingParams, *, session_id: str | None = None
    ) -> GenerateResult:
        async with self._lock:  # one forward at a time: the machine has two cores
            index = len(self.calls)
            self.prompt_ids = list(token_ids)
            prompt = self.tokenizer.decode(token_ids, skip_special_tokens=False)
            text = self._text_for(prompt, index)
            output_ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.end_id]
            finish = "stop"
            if len(output_ids) > params.max_tokens:  # cut at the limit, as a real engine would
                output_ids, finish = output_ids[: params.max_tokens], "length"
            logprobs = await asyncio.to_thread(self._logprobs, list(token_ids), output_ids, params.temperature)
            assert all(math.isfinite(x) for x in logprobs)
            self.calls.append(EngineCall(list(token_ids), output_ids, logprobs, text))
        return GenerateResult(
            output_ids=output_ids, logprobs=logprobs, finish_reason=finish,
            weight_versions=[WeightVersionSpan(version=self.weight_version, start=0, end=len(output_ids))])

    # -- HTTP: vLLM's /inference/v1/generate ---------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/inference/v1/generate", self._handle)
        app.router.add_get("/health", _health)
        return app

    async def _handle(self, request: web.Request) -> web.Response:
        body = GenerateRequest.model_validate(await request.json())
        result = await self.generate(body.token_ids, body.sampling_params)
        content = [{"token_id": t, "logprob": lp, "rank": 1} for t, lp in zip(result.output_ids, result.logprobs)]
        return web.json_response({
            "choices": [{"index": 0, "token_ids": result.output_ids, "logprobs": {"content": content},
                         "finish_reason": result.finish_reason}],
            "weight_versions": [w.model_dump() for w in result.weight_versions],
        })


def tool_call_text(name: str, arguments: dict[str, Any], *, before: str = "") -> str:
    """What a qwen3_coder-style policy writes to call ``name`` with ``arguments``."""
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in arguments.items())
    lead = f"{before}\n" if before else ""
    return f"{lead}<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})
