"""From the resolved config to RolloutSettings: one projection, the config's defaults only."""

from __future__ import annotations

import dataclasses

from lego_rl.config.resolve import resolve
from lego_rl.config.schema import DEFAULT_PROMPT, SandboxConfig
from lego_rl.compose.rollout_check import settings_from_config
from lego_rl.rollout.settings import RolloutSettings


def test_grader_on_another_provider_gets_its_own_options() -> None:
    r = resolve(
        environ={"SUNABAKO_ALLOW_TEST_MEMORY": "1"},
        overrides=['sandbox.provider="sunabako"', 'grader.provider="bwrap"'],
    )
    s = settings_from_config(r)
    assert (s.agent_sandbox.provider, dict(s.agent_sandbox.provider_options)) == (
        "sunabako",
        {"allow_test_memory": True, "state_dir": "/var/lib/sunabako"},
    )
    assert (s.grader_sandbox.provider, dict(s.grader_sandbox.provider_options)) == ("bwrap", {})
    same = settings_from_config(resolve(environ={"SUNABAKO_ALLOW_TEST_MEMORY": "0"}))
    assert same.grader_sandbox.provider_options == same.agent_sandbox.provider_options
    assert dict(same.agent_sandbox.provider_options) == {"allow_test_memory": False, "state_dir": "/var/lib/sunabako"}
    node = settings_from_config(resolve(environ={"SUNABAKO_ALLOW_TEST_MEMORY": "0"},
                                        overrides=['sandbox.sunabako_state_dir="/srv/node"']))
    assert node.agent_sandbox.provider_options["state_dir"] == "/srv/node"


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


def test_agent_reaches_only_the_adapter_where_it_is_local_and_the_grader_nothing() -> None:
    from lego_rl.sandbox.egress import Endpoint

    url = "http://127.0.0.1:18091"
    for provider, cluster in (("bwrap", None), ("sunabako", None)):
        env = {"SUNABAKO_ALLOW_TEST_MEMORY": "1"} | ({"SUNABAKO_CLUSTER": cluster} if cluster else {})
        s = settings_from_config(resolve(environ=env, overrides=[f'sandbox.provider="{provider}"']), url)
        assert dict(s.agent_sandbox.sandbox_options) == {
            "memory_mb": 2048, "network": "allowlist", "allow": (Endpoint("127.0.0.1", 18091),)}
        assert s.grader_sandbox.sandbox_options["network"] == "none"
    allowed = settings_from_config(resolve(environ={}, overrides=[
        'sandbox.provider="bwrap"', 'sandbox.network_allow=["10.1.2.3:3128", "127.0.0.1:18091"]']), url)
    assert allowed.agent_sandbox.sandbox_options["allow"] == (Endpoint("127.0.0.1", 18091), Endpoint("10.1.2.3", 3128))
    # A remote node cannot be confined from here: auto falls back to the host network; "adapter" is then
    # refused by the provider at create (tests/sandbox/test_egress.py).
    remote = settings_from_config(resolve(environ={"SUNABAKO_ALLOW_TEST_MEMORY": "1"}, overrides=[
        'sandbox.provider="sunabako"', 'sandbox.cluster="/etc/cluster.json"']), url)
    assert remote.agent_sandbox.sandbox_options["network"] == "host"
    host = settings_from_config(resolve(environ={}, overrides=['sandbox.network="host"']), url)
    assert host.agent_sandbox.sandbox_options["network"] == "host"
    assert host.grader_sandbox.sandbox_options["network"] == "none"


def test_bad_allowlist_entry_is_named() -> None:
    import pytest

    from lego_rl.errors import SandboxError

    r = resolve(environ={}, overrides=['sandbox.provider="bwrap"', 'sandbox.network_allow=["pypi.org:443"]'])
    with pytest.raises(SandboxError, match="sandbox.network_allow entry 'pypi.org:443'"):
        settings_from_config(r, "http://127.0.0.1:1")


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
