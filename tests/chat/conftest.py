"""Shared fixtures for rendering tests: the real tiny model's tokenizer and chat template."""

from __future__ import annotations

import pytest

from lego_rl.chat.render import ChatRenderer
from lego_rl.serving.tiny_model import ensure_tiny_model


@pytest.fixture(scope="session")
def renderer() -> ChatRenderer:
    return ChatRenderer.from_pretrained(ensure_tiny_model())
