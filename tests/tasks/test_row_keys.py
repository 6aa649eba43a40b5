"""``RowKeys``: a dataset that names its row parts differently is read into the row model's names."""

from __future__ import annotations

import json
from pathlib import Path

from lego_rl.tasks.rows import RowKeys, load_tasks

META = {"instance_id": "t1", "eval_cmd": "true", "problem_statement": "p"}
KEYS = RowKeys(input="messages", label="id", metadata="info", image="docker_image")


def write(path: Path, *rows: dict[str, object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_custom_keys_are_read_into_the_model(tmp_path: Path) -> None:
    row = {"messages": [{"role": "user", "content": "fix"}], "id": "t1", "info": {**META, "docker_image": "i:1"}}
    res = load_tasks(write(tmp_path / "t.jsonl", row), KEYS)
    assert not res.issues
    [task] = res.rows
    assert (task.label, task.metadata.image, task.prompt[0].content) == ("t1", "i:1", "fix")
    # The same file read with the default keys is refused row by row, not half-read.
    assert [i.row for i in load_tasks(tmp_path / "t.jsonl").issues] == [1]


def test_a_row_holding_both_names_is_refused(tmp_path: Path) -> None:
    both = {"messages": [{"role": "user", "content": "a"}], "prompt": [{"role": "user", "content": "b"}],
            "id": "t1", "info": {**META, "docker_image": "i:1"}}
    image_twice = {"messages": [{"role": "user", "content": "a"}], "id": "t2",
                   "info": {**META, "instance_id": "t2", "docker_image": "i:1", "image": "i:2"}}
    res = load_tasks(write(tmp_path / "t.jsonl", both, image_twice), KEYS)
    assert [(i.row, i.instance_id) for i in res.issues] == [(1, "t1"), (2, "t2")]
    assert "both `messages` (read as prompt) and `prompt`" in res.issues[0].reason
    assert "both `docker_image` (read as image) and `image`" in res.issues[1].reason
