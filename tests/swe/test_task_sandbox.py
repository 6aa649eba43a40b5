"""One path opens a task's sandbox (agent, grader, `lego tasks check`): per-sandbox options reach the
provider, and the row's repository is unpacked in it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

import pytest

from lego_rl.sandbox import ExecResult, ImageSpec, Sandbox, SandboxProvider, factory
from lego_rl.swe.check import check_task
from lego_rl.swe.task_sandbox import SandboxTarget, task_sandbox_opener
from lego_rl.tasks.rows import load_tasks

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"


class _Sandbox(Sandbox):
    """TEST DOUBLE: every command fails, so the grader stops at its first step."""

    def __init__(self, image: ImageSpec) -> None:
        self.id, self.image = "double", image

    async def exec(self, cmd: Any, **kw: Any) -> ExecResult:
        return ExecResult(1, "", "test double")

    async def write_file(self, path: str, content: Any, *, user: str | None = None) -> None:
        pass

    async def read_file(self, path: str, *, user: str | None = None) -> bytes:
        return b""

    async def close(self) -> None:
        pass


class RecordingProvider(SandboxProvider):
    """TEST DOUBLE provider: records the constructor and per-sandbox options it was given."""

    name = "recording"
    created: ClassVar[list[tuple[dict[str, Any], dict[str, Any]]]] = []

    def __init__(self, **options: Any) -> None:
        self.ctor = options

    async def create(self, image: ImageSpec, **options: Any) -> Sandbox:
        RecordingProvider.created.append((self.ctor, options))
        return _Sandbox(image)

    async def aclose(self) -> None:
        pass


async def test_tasks_check_gives_the_provider_the_sandbox_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(factory.BUILTIN_PROVIDERS, "recording", f"{__name__}:RecordingProvider")
    RecordingProvider.created.clear()
    row = load_tasks(EXAMPLES / "tasks.jsonl").rows[0]
    # The example rows ship their repositories; the double cannot unpack one, so the row names none.
    row = row.model_copy(update={"metadata": row.metadata.model_copy(update={"repo_archive": None})})
    images = {row.metadata.image: ImageSpec(name="x", rootfs="/")}
    verdict = await check_task(
        row,
        provider="recording",
        provider_options={"node": "n1"},
        images=images,
        sandbox_options={"memory_mb": 1024, "network": "none"},
    )
    assert verdict.verdict == "setup error"  # the double fails every command, first the agent workspace's
    assert RecordingProvider.created[0] == ({"node": "n1"}, {"memory_mb": 1024, "network": "none"})


@pytest.mark.root
@pytest.mark.parametrize("network", ["none", "host"])
async def test_the_opener_seeds_the_repository_and_applies_the_network_option(network: str) -> None:
    from lego_rl.images.importer import load_images_json

    row = next(
        r
        for r in load_tasks(EXAMPLES / "tasks.jsonl").rows
        if r.metadata.instance_id == "lego-example-median"
    )
    if not Path(load_images_json(EXAMPLES / "images.json")[row.metadata.image].rootfs or "").is_dir():
        pytest.skip("the example rootfs is not built (scripts/build_rootfs.sh)")
    opener = task_sandbox_opener(
        row.metadata,
        SandboxTarget("bwrap", {}, {"network": network}),
        images=load_images_json(EXAMPLES / "images.json"),
        dataset_dir=EXAMPLES,
    )
    async with opener() as sb:
        ls = await sb.exec(["ls", row.metadata.workdir], timeout=30)
        netns = await sb.exec(["readlink", "/proc/self/ns/net"], timeout=30)
    assert "stats" in ls.stdout.split(), ls
    # Compare namespaces, not interface lists: another test module may have caged this process in a
    # loopback-only namespace (tests/rollout's session fixture), where "host" also shows only `lo`.
    ours = os.readlink("/proc/thread-self/ns/net")
    assert netns.exit_code == 0, netns
    assert (netns.stdout.strip() == ours) is (network == "host"), (netns.stdout, ours)
