"""A folder where `lego train` runs the built-in ``first_letter`` toy environment, for tests and benchmarks.

``write_toy_run`` writes the data rows (toy.jsonl) and a lego.toml: the embedded engine on the CPU (at a
free port: serving.port's default), bwrap named as the sandbox provider (the toy environment starts no
sandbox), the rows as rollout data, the environment set, a run root of ``runs/toy``. Each caller overrides
only the keys its case is about (``rollout={"max_staleness": 0}``, ``train={"backend": "megatron"}``); a
value of None drops a default key.

``scrub_config_env`` removes the environment variables the config layers read (``lego config env``): a
variable left by the shell or another test would outrank the file and change what the test runs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import pytest

from lego_rl.driver.toy_env import make_rows

DEFAULTS: dict[str, dict[str, object]] = {
    "serving": {"device": "cpu"},
    "sandbox": {"provider": "bwrap"},
    "rollout": {"prompt_data": "toy.jsonl", "batch_size": 2, "samples_per_prompt": 4, "top_p": 1.0},
    "train": {"environment": "first_letter", "num_rollout": 2},
    "paths": {"run_root": "runs/toy"},
}

_PREFIXES = ("LEGO_", "SWE_", "ADAPTER_")
_NAMES = {"PROMPT_DATA", "RUN_ROOT", "RUN_LOG", "HF_CHECKPOINT", "DATA_ROOT"}


def scrub_config_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset every variable the config layers read, for this test only."""
    for name in list(os.environ):
        if name.startswith(_PREFIXES) or name in _NAMES:
            monkeypatch.delenv(name)


def _value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string is JSON's string syntax for these values
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{k} = {_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"no TOML form for {v!r} here")


def toy_toml(**sections: Mapping[str, object] | None) -> str:
    """DEFAULTS with ``sections`` merged in, key by key, as lego.toml text (None drops a key or a section)."""
    merged = {name: dict(keys) for name, keys in DEFAULTS.items()}
    for name, keys in sections.items():
        if keys is None:
            merged.pop(name, None)
            continue
        table = merged.setdefault(name, {})
        for key, value in keys.items():
            if value is None:
                table.pop(key, None)
            else:
                table[key] = value
    return "".join(f"[{name}]\n" + "".join(f"{k} = {_value(v)}\n" for k, v in keys.items()) + "\n"
                   for name, keys in merged.items())


def write_toy_run(folder: Path, *, rows: int = 8, **sections: Mapping[str, object] | None) -> Path:
    """toy.jsonl (``rows`` rows, letter ``a``) and lego.toml (``toy_toml(**sections)``) in ``folder``; ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "toy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in make_rows(rows, letters="a")))
    (folder / "lego.toml").write_text(toy_toml(**sections))
    return folder
