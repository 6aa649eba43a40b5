"""From the resolved config to RolloutSettings."""

from __future__ import annotations


def test_grader_on_another_provider_gets_its_own_options() -> None:
    from lego_rl.config.resolve import resolve
    from lego_rl.rollout.check import settings_from_config

    r = resolve(environ={"SUNABAKO_ALLOW_TEST_MEMORY": "1"},
                overrides=['sandbox.provider="sunabako"', 'grader.provider="bwrap"'])
    s = settings_from_config(r)
    assert s.options_for("sunabako") == {"allow_test_memory": True}
    assert s.options_for("bwrap") == {}
    same = settings_from_config(resolve(environ={"SUNABAKO_ALLOW_TEST_MEMORY": "0"}))
    assert same.options_for("sunabako") == {"allow_test_memory": False}
