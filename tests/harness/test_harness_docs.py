"""docs/plugin_hooks.md documents every hook with exactly its arguments (and nothing else)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from lego_rl.harness import hookspecs

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugin_hooks.md"


def spec_signatures() -> dict[str, list[str]]:
    return {
        name: list(inspect.signature(fn).parameters)
        for name, fn in vars(hookspecs).items()
        if name.startswith("lego_") and callable(fn)
    }


def doc_signatures() -> dict[str, list[str]]:
    found = {}
    for name, args in re.findall(r"^## (lego_\w+)\(([^)]*)\)\s*$", DOC.read_text(), flags=re.M):
        found[name] = [a.strip() for a in args.split(",") if a.strip()]
    return found


def test_every_hook_is_documented_with_matching_argnames() -> None:
    assert doc_signatures() == spec_signatures()


def test_about_ten_hooks_each_with_a_complete_docstring() -> None:
    specs = spec_signatures()
    assert 8 <= len(specs) <= 12
    for name in specs:
        doc = inspect.getdoc(getattr(hookspecs, name)) or ""
        assert ":returns:" in doc and "Use in harness plugins:" in doc, name
        assert "firstresult" in doc, name
        for arg in specs[name]:
            assert f":param {arg}:" in doc, f"{name}: {arg} undocumented"
