"""From the resolved config to RolloutSettings: one projection, the config's defaults only."""

from __future__ import annotations

import dataclasses

from lego_rl.config.resolve import resolve
from lego_rl.config.schema import DEFAULT_PROMPT, SandboxConfig
from lego_rl.orchestrate.rollout_check import settings_from_config
from lego_rl.rollout.settings import RolloutSettings


def test_grader_on_another_provider_gets_its_own_options() -> None:
    r = resolve(
        environ={"SUNABAKO_ALLOW_TEST_MEMORY": "1"},
        overrides=['sandbox.provider="sunabako"', 'grader.provider="bwrap"'],
    )
    s = settings_from_config(r)
    assert (s.agent_sandbox.provider, dict(s.agent_sandbox.provider_options)) == (
        "sunabako",
        {"allow_test_memory": True},
    )
    assert (s.grader_sandbox.provider, dict(s.grader_sandbox.provider_options)) == ("bwrap", {})
    same = settings_from_config(resolve(environ={"SUNABAKO_ALLOW_TEST_MEMORY": "0"}))
    assert same.grader_sandbox == same.agent_sandbox
    assert dict(same.agent_sandbox.provider_options) == {"allow_test_memory": False}


def test_defaults_are_the_configs_and_every_sandbox_gets_memory_and_network() -> None:
    r = resolve(
        environ={},
        overrides=[
            "sandbox.memory_mb=4096",
            'sandbox.network="none"',
            "sandbox.boot_concurrency=3",
            "model.chat_template_kwargs={a = 1}",
        ],
    )
    s = settings_from_config(r)
    assert s.agent_sandbox.provider == SandboxConfig().provider  # no second default ("bwrap") in rollout/
    assert s.prompt_template == DEFAULT_PROMPT
    for target in (s.agent_sandbox, s.grader_sandbox):
        assert dict(target.sandbox_options) == {"memory_mb": 4096, "network": "none"}
    assert s.boot_concurrency == 3 and s.template_kwargs == r.config.model.chat_template_kwargs
    assert s.template_kwargs["a"] == 1


def test_settings_have_no_defaults_of_their_own_for_config_values() -> None:
    own = {
        f.name
        for f in dataclasses.fields(RolloutSettings)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    }
    assert own == {"template_kwargs", "trajectory", "agent_user"}


def test_what_the_adapter_captures_the_trajectory_requires() -> None:
    off = settings_from_config(resolve(environ={}))
    assert (off.trajectory.require_nucleus, off.trajectory.require_routing) == (False, False)
    on = settings_from_config(
        resolve(environ={}, overrides=["rollout.capture_nucleus=true", "rollout.use_rollout_routing_replay=true"])
    )
    assert (on.trajectory.require_nucleus, on.trajectory.require_routing) == (True, True)
