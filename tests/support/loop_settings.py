"""Loop and SFT settings for tests and benchmarks that build the driver by hand.

The driver's settings have no defaults of their own: a run's come from ``compose.projection``, and so do these,
from a config with every key at its default. A test states only what it studies; every other value is the one
a user gets from an empty ``lego.toml``, never a second default written here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from lego_rl.compose.projection import loop_settings, sft_settings
from lego_rl.config.schema import LegoConfig
from lego_rl.driver.loop import LoopSettings
from lego_rl.driver.sft import SftSettings


def default_loop_settings(**overrides: Any) -> LoopSettings:
    """The projection of a default config, with ``overrides`` (field names of ``LoopSettings``)."""
    return dataclasses.replace(loop_settings(LegoConfig()), **overrides)


def default_sft_settings(**overrides: Any) -> SftSettings:
    """The projection of a default config, with ``overrides`` (field names of ``SftSettings``)."""
    return dataclasses.replace(sft_settings(LegoConfig()), **overrides)
