"""R3 on the trainer: the engine's routed experts travel with the Samples and the torch backend replays them.

The end-to-end test is all real components: the embedded engine (bf16, over HTTP, routes returned) serves
two-turn rollouts of the tiny Qwen3-MoE, the trajectory manager assembles the Samples, the batcher packs
them and the torch backend (fp32) recomputes the trained tokens' logprobs. Replay must bring them closer
to the rollout's than free routing, and a misaligned replay (the negative control) must be worse than
both. The rest are the refusals: routes that do not belong to the tokens or the model are never trained.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
import torch

from lego_rl.errors import ConfigError, TrajectoryError
from lego_rl.driver.environments import Completion
from lego_rl.serving.client import ServingClient
from lego_rl.serving.protocol import GenerateResult, SamplingParams
from lego_rl.serving.routing import RouterRecorder
from lego_rl.serving.server import EmbeddedServer
from lego_rl.serving.tiny_model import MOE_SHAPE, ensure_tiny_model
from lego_rl.trajectory.manager import TrajectoryOptions, build_samples
from lego_rl.trajectory.records import TurnRecord
from lego_rl.trajectory.sample import PromptRoutingSnapshot, Sample
from lego_rl.train.backend import LossInputs, LossOutput
from lego_rl.train.batching import MicroBatch, plan_steps
from lego_rl.train.routing_replay import sample_routes
from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings

LAYERS = 4  # the tiny model's decoder layers, every one routed
K = int(MOE_SHAPE["num_experts_per_tok"])
E = int(MOE_SHAPE["num_experts"])


@pytest.fixture(scope="module")
def moe_model() -> Path:
    return ensure_tiny_model(moe=True)


def record(turn: int, prompt: list[int], r: GenerateResult, mode: str, bridge: int) -> TurnRecord:
    return TurnRecord(session_id="s", turn=turn, protocol="chat", prompt_ids=prompt, output_ids=r.output_ids,
                      logprobs=r.logprobs, render_mode=mode, bridge_prefix_len=bridge,  # type: ignore[arg-type]
                      finish_reason=r.finish_reason, routed_experts=r.routed_experts,
                      prompt_routed_experts=r.prompt_routed_experts)


async def two_turn_rollouts(model: Path, n: int, tokens: int) -> list[Sample]:
    rng = random.Random(0)
    sp = SamplingParams(max_tokens=tokens, temperature=1.0, ignore_eos=True, logprobs=1)
    async with EmbeddedServer(model, dtype="bfloat16", return_routed_experts=True) as server, \
            ServingClient([server.url]) as client:
        async def one(i: int) -> Sample:
            p0 = [rng.randrange(3, 500) for _ in range(24)]
            r0 = await client.generate(p0, sp.model_copy(update={"seed": 2 * i}), return_routed_experts=True)
            p1 = p0 + r0.output_ids + [rng.randrange(3, 500) for _ in range(16)]
            r1 = await client.generate(p1, sp.model_copy(update={"seed": 2 * i + 1}), return_routed_experts=True)
            recs = [record(0, p0, r0, "full", 0), record(1, p1, r1, "bridged", len(p0) + len(r0.output_ids))]
            (s,), _ = build_samples(recs, rollout_id=f"r{i}", group_index=i, index=0, reward=1.0,
                                    options=TrajectoryOptions(require_routing=True))
            return s
        return list(await asyncio.gather(*(one(i) for i in range(n))))


@pytest.fixture(scope="module")
def rollouts(moe_model: Path) -> list[Sample]:
    return asyncio.run(two_turn_rollouts(moe_model, n=4, tokens=24))


def shifted(s: Sample) -> Sample:
    """Negative control: each position replays its predecessor's route (still complete, so not refused)."""
    assert s.routed_experts is not None
    out = [s.routed_experts[0]] + s.routed_experts[:-1]
    out = [r or out[i - 1] or out[i + 1] for i, r in enumerate(out)]
    snaps = [p.model_copy(update={"routes": [p.routes[0]] + p.routes[:-1]}) for p in s.prompt_routing]
    return s.model_copy(update={"routed_experts": out, "prompt_routing": snaps})


def abs_gap(backend: TorchBackend, samples: list[Sample]) -> float:
    """Mean |trainer - rollout| logprob over every trained token."""
    (step,) = plan_steps(samples, [0.0] * len(samples), max_tokens_per_micro_batch=2048)
    gaps = []
    for mb, lp in zip(step.micro_batches, backend.compute_logprobs(step.micro_batches, temperature=1.0),
                      strict=True):
        m = mb.loss_mask > 0  # [T]
        gaps.append((lp[m] - mb.rollout_logprobs[m]).abs())  # [n_trained]
    return float(torch.cat(gaps).mean())


