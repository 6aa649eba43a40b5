"""Image import tests run the real skopeo and umoci (scripts/setup_tasks.sh installs them)."""

from __future__ import annotations

import os
import shutil

import pytest


@pytest.fixture(autouse=True)
def _oci_tools() -> None:
    missing = [t for t in ("skopeo", "umoci") if shutil.which(t) is None]
    if missing:
        reason = f"{', '.join(missing)} not installed: run scripts/setup_tasks.sh"
        if os.environ.get("LEGO_SKIP_MISSING_SETUP") == "1":
            pytest.skip(reason)
        pytest.fail(f"{reason} (set LEGO_SKIP_MISSING_SETUP=1 to skip instead)")
