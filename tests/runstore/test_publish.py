"""The one directory publisher (``runstore.publish``): a directory appears whole or not at all, beside its target,
and an existing target is refused, replaced or kept as the caller asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from lego_rl.runstore.publish import publish_dir, staging


def hidden_leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_a_staged_folder_is_beside_its_target_and_published_whole(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "model"
    with staging(target) as tmp:
        assert tmp.parent == target.parent and tmp.name.startswith(".model.partial-")
        (tmp / "a.txt").write_text("one")
        assert not target.exists()  # nothing under the name before the publish
        assert publish_dir(tmp, target, existing="refuse", fsync=True) == target
    assert (target / "a.txt").read_text() == "one"
    assert hidden_leftovers(target.parent) == []


def test_refuse_never_overwrites_and_leaves_nothing_behind(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    target.mkdir()  # even an empty folder, which rename(2) would silently replace
    with pytest.raises(FileExistsError, match="checkpoint .*ckpt already exists; it is never overwritten"):
        with staging(target) as tmp:
            (tmp / "a.txt").write_text("new")
            publish_dir(tmp, target, existing="refuse", what="checkpoint")
    assert list(target.iterdir()) == [] and hidden_leftovers(tmp_path) == []


def test_replace_swaps_the_old_folder_for_the_new_one(tmp_path: Path) -> None:
    target = tmp_path / "bundle"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with staging(target, prefix=".tmp-bundle-") as tmp:
        assert tmp.name.startswith(".tmp-bundle-")
        (tmp / "new.txt").write_text("new")
        publish_dir(tmp, target, existing="replace")
    assert sorted(p.name for p in target.iterdir()) == ["new.txt"]
    assert hidden_leftovers(tmp_path) == []  # the old folder set aside is gone too


def test_keep_lets_the_first_writer_win(tmp_path: Path) -> None:
    target = tmp_path / "tree"
    with staging(target) as tmp:
        (tmp / "mine.txt").write_text("mine")
        target.mkdir()  # another process published meanwhile
        (target / "theirs.txt").write_text("theirs")
        assert publish_dir(tmp, target, existing="keep") == target
    assert sorted(p.name for p in target.iterdir()) == ["theirs.txt"]
    assert hidden_leftovers(tmp_path) == []


def test_keep_raises_when_what_stands_there_is_not_complete(tmp_path: Path) -> None:
    target = tmp_path / "model"
    target.mkdir()
    (target / "junk").write_text("x")  # a non-empty folder without the marker a complete one has
    with pytest.raises(OSError):
        with staging(target) as tmp:
            (tmp / "marker").write_text("done")
            publish_dir(tmp, target, existing="keep", keep_if=lambda p: (p / "marker").is_file())
    assert hidden_leftovers(tmp_path) == []


def test_a_failing_writer_leaves_the_folder_as_it_was(tmp_path: Path) -> None:
    target = tmp_path / "out"
    with pytest.raises(RuntimeError, match="disk full"):
        with staging(target) as tmp:
            (tmp / "half.txt").write_text("half")
            raise RuntimeError("disk full")
    assert list(tmp_path.iterdir()) == []


def test_a_subfolder_of_the_staging_folder_can_be_what_is_published(tmp_path: Path) -> None:
    target = tmp_path / "image"
    with staging(target) as work:
        (work / "layout").mkdir()
        (work / "bundle").mkdir()
        (work / "bundle" / "rootfs").mkdir()
        publish_dir(work / "bundle", target, existing="replace")
    assert (target / "rootfs").is_dir() and not (target / "layout").exists()
    assert hidden_leftovers(tmp_path) == []
