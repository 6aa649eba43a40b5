"""A real CLI finishes a rollout when its sandbox reaches the adapter and nothing else (issue 18).

The agent sandbox gets the options ``settings_from_config`` builds for ``sandbox.network = "adapter"``:
``network="allowlist"`` with the adapter's endpoint only, and the grader ``network="none"``. The CLI
keeps the adapter URL it is given and reaches it through the egress relay (what else is refused is
tests/sandbox/test_egress.py's).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, assert_nothing_running, make_context, spec_for
from test_generate_scripted import policy_writing

from lego_rl.rollout.generate import generate
from lego_rl.sandbox.egress import url_endpoint
from lego_rl.termination import TerminationReason

pytestmark = [pytest.mark.slow, pytest.mark.cli, pytest.mark.root]

FIX = (EXAMPLES / "src/slugify/fix/textkit/slug.py").read_text()


@pytest.mark.parametrize("provider", ["bwrap", "sunabako"])
async def test_cli_reaches_the_adapter_through_the_relay(
    provider: str, scripted_stack: Any, toolchain: Any, example_rows: dict[str, Any], tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    extra: dict[str, Any] = {}
    if provider == "sunabako":
        node = request.getfixturevalue("sunabako_node")
        extra = {"provider": "sunabako", "grader_provider": "sunabako", "provider_options": node.provider_options}
    stack = await scripted_stack(policy_writing("codex", "textkit/slug.py", FIX), score=False)
    ctx = make_context(tmp_path / "run", stack.sessions, stack.url, toolchain,
                       sandbox_options={"network": "allowlist", "allow": [url_endpoint(stack.url)],
                                        "memory_mb": 2048}, **extra)
    ctx = dataclasses.replace(ctx, settings=_grader_offline(ctx.settings))
    result = await generate(ctx, spec_for(example_rows["lego-example-slugify"], "codex"))
    ctx.run.close()
    assert result.termination is TerminationReason.COMPLETED, result.detail
    assert result.reward == 1.0, (result.artifacts / "grader.log").read_text()[-2000:]
    assert result.turns == 2 and len(stack.engine.calls) == 2
    assert_nothing_running(stack.sessions)


def _grader_offline(settings: Any) -> Any:
    grader = dataclasses.replace(settings.grader_sandbox, sandbox_options={"network": "none", "memory_mb": 2048})
    return dataclasses.replace(settings, grader_sandbox=grader)
