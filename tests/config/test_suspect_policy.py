"""``grader.suspect_policy``: validated, ``zero`` by default, and carried to the rollout's settings."""

from __future__ import annotations

import pytest

from lego_rl.compose.rollout_check import settings_from_config
from lego_rl.config.resolve import resolve
from lego_rl.errors import ConfigError


def test_default_is_zero_and_keep_reaches_the_rollout_settings() -> None:
    assert resolve(environ={}).config.grader.suspect_policy == "zero"
    assert settings_from_config(resolve(environ={})).suspect_policy == "zero"
    keep = resolve(environ={}, overrides=['grader.suspect_policy="keep"'])
    assert settings_from_config(keep).suspect_policy == "keep"


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(ConfigError, match="suspect_policy"):
        resolve(environ={}, overrides=['grader.suspect_policy="ignore"'])