def test_replay_brings_trainer_logprobs_closer_to_the_rollout(moe_model: Path, rollouts: list[Sample]) -> None:
    samples = rollouts
    s = samples[0]
    assert s.routed_experts is not None and len(s.prompt_routing) == 2
    free = abs_gap(TorchBackend(moe_model, TorchTrainSettings(lr=1e-5, device="cpu")), samples)
    replayer = TorchBackend(moe_model, TorchTrainSettings(lr=1e-5, device="cpu", routing_replay=True))
    replayed = abs_gap(replayer, samples)
    misaligned = abs_gap(replayer, [shifted(x) for x in samples])
    # Measured 0.054 free, 0.016 replayed, 0.90 misaligned (benchmarks/routing_replay_bench.py, 8 rollouts).
    assert replayed < 0.6 * free, (free, replayed)
    assert misaligned > 2 * free, (free, misaligned)

    # The replayed forward really routes as the rollout did, position by position.
    experts, valid = sample_routes(s) or (None, None)
    assert experts is not None and valid is not None
    seen = RouterRecorder(replayer.model, K)
    (step,) = plan_steps([s], [0.0], max_tokens_per_micro_batch=2048)
    replayer.compute_logprobs(step.micro_batches, temperature=1.0)
    got = seen.take().long()  # [n, L, K]
    assert torch.equal(got[valid], experts[valid])


def test_environment_sampler_carries_routes_into_its_samples(moe_model: Path) -> None:
    """The ``lego train`` environment path: ``Sampler`` asks for routes, ``completion_sample`` keeps the output
    routes per token and the prompt's as a snapshot, and the replaying trainer accepts and uses them."""
    from lego_rl.chat.render import ChatRenderer
    from lego_rl.driver.environments import Sampler, completion_sample
    from lego_rl.termination import TerminationReason

    prompt = [5, 17, 240, 33, 9, 71]

    async def sample_once() -> Completion:
        async with EmbeddedServer(moe_model, return_routed_experts=True) as server, \
                ServingClient([server.url]) as client:
            sampler = Sampler(client, ChatRenderer.from_pretrained(moe_model), temperature=1.0, top_p=1.0,
                              top_k=-1, max_tokens=12, capture_routing=True)
            return await sampler.complete(prompt)

    c = asyncio.run(sample_once())
    assert c.routed_experts is not None and len(c.routed_experts) == len(c.output_ids)
    s = completion_sample(c, rollout_id="r0", group_index=2, index=0, reward=1.0,
                          termination=TerminationReason.COMPLETED)
    assert [(p.turn, p.prompt_len, p.group_index) for p in s.prompt_routing] == [(0, len(prompt), 2)]
    got = sample_routes(s)
    assert got is not None
    assert got[1].tolist() == [True] * (len(s.tokens) - 1) + [False]  # all but the never-forwarded last id
    replayer = TorchBackend(moe_model, TorchTrainSettings(lr=1e-5, device="cpu", routing_replay=True))
    (step,) = plan_steps([s], [1.0], max_tokens_per_micro_batch=256)
    (lp,) = replayer.compute_logprobs(step.micro_batches, temperature=1.0)
    m = step.micro_batches[0].loss_mask > 0  # [T]
    # fp32 engine and trainer on the engine's own routes: the same numbers up to summation order.
    assert float((lp[m] - step.micro_batches[0].rollout_logprobs[m]).abs().max()) < 1e-3


def weighted_logprob_loss(inp: LossInputs) -> LossOutput:
    return LossOutput(loss=-(inp.token_weights * inp.logprobs).sum())


def test_replayed_train_step_with_checkpointing_trains_the_routers(moe_model: Path, rollouts: list[Sample]) -> None:
    samples = rollouts[:1]
    backend = TorchBackend(moe_model, TorchTrainSettings(lr=1e-3, device="cpu", routing_replay=True,
                                                         gradient_checkpointing=True))
    (step,) = plan_steps(samples, [1.0], max_tokens_per_micro_batch=2048)
    old = backend.compute_logprobs(step.micro_batches, temperature=1.0)
    gate = backend.model.model.layers[0].mlp.gate.weight
    before = gate.detach().clone()
    result = backend.train_step(step, weighted_logprob_loss, old_logprobs=old, temperature=1.0)
    assert result.weight_version == 1 and torch.isfinite(torch.tensor(result.metrics["grad_norm"]))
    assert not torch.equal(before, gate.detach())  # the router weights got a gradient through the replay


# ------------------------------------------------------------------------------------------- refusals


def route(tag: int) -> list[list[int]]:
    return [[(tag + layer) % E, (tag + layer + 1) % E] for layer in range(LAYERS)]  # [L][K]


def sample(n_prompt: int = 4, n_out: int = 3, **update: object) -> Sample:
    """A one-turn sample with complete, well-formed routes (prompt snapshot + outputs, last one unrouted)."""
    n = n_prompt + n_out
    out_routes: list[list[list[int]]] = [[] for _ in range(n_prompt)] + [route(100 + i) for i in range(n_out - 1)]
    fields: dict[str, object] = dict(
        rollout_id="r0", group_index=3, index=0, tokens=list(range(10, 10 + n)),
        loss_mask=[0] * n_prompt + [1] * n_out, rollout_logprobs=[0.0] * n_prompt + [-0.5] * n_out,
        routed_experts=out_routes + [[]],
        prompt_routing=[PromptRoutingSnapshot(rollout_id="r0", group_index=3, turn=0, prompt_len=n_prompt,
                                              routes=[route(i) for i in range(n_prompt)])],
    )
    fields.update(update)
    return Sample.model_validate(fields)


