"""runstore.files: the one atomic writer never overwrites, never leaves a half file or a temp file."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import BinaryIO

import pytest

from lego_rl.runstore.files import replace_file, write_new, write_next_free


def test_write_new_refuses_an_existing_file_naming_it(tmp_path: Path) -> None:
    path = write_new(tmp_path / "a" / "patch.diff", "one")
    with pytest.raises(FileExistsError, match=r"turn records .*patch\.diff already exists"):
        write_new(path, b"two", what="turn records")
    assert path.read_text() == "one"
    assert sorted(p.name for p in path.parent.iterdir()) == ["patch.diff"]


def test_write_new_loses_the_race_without_overwriting(tmp_path: Path) -> None:
    """A file that appears while we write (another writer) is kept; ours is refused at publish time."""
    path = tmp_path / "outcome.json"

    def fill(fh: BinaryIO) -> None:
        path.write_text("the other writer")  # lands between our existence check and our link()
        fh.write(b"ours")

    with pytest.raises(FileExistsError, match="outcome.json"):
        write_new(path, fill)
    assert path.read_text() == "the other writer"
    assert [p.name for p in tmp_path.iterdir()] == ["outcome.json"]


def test_a_failing_write_leaves_no_file_and_no_temp_file(tmp_path: Path) -> None:
    def fill(fh: BinaryIO) -> None:
        fh.write(b"half of it")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        write_new(tmp_path / "samples.jsonl", fill)
    with pytest.raises(OSError, match="No space"):
        replace_file(tmp_path / "rows.jsonl", fill)
    assert list(tmp_path.iterdir()) == []


def test_concurrent_writers_exactly_one_wins(tmp_path: Path) -> None:
    path = tmp_path / "x"
    outcomes: list[str] = []

    def writer(n: int) -> None:
        try:
            write_new(path, str(n))
            outcomes.append("won")
        except FileExistsError:
            outcomes.append("refused")

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["refused"] * 7 + ["won"]
    assert [p.name for p in tmp_path.iterdir()] == ["x"]


def test_replace_file_replaces_whole(tmp_path: Path) -> None:
    path = tmp_path / "images.json"
    replace_file(path, "old")
    replace_file(path, "new")
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["images.json"]


def test_write_next_free_numbers_instead_of_overwriting(tmp_path: Path) -> None:
    names = [write_next_free(tmp_path, "codex-events.jsonl", str(n)).name for n in range(3)]
    assert names == ["codex-events.jsonl", "codex-events.1.jsonl", "codex-events.2.jsonl"]
    assert (tmp_path / "codex-events.jsonl").read_text() == "0"
    with pytest.raises(FileExistsError, match="all 3 names like codex-events.jsonl are taken"):
        write_next_free(tmp_path, "codex-events.jsonl", "x", limit=3)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
