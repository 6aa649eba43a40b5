"""Artifact names are injective: distinct rollout ids never share a folder (issue 18: ``collide/1`` and
``collide_1`` did, and the second rollout's FileExistsError ended rollout-check)."""

from __future__ import annotations

import itertools
from pathlib import Path

from lego_rl.runstore import RunDir, safe_name
from lego_rl.runstore.layout import _SAFE


def test_ids_that_sanitise_alike_get_distinct_names() -> None:
    ids = ["collide/1", "collide_1", "collide 1", "collide\\\\1", "collide:1", "collide_1.", ".collide_1"]
    names = [safe_name(i) for i in ids]
    assert len(set(names)) == len(ids), names
    assert safe_name("collide_1") == "collide_1"  # an already-safe id keeps its name


def test_a_kept_name_never_looks_like_a_hashed_one() -> None:
    """The id that *is* the hashed form of another id is hashed itself, so they still differ."""
    hashed = safe_name("collide/1")
    assert hashed != "collide/1" and safe_name(hashed) != hashed
    assert len({safe_name("collide/1"), safe_name(hashed)}) == 2


def test_names_are_safe_bounded_and_stable() -> None:
    long_ids = ["x" * 300, "x" * 300 + "y", "é" * 200, "../" * 100]
    for name in [*long_ids, "", ".", "..", "a/b", "\\x00", "ünïcode", "a" * 128, "a" * 129]:
        out = safe_name(name)
        assert out and set(out) <= _SAFE and not out.startswith(".") and len(out) <= 128 + 14, (name, out)
        assert safe_name(name) == out  # a pure function: the same id finds its folder again
    assert len({safe_name(n) for n in long_ids}) == len(long_ids)


def test_many_near_ids_stay_distinct() -> None:
    alphabet = ["a", "_", "/", ".", " ", "-"]
    ids = ["".join(t) for n in range(1, 5) for t in itertools.product(alphabet, repeat=n)]
    assert len({safe_name(i) for i in ids}) == len(ids)


def test_colliding_ids_get_two_rollout_folders(tmp_path: Path) -> None:
    run = RunDir.open(tmp_path / "run", config={})
    a, b = run.rollout_dir("collide/1-s0"), run.rollout_dir("collide_1-s0")
    assert a != b and a.is_dir() and b.is_dir()
    run.close()


def test_a_hashed_file_name_keeps_its_extension() -> None:
    out = safe_name("claude_code/0f1e.jsonl")
    assert out.startswith("claude_code_0f1e-h") and out.endswith(".jsonl")
    assert safe_name(out) != out and safe_name("claude_code_0f1e.jsonl") == "claude_code_0f1e.jsonl"