def test_each_position_gets_the_route_of_the_forward_that_first_computed_it() -> None:
    # Turn 0: prompt [0, 4), outputs 4..6; turn 1's snapshot covers [0, 9) with other routes for [0, 4).
    later = PromptRoutingSnapshot(rollout_id="r0", group_index=3, turn=1, prompt_len=9,
                                  routes=[route(50 + i) for i in range(9)])
    s = sample(n_prompt=4, n_out=3)
    s = s.model_copy(update={"tokens": s.tokens + [1, 2, 3], "loss_mask": s.loss_mask + [0, 0, 0],
                             "rollout_logprobs": s.rollout_logprobs + [0.0] * 3,
                             "routed_experts": (s.routed_experts or []) + [[], [], []],
                             "prompt_routing": [later, *s.prompt_routing]})  # out of turn order on purpose
    got = sample_routes(s)
    assert got is not None
    experts, valid = got
    assert valid.tolist() == [True] * 9 + [False]  # position 9 was never forwarded
    assert experts[0].tolist() == route(0)  # the earliest snapshot, not turn 1's
    assert experts[4].tolist() == route(100)  # an output keeps its own decode route
    assert experts[6].tolist() == route(56)  # the last output id of turn 0: turn 1's prefill routed it
    assert experts[7].tolist() == route(57)


@pytest.mark.parametrize(
    ("update", "needle"),
    [
        ({"group_index": 4}, "belongs to rollout 'r0' group 3, not to this sample's group 4"),
        ({"routed_experts": [[], [], [], [], [[1, 2]] * 3, [], []]}, 
         r"turn 0 prompt routing.*shape \(4, 4, 2\), the sample's other routes are \[\*, 3 layers, top-2\]"),
        ({"routed_experts": [[], [], [], [], [[1, 1]] * LAYERS, [], []]}, "position 4 names one expert twice"),
        ({"routed_experts": [[], [], [], [], [[-1, 2]] * LAYERS, [], []]}, "negative expert id .* position 4"),
    ],
)
def test_routes_that_do_not_fit_their_tokens_are_refused(update: dict[str, object], needle: str) -> None:
    bad = sample().model_copy(update=update)
    with pytest.raises(TrajectoryError, match=needle):
        plan_steps([bad], [1.0], max_tokens_per_micro_batch=64)


def one_micro_batch(*samples: Sample) -> list[MicroBatch]:
    (step,) = plan_steps(list(samples), [1.0] * len(samples), max_tokens_per_micro_batch=256)
    return step.micro_batches


@pytest.fixture(scope="module")
def replaying(moe_model: Path) -> TorchBackend:
    return TorchBackend(moe_model, TorchTrainSettings(lr=1e-5, device="cpu", routing_replay=True))


def test_routes_the_model_cannot_replay_are_refused(replaying: TorchBackend) -> None:
    three_layers = [x[:3] for x in (sample().routed_experts or [])]
    snap = sample().prompt_routing[0]
    wrong_model = sample(routed_experts=three_layers, prompt_routing=[snap.model_copy(
        update={"routes": [r[:3] for r in snap.routes]})])
    with pytest.raises(ValueError, match="3 layers, top-2.*4 MoE layers with top-2"):
        replaying.compute_logprobs(one_micro_batch(wrong_model), temperature=1.0)
    too_big = sample(routed_experts=[[], [], [], [], [[E, 0]] * LAYERS, [], []])
    with pytest.raises(ValueError, match=f"expert {E} but the model has {E} experts"):
        replaying.compute_logprobs(one_micro_batch(too_big), temperature=1.0)


def test_a_trained_token_with_an_unrouted_prefix_is_refused(replaying: TorchBackend) -> None:
    lost = sample(routed_experts=[[], [], [], [], [], [], []])  # output routes lost: position 4 unrouted
    with pytest.raises(ValueError, match="input sample 1 has no route at position 4, before its trained token"):
        replaying.compute_logprobs(one_micro_batch(sample(rollout_id="a", prompt_routing=[
            sample().prompt_routing[0].model_copy(update={"rollout_id": "a"})]), lost), temperature=1.0)
    none = sample(routed_experts=None, prompt_routing=[])
    with pytest.raises(ValueError, match=r"routing replay is on .* samples \[0\] carry no routed experts"):
        replaying.compute_logprobs(one_micro_batch(none), temperature=1.0)
    # The last output id's missing route is fine: nothing trained depends on it.
    assert replaying.compute_logprobs(one_micro_batch(sample()), temperature=1.0)[0].shape == (7,)


def test_replay_on_a_dense_model_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no router modules"):
        TorchBackend(ensure_tiny_model(), TorchTrainSettings(lr=1e-5, device="cpu", routing_replay=True))
