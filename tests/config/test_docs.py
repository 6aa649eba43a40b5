"""docs/configuration.md lists every environment variable, with the key it sets."""

from __future__ import annotations

import re
from pathlib import Path

from lego_rl.config.envmap import ENV_VARS

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_every_variable_documented_with_its_key() -> None:
    rows = {}
    for line in DOC.read_text().splitlines():
        if m := re.match(r"\| `([A-Z0-9_]+)` \|[^|]*\| `([a-z0-9_.]+)` \|", line):
            rows[m.group(1)] = m.group(2)
    expected = {v.name: v.key for v in ENV_VARS}
    assert rows == expected


def test_shipped_toml_parses() -> None:
    from lego_rl.config.resolve import load_toml

    for path in Path(__file__).resolve().parents[2].glob("**/lego*.toml"):
        if ".venv" in path.parts or ".lego" in path.parts:
            continue
        load_toml(path)  # raises ConfigError on an unknown key or bad TOML
