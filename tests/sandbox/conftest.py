"""Fixtures for the sandbox contract tests (see sandbox_helpers for what each provider needs)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from sandbox_helpers import MakeSandbox, check_available, image_for, provider_options

from lego_rl.sandbox import ImageSpec, Sandbox, create_sandbox


@pytest.fixture(params=["bwrap", "sunabako", "e2b"])
def provider_name(request: pytest.FixtureRequest) -> str:
    check_available(request.param)
    return str(request.param)


@pytest.fixture
async def make_sandbox(provider_name: str) -> AsyncIterator[MakeSandbox]:
    """Create sandboxes of the provider under test; every one is closed at teardown."""
    made: list[Sandbox] = []

    async def make(image: ImageSpec | None = None, **options: Any) -> Sandbox:
        sb = await create_sandbox(
            image or image_for(provider_name),
            provider=provider_name,
            provider_options=provider_options(provider_name),
            **options,
        )
        made.append(sb)
        return sb

    yield make
    for sb in made:
        await sb.close()
