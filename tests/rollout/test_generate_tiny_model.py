"""Each harness, driven by the plain random tiny model on the embedded engine, runs to a *policy*
termination (never an infrastructure failure), through the whole `lego rollout-check` path:
lego.toml resolved with overrides, ``serving_stack`` (embedded engine + client + adapter), the
run directory, generate(), the report. No test double anywhere."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import EXAMPLES, REPO, assert_nothing_running, interfaces, missing

from lego_rl.cli.options import load
from lego_rl.harness import Toolchain, get_harness, get_plugin_manager
from lego_rl.runstore import read_events
from lego_rl.termination import POLICY_OUTCOMES, TerminationReason

pytestmark = [pytest.mark.slow, pytest.mark.cli, pytest.mark.root]

HARNESSES = ["claude_code", "codex", "opencode", "openhands"]
BUDGET_S = {"claude_code": 60, "codex": 60, "opencode": 120, "openhands": 120}
"""Agent time budgets: OpenCode (a Bun binary) and the OpenHands SDK spend 30-60 s of a contended 2-core box
just starting up, before their first request."""
ROOTFS_TRIXIE = Path(os.environ.get("LEGO_ROOTFS_TRIXIE_CACHE", "/var/cache/lego-rl/rootfs-trixie"))
"""OpenHands needs Python >= 3.12 inside the sandbox; the bookworm rootfs has 3.11, so its tasks run on the
Debian trixie rootfs of scripts/build_rootfs_trixie.sh (python3.13, the plugin's default; same image name,
another root filesystem)."""


def tiny_overrides(run_root: Path, harness: str, toolchain: Toolchain) -> list[str]:
    images = []
    if harness == "openhands":
        if not (ROOTFS_TRIXIE / ".lego-rootfs-stamp").is_file():
            missing(f"no trixie rootfs at {ROOTFS_TRIXIE}: run scripts/build_rootfs_trixie.sh")
        pins = get_harness("openhands", environ={}, pm=get_plugin_manager({})).toolchain_pins()
        absent = [p.key for p in pins if p.key not in toolchain.lockfile().entries]
        if absent:
            missing(f"the toolchain at {toolchain.folder} lacks {absent}: run scripts/setup_toolchain.sh")
        spec = json.loads((EXAMPLES / "images.json").read_text())
        for image in spec.values():
            image["rootfs"] = str(ROOTFS_TRIXIE)
        (run_root.parent / "images-trixie.json").write_text(json.dumps(spec))
        images = [f'sandbox.images="{run_root.parent / "images-trixie.json"}"']
    return [
        *images,
        f'paths.run_root="{run_root}"',
        f'paths.toolchain_dir="{toolchain.folder}"',  # the toolchain the fixture checked ($LEGO_TOOLCHAIN_DIR)
        "model.max_response_tokens=64",
        "model.max_context_tokens=32768",
        "adapter.port=0",
        "serving.port=0",
        f"agent.time_budget_s={BUDGET_S[harness]}",
        "agent.max_turns=2",
        "grader.timeout_s=60",
        f'agent.default_harness="{harness}"',
    ]


@pytest.mark.parametrize("harness", HARNESSES)
async def test_tiny_model_reaches_a_policy_termination(
    harness: str, toolchain: Toolchain, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lego_rl.compose.sessions.check_session import RolloutCheckSession

    assert interfaces() == ["lo"]
    monkeypatch.chdir(REPO)  # lego.toml's relative paths (examples, toolchain) are the repository's
    r = load(REPO / "lego.toml", tiny_overrides(tmp_path / "run", harness, toolchain))
    session = RolloutCheckSession(r, ids=["lego-example-median"])
    report = await session.run(samples=1, harness=harness, concurrency=1, output=None)

    [result] = report.results
    assert result.termination in POLICY_OUTCOMES, (result.termination, result.detail)
    assert result.reward is not None  # graded: a policy outcome keeps its verifier reward
    if result.termination is not TerminationReason.TIME_BUDGET:  # a slow start may leave no whole turn
        assert result.turns >= 1 and result.samples, result.detail
    for sample in result.samples:
        assert len(sample.tokens) == len(sample.loss_mask) == len(sample.rollout_logprobs)
        assert 0 < sum(sample.loss_mask) <= 64 * result.turns
    out = tmp_path / "run" / "rollout-check"
    outcomes = [json.loads(line) for line in (out / "outcomes.jsonl").read_text().splitlines()]
    assert [o["termination"] for o in outcomes] == [result.termination.value]
    assert (out / "samples.jsonl").is_file()
    kinds = [e.kind for e in read_events(tmp_path / "run" / "events.jsonl")]
    assert kinds[:2] == ["run_started", "serving_ready"] and kinds[-1] == "rollout_check_finished"
    assert_nothing_running()
