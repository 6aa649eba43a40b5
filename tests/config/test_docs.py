"""docs/configuration.md lists every environment variable, with the key it sets."""

from __future__ import annotations

import re
from pathlib import Path

from lego_rl.config.envmap import ENV_VARS

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_every_variable_documented_with_its_keys_and_aliases() -> None:
    rows = {}
    for line in DOC.read_text().splitlines():
        if m := re.match(r"\| `([A-Z0-9_]+)` \|([^|]*)\|([^|]*)\|", line):
            rows[m.group(1)] = (tuple(re.findall(r"`([A-Z0-9_]+)`", m.group(2))),
                                tuple(re.findall(r"`([a-z0-9_.]+)`", m.group(3))))
    expected = {v.name: (v.aliases, v.keys) for v in ENV_VARS}
    assert rows == expected


def test_unwired_keys_documented() -> None:
    from lego_rl.config.unwired import UNWIRED

    section = DOC.read_text().split("## Keys that are not implemented yet", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"`([a-z_]+\.[a-z_*]+)`", section))
    families = {k.split(".")[0] for k in listed if k.endswith(".*")}
    named = {k for k in listed if not k.endswith(".*")}
    expected = {k for k in UNWIRED if k.split(".")[0] not in families} | {"train.resume"}
    assert named == expected, "docs/configuration.md's list of unwired keys differs from config/unwired.py"
    for family in families:
        from lego_rl.config.schema import SECTIONS

        wired = {f"{family}.{f}" for f in SECTIONS[family].model_fields} - set(UNWIRED)
        assert wired <= {"train.resume"}, f"docs say every {family}.* key is unwired, but {wired} are read"


def test_shipped_toml_parses() -> None:
    from lego_rl.config.resolve import load_toml

    for path in Path(__file__).resolve().parents[2].glob("**/lego*.toml"):
        if ".venv" in path.parts or ".lego" in path.parts:
            continue
        load_toml(path)  # raises ConfigError on an unknown key or bad TOML
