"""Verifiable environments: a rollout-and-reward type that a user registers by entry point.

The coding-agent rollout (``rollout.generate``: sandbox, CLI, adapter, grader) is one way to turn a task
row into Samples with a reward. An *environment* is the other: a small object that, given a task row and a
way to sample from the serving engine, produces the rollout's Samples and its reward itself, with no
sandbox, no adapter and no CLI. The training loop drives both the same way (``loop.RolloutFn``).

Register one in your package's ``pyproject.toml``::

    [project.entry-points."lego_rl.environments"]
    my_task = "my_package.env:MyEnvironment"

and select it with ``train.environment = "my_task"``. ``docs/training.md`` walks through a whole example;
``driver.toy_env`` is the built-in one, registered the same way.

The contract (``Environment``):

* ``parse_row(raw)`` validates one JSON row of ``rollout.prompt_data`` and returns what ``rollout`` takes;
  a bad row raises ``ValueError`` naming what is wrong (the loader adds the file and line).
* ``row_id(row)`` names the row (rollout ids and logs use it).
* ``rollout(row, sampler)`` samples through ``sampler`` and returns an ``EnvOutcome``: the completions it
  trains on and the reward. Sampled tokens keep the engine's logprobs and weight versions; the
  environment never re-tokenises text it trains on.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Protocol, runtime_checkable

from lego_rl.chat.messages import Message
from lego_rl.chat.render import ChatRenderer
from lego_rl.errors import ConfigError
from lego_rl.serving.client import ServingClient
from lego_rl.serving.protocol import FinishReason, SamplingParams
from lego_rl.termination import TerminationReason
from lego_rl.trajectory.sample import PromptRoutingSnapshot, Sample

ENTRY_POINT_GROUP = "lego_rl.environments"


@dataclass(frozen=True)
class Completion:
    """One sampled answer: the prompt as the engine saw it and what it generated (never re-tokenised)."""

    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]
    """``logprobs[i]`` belongs to ``output_ids[i]`` (the engine's convention, ``serving.protocol``)."""
    weight_versions: list[int]
    """The weight version that produced each output token."""
    finish_reason: FinishReason
    text: str
    """The visible answer (decoded output without its end-of-message token)."""
    nucleus_ids: list[list[int]] | None = None
    """Per output token, the ids of the nucleus it was sampled from (``rollout.capture_nucleus``)."""
    nucleus_probs: list[list[float]] | None = None
    """The sampler's probabilities of those ids."""
    routed_experts: list[list[list[int]]] | None = None
    """Per output token, its experts ``[layer][k]`` (``rollout.use_rollout_routing_replay``; the last is empty)."""
    prompt_routed_experts: list[list[list[int]]] | None = None
    """Per prompt token, its experts at this call's prefill (the R3 prompt snapshot)."""


@dataclass
class EnvOutcome:
    """What one environment rollout produced."""

    completions: list[Completion]
    """Each becomes one training segment (a multi-turn environment returns one per turn)."""
    reward: float
    termination: TerminationReason = TerminationReason.COMPLETED
    """A policy outcome (``completed``, ``context_limit``...): the environment decides how the episode ended.
    Infrastructure failures are not returned but raised (any exception), and the loop refills them."""
    metadata: dict[str, Any] = field(default_factory=dict)


class Sampler:
    """How an environment samples: chat messages in, one ``Completion`` out, from the serving engine.

    Every environment rollout of a step shares one sampler; the temperature, top-p and top-k are the
    run's (``rollout.*``) so that the trainer's recomputed logprobs follow the same convention.

    With a ``seed`` (``train.seed``), ``for_rollout(rollout_id)`` gives a rollout a view whose n-th request
    carries the seed ``hash(seed, rollout_id, n)``: what a rollout samples then depends on the run's seed, its
    id and the weights, not on which other requests shared the engine's batch or which replica served it. A
    run is repeatable, and a Ray cluster run samples what the single-process run samples.
    """

    def __init__(self, client: ServingClient, renderer: ChatRenderer, *, temperature: float, top_p: float,
                 top_k: int, max_tokens: int, capture_nucleus: bool = False, seed: int | None = None,
                 capture_routing: bool = False) -> None:
        self.client = client
        self.renderer = renderer
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.max_tokens = max_tokens
        self.capture_nucleus = capture_nucleus
        """Ask the engine for each token's nucleus (score centering replays it in the trainer)."""
        self.capture_routing = capture_routing
        """Ask the engine for each token's routed experts (R3: the trainer replays them)."""
        self.seed = seed
        self._rollout_id: str | None = None
        self._requests = 0

    def for_rollout(self, rollout_id: str) -> Sampler:
        """This sampler for one rollout: its requests are seeded from ``(seed, rollout_id, request number)``
        (unseeded, as the engine draws, when the sampler has no seed)."""
        view = copy.copy(self)
        view._rollout_id, view._requests = rollout_id, 0
        return view

    def _next_seed(self) -> int | None:
        if self.seed is None or self._rollout_id is None:
            return None
        n, self._requests = self._requests, self._requests + 1
        digest = hashlib.blake2b(f"{self.seed}:{self._rollout_id}:{n}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") >> 1  # 63 bits: the engine's seed range

    async def chat(self, messages: Sequence[Message], *, max_tokens: int | None = None,
                   session_id: str | None = None) -> Completion:
        """Render ``messages`` with the model's chat template (generation prompt added) and sample once."""
        prompt = self.renderer.render_ids(messages)
        return await self.complete(prompt, max_tokens=max_tokens, session_id=session_id)

    async def complete(self, prompt_ids: list[int], *, max_tokens: int | None = None,
                       session_id: str | None = None) -> Completion:
        """Sample a continuation of raw token ids."""
        params = SamplingParams(
            max_tokens=max_tokens or self.max_tokens, temperature=self.temperature, top_p=self.top_p,
            top_k=self.top_k, stop_token_ids=sorted(self.renderer.eos_ids), seed=self._next_seed(),
        )
        res = await self.client.generate(prompt_ids, params, session_id=session_id,
                                         return_nucleus=self.capture_nucleus,
                                         return_routed_experts=self.capture_routing)
        versions = [res.version_of(i) for i in range(len(res.output_ids))]
        return Completion(
            prompt_ids=list(prompt_ids), output_ids=list(res.output_ids), logprobs=list(res.logprobs),
            weight_versions=[-1 if v is None else v for v in versions], finish_reason=res.finish_reason,
            text=self.renderer.decode(self.renderer.strip_end_of_message(res.output_ids)),
            nucleus_ids=None if res.nucleus is None else [e.ids for e in res.nucleus],
            nucleus_probs=None if res.nucleus is None else [e.probs for e in res.nucleus],
            routed_experts=res.routed_experts, prompt_routed_experts=res.prompt_routed_experts,
        )


@runtime_checkable
class Environment(Protocol):
    """A verifiable task type. ``name`` is what ``train.environment`` selects."""

    name: str

    def parse_row(self, raw: dict[str, Any]) -> Any:
        """One JSON row of the dataset, validated; ``ValueError`` naming what is wrong."""
        ...

    def row_id(self, row: Any) -> str:
        """A stable, unique name of the row."""
        ...

    async def rollout(self, row: Any, sampler: Sampler) -> EnvOutcome:
        """Sample and score one attempt at ``row``."""
        ...


def completion_sample(c: Completion, *, rollout_id: str, group_index: int, index: int, reward: float,
                      termination: TerminationReason, segment: int = 0, num_segments: int = 1) -> Sample:
    """A ``Completion`` as a training segment: the prompt is context (mask 0), the output is trained."""
    n_prompt = len(c.prompt_ids)
    return Sample(
        rollout_id=rollout_id, group_index=group_index, index=index, segment=segment,
        num_segments=num_segments, tokens=c.prompt_ids + c.output_ids,
        loss_mask=[0] * n_prompt + [1] * len(c.output_ids),
        rollout_logprobs=[0.0] * n_prompt + c.logprobs,
        weight_versions=[-1] * n_prompt + c.weight_versions, reward=reward, termination=termination,
        text=c.text,
        nucleus_ids=None if c.nucleus_ids is None else [[] for _ in c.prompt_ids] + c.nucleus_ids,
        nucleus_probs=None if c.nucleus_probs is None else [[] for _ in c.prompt_ids] + c.nucleus_probs,
        routed_experts=None if c.routed_experts is None else [[] for _ in c.prompt_ids] + c.routed_experts,
        prompt_routing=[] if c.prompt_routed_experts is None else [PromptRoutingSnapshot(
            rollout_id=rollout_id, group_index=group_index, turn=segment, prompt_len=n_prompt,
            routes=c.prompt_routed_experts)],
    )


BUILT_IN_ENVIRONMENTS = {"first_letter": "lego_rl.driver.toy_env:FirstLetterEnv"}
"""lego-rl's own environments, also registered as entry points in pyproject.toml. Known here too because a
source tree on PYTHONPATH (a GPU node that mounts the checkout, a container without ``pip install``) has no
package metadata, hence no entry points; an installed package's entry point of the same name wins."""


def _entry_points() -> list[EntryPoint]:
    found = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    for name, value in BUILT_IN_ENVIRONMENTS.items():
        found.setdefault(name, EntryPoint(name=name, value=value, group=ENTRY_POINT_GROUP))
    return list(found.values())


def available_environments() -> dict[str, str]:
    """Installed environments (and the built-in ones): entry-point name → ``module:attr``."""
    return {ep.name: ep.value for ep in _entry_points()}


def load_environment(name: str, options: dict[str, Any] | None = None) -> Environment:
    """Instantiate the environment registered under ``name`` with ``options`` as keyword arguments."""
    found = [ep for ep in _entry_points() if ep.name == name]
    if not found:
        known = ", ".join(sorted(available_environments())) or "none installed"
        raise ConfigError(
            f"no environment {name!r} in entry-point group {ENTRY_POINT_GROUP!r} (installed: {known}); "
            "install the package that registers it", parameter="train.environment", value=name,
        )
    factory = found[0].load()
    try:
        env = factory(**(options or {}))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"environment {name!r} refused its options {options or {}}: {exc}",
                          parameter="train.environment_options", value=options) from None
    if not isinstance(env, Environment):
        raise ConfigError(f"entry point {found[0].value} for environment {name!r} does not build an "
                          "Environment (needs name, parse_row, row_id, rollout)", parameter="train.environment",
                          value=name)
    return env
