"""generate() with its sandboxes on a sandbox node over SSH, and the node dying mid-rollout: the rollout is
``sandbox_lost`` (infrastructure, never trained on), saved with its events, and `lego sandbox gc` collects
what it left on the node once the node is back.

Real: the second host (tests/support/sshnode.py: an sshd in its own network namespace behind a veth pair),
OpenSSH, the sunabako SDK and node, the rollout (run directory, adapter session, workspace preparation of
the example task, snapshot, salvage, close). The harness is a TEST DOUBLE (``HoldingHarness``): the node's
network namespace cannot reach this host's adapter, so instead of a CLI it holds one long command in the
sandbox, the way an agent's tool call does, while the node dies.

The red team (a policy must not earn ``sandbox_lost``, an exclusion from training): the policy's tool calls
print OpenSSH's own error text, exit 255 (ssh's status for its own failure), kill their shell, kill every
process of the agent user, and finally run the sandbox over its memory limit so that the node's supervisor
kills it. Every one of those is the policy's doing: ``agent_error_exit``, graded.

Time: one create on the node and the workspace preparation over SSH; 60-120 s at load ~20 on 2 cores
(the red team: ~25 s on an idle machine)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import ROOTFS, make_context, missing, spec_for
from support.sshnode import SshNode, missing_requirements, ssh_node

from lego_rl.adapter.sessions import SessionRegistry
from lego_rl.harness.models import HarnessOutcome, RunRequest
from lego_rl.harness.toolchain import Toolchain
from lego_rl.rollout.generate import generate
from lego_rl.runstore import read_events
from lego_rl.runstore.events import ArtifactNotSaved, RolloutFinished, StageFinished
from lego_rl.sandbox.base import Sandbox
from lego_rl.sandbox.sunabako_admin import gc_nodes, list_nodes, nodes_for
from lego_rl.swe.task_sandbox import SandboxTarget
from lego_rl.termination import TerminationReason

pytestmark = [pytest.mark.slow, pytest.mark.root]


class HoldingHarness:
    """TEST DOUBLE of a HarnessHandle: ``run`` holds ``sleep 120`` in the sandbox (as the agent user) and
    sets ``holding`` once it has started, so the test can take the node away under it."""

    name = "double"

    def __init__(self) -> None:
        self.holding = asyncio.Event()

    def adapter_options(self) -> dict[str, Any]:
        return {"protocol": "chat"}

    async def install(self, sandbox: Sandbox, toolchain: Toolchain) -> None:
        return None

    async def verify(self, sandbox: Sandbox, user: str = "agent") -> str:
        return "double 1.0"

    async def artifacts(self, sandbox: Sandbox, request: RunRequest) -> dict[str, bytes]:
        return {}

    async def run(self, sandbox: Sandbox, request: RunRequest) -> HarnessOutcome:
        start = time.monotonic()
        self.holding.set()
        res = await sandbox.exec("sleep 120", user=request.user, cwd=request.workdir, timeout=request.time_budget_s)
        return HarnessOutcome(harness=self.name, exit_code=res.exit_code, duration_s=time.monotonic() - start)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SshNode]:
    if (why := missing_requirements()) is not None:
        missing(f"{why} (make system-deps)")
    if not Path(ROOTFS, ".lego-rootfs-stamp").is_file():
        missing(f"no test rootfs at {ROOTFS}: run scripts/build_rootfs.sh")
    with ssh_node(tmp_path / "node") as n:
        n.init_sunabako(uid_range_size=65536, allow_unbounded_memory_for_tests=True)
        yield n


async def test_a_node_that_dies_mid_rollout_is_sandbox_lost_and_gc_collects_it(
    node: SshNode, example_rows: dict[str, Any], tmp_path: Path
) -> None:
    harness = HoldingHarness()
    options = {"cluster": str(node.cluster_json), "ssh_config": str(node.ssh_config), "allow_test_memory": True}
    ctx = make_context(tmp_path / "run", SessionRegistry(), "http://127.0.0.1:9", Toolchain(Path("/nonexistent")),
                       harness_for=lambda name: harness, provider="sunabako", provider_options=options,
                       sandbox_options={"network": "none"})

    async def take_the_node_away() -> None:
        await harness.holding.wait()
        await asyncio.sleep(1.5)  # the command is running on the node
        node.kill_node()

    killer = asyncio.create_task(take_the_node_away())
    result = await generate(ctx, spec_for(example_rows["lego-example-median"], "double", "remote-lost"))
    await killer
    ctx.run.close()
    assert result.termination is TerminationReason.SANDBOX_LOST and result.infrastructure_failure, result.detail
    assert "node sandbox-0" in result.detail and "stopped answering over SSH" in result.detail
    assert result.reward is None
    events = [e for e in read_events(tmp_path / "run" / "events.jsonl") if getattr(e, "rollout_id", None) == "remote-lost"]
    stages = {(e.stage, e.status) for e in events if isinstance(e, StageFinished)}
    assert {("sandbox_setup", "ok"), ("agent", "failed")} <= stages  # the sandbox was set up on the node
    finished = [e for e in events if isinstance(e, RolloutFinished)]
    assert len(finished) == 1 and finished[0].termination is TerminationReason.SANDBOX_LOST

    node.start_sshd()  # back: the rollout's sandbox is still recorded there
    nodes = nodes_for(cluster=str(node.cluster_json), ssh_config=str(node.ssh_config))
    [row] = await list_nodes(nodes)
    assert row["state"] in ("dead", "failed"), row
    assert await gc_nodes(nodes) == [f"sandbox-0/{row['id']}"]
    assert await list_nodes(nodes) == []


# The policy's tool calls, one a line: each is the agent's own doing, however much it looks like a lost link.
IMPOSTOR_CALLS = [
    # OpenSSH's texts for a dead node, and ssh's own exit status for a failure of its own.
    "echo 'ssh: connect to host 10.251.0.2 port 22: Connection refused' >&2; "
    "echo 'Connection to 1.2.3.4 closed by remote host.' >&2; exit 255",
    "echo 'client_loop: send disconnect: Broken pipe' >&2; kill -9 $$",  # its own shell
    "echo 'kex_exchange_identification: Connection closed by remote host' >&2; kill -9 -1",  # all it may signal
    "head -c 1500M /dev/zero | tail",  # one 1.5 GB line held in memory: over the sandbox's limit
]


class ToolCallingHarness:
    """TEST DOUBLE of a CLI: asks the adapter for the policy's answer (from this host: the node's network
    namespace cannot reach the adapter), runs each of its lines in the sandbox as the agent user, the way a
    CLI runs tool calls, and exits with the status of the last one, as a CLI that gives up does."""

    name = "double"

    def __init__(self) -> None:
        self.exits: list[int] = []

    def adapter_options(self) -> dict[str, Any]:
        return {"protocol": "chat"}

    async def install(self, sandbox: Sandbox, toolchain: Toolchain) -> None:
        return None

    async def verify(self, sandbox: Sandbox, user: str = "agent") -> str:
        return "double 1.0"

    async def artifacts(self, sandbox: Sandbox, request: RunRequest) -> dict[str, bytes]:
        return {}

    async def run(self, sandbox: Sandbox, request: RunRequest) -> HarnessOutcome:
        start = time.monotonic()
        body = {"model": request.model, "messages": [{"role": "user", "content": request.prompt}], "max_tokens": 512}
        async with aiohttp.ClientSession() as http, http.post(
                f"{request.base_url}/v1/chat/completions", json=body,
                headers={"Authorization": f"Bearer {request.session_id}"}) as answer:
            assert answer.status == 200, await answer.text()
            content = json.loads(await answer.text())["choices"][0]["message"]["content"]
        for line in content.strip().splitlines():
            res = await sandbox.exec(line, user=request.user, cwd=request.workdir, timeout=60)
            self.exits.append(res.exit_code)
        return HarnessOutcome(harness=self.name, exit_code=self.exits[-1], duration_s=time.monotonic() - start)


async def test_a_policy_that_imitates_a_lost_node_is_not_sandbox_lost(
    node: SshNode, scripted_stack: Any, example_rows: dict[str, Any], tmp_path: Path
) -> None:
    """Its calls print OpenSSH's loss messages, exit 255, kill their shell and every process they may: the
    node still answers, so none is a loss. Then it runs the sandbox over its memory limit and the node's
    supervisor kills the sandbox: that was labelled sandbox_lost (the policy escaped its penalty), and is
    the policy's outcome, graded as a change of nothing (the sandbox, and its workspace, are gone)."""
    stack = await scripted_stack(lambda prompt, index: "\n".join(IMPOSTOR_CALLS), score=False)
    harness = ToolCallingHarness()
    options = {"cluster": str(node.cluster_json), "ssh_config": str(node.ssh_config), "allow_test_memory": True}
    ctx = make_context(tmp_path / "run", stack.sessions, stack.url, Toolchain(Path("/nonexistent")),
                       harness_for=lambda name: harness, provider="sunabako", provider_options=options,
                       sandbox_options={"network": "none", "memory_mb": 512},
                       grader_sandbox=SandboxTarget("bwrap", {}, {"network": "none"}))
    result = await generate(ctx, spec_for(example_rows["lego-example-median"], "double", "impostor"))
    ctx.run.close()
    assert harness.exits == [255, 137, 137], result.detail  # the first three ran and came back
    assert result.termination is TerminationReason.AGENT_ERROR_EXIT and not result.infrastructure_failure, \
        result.detail
    assert "memory limit (memory_limit_exceeded" in result.detail and "the CLI died after" in result.detail
    assert result.reward == 0.0  # graded: the median is still unfixed
    events = [e for e in read_events(tmp_path / "run" / "events.jsonl") if getattr(e, "rollout_id", None) == "impostor"]
    [lost_patch] = [e for e in events if isinstance(e, ArtifactNotSaved) and e.name == "patch.diff"]
    assert "SandboxLimitExceeded" in lost_patch.error
    nodes = nodes_for(cluster=str(node.cluster_json), ssh_config=str(node.ssh_config))
    assert await list_nodes(nodes) == []  # the killed sandbox was still deleted
