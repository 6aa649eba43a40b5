"""Shared fixtures: the tiny model (built once, cached) and a running embedded server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from lego_rl.serving.tiny_model import ensure_tiny_model


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return ensure_tiny_model()


@pytest.fixture(scope="session")
def vocab_size(tiny_model: Path) -> int:
    return int(json.loads((tiny_model / "config.json").read_text())["vocab_size"])


@pytest.fixture(scope="session")
def im_end(tiny_model: Path) -> int:
    return int(json.loads((tiny_model / "config.json").read_text())["eos_token_id"])


@pytest.fixture
async def engine_url(tiny_model: Path) -> AsyncIterator[str]:
    from lego_rl.serving.server import embedded_server

    async with embedded_server(tiny_model) as url:
        yield url
