"""A full grade of the example task whose sandbox lives on a sandbox node reached over SSH: the node is a
real second host (tests/support/sshnode.py: an sshd in its own network namespace), the sandbox a real
sunabako one created there through the SDK's SSH transport, opened by the production path
(``task_sandbox_opener`` with the provider options ``lego`` derives from cluster.json + cluster.ssh_config).

Time: two creates on the node (a 212 MB rootfs copy each, over SSH) and two grades of ~10 execs, each exec
one SSH connection: 56 s measured at load ~4, 171 s at load ~20 on 2 shared cores (most of it creates losing
the start-up race and copying again)."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support.sshnode import missing_requirements, ssh_node
from swe_data import FIX_PATCH, WRONG_PATCH, require_setup, task_meta

from lego_rl.sandbox.base import ImageSpec, Sandbox
from lego_rl.sandbox.sunabako_provider import SunabakoSandbox
from lego_rl.swe import grade
from lego_rl.swe.task_sandbox import SandboxTarget, task_sandbox_opener

pytestmark = [pytest.mark.root, pytest.mark.slow]


async def test_grade_of_the_example_task_on_a_remote_node(task_image: tuple[ImageSpec, str], tmp_path: Path) -> None:
    require_setup("sunabako")
    if (why := missing_requirements()) is not None:
        pytest.fail(f"{why} (make system-deps)")
    spec = task_image[0]
    meta = task_meta()
    with ssh_node(tmp_path / "node") as node:
        node.init_sunabako(uid_range_size=65536, allow_unbounded_memory_for_tests=True)
        target = SandboxTarget("sunabako", {"cluster": str(node.cluster_json), "ssh_config": str(node.ssh_config),
                                            "allow_test_memory": True}, {"network": "none"})
        opener = task_sandbox_opener(meta, target, images={meta.image: spec})
        placed: list[tuple[str, str]] = []

        @contextlib.asynccontextmanager
        async def recording() -> AsyncIterator[Sandbox]:
            async with opener() as sb:
                assert isinstance(sb, SunabakoSandbox)
                placed.append((sb.node_name, sb.id))
                # It is in the node's state dir, reached through its sshd (the node's own namespace).
                seen = node.ssh(f"{node.binary} --state {node.state_dir} inspect {sb.id}")
                assert seen.returncode == 0 and json.loads(seen.stdout)["status"]["state"] == "running"
                yield sb

        good = await grade(meta, FIX_PATCH, open_sandbox=recording, timeout=120)
        assert (good.reward, good.solved, good.reason) == (1.0, True, "tests passed"), good.output[-2000:]
        wrong = await grade(meta, WRONG_PATCH, open_sandbox=recording, timeout=120)
        assert wrong.reward == 0.0 and "add(2, 3) returned 6" in wrong.output
        assert [name for name, _ in placed] == ["sandbox-0", "sandbox-0"]
        listed = subprocess.run([node.binary, "--state", str(node.state_dir), "list"], capture_output=True,
                                text=True, check=True)
        assert json.loads(listed.stdout) == []  # each grade destroyed its sandbox on the node
