import json
from pathlib import Path

import pytest
from tasks_data import TEST_PATCH

from lego_rl.errors import TaskDataError
from lego_rl.tasks import TaskRow, load_tasks, select_ids, write_tasks


def _row(iid: str, **meta: object) -> dict:
    m = {"instance_id": iid, "image": "img:" + iid, "workdir": "/testbed", "problem_statement": "p",
         "eval_cmd": "true", "test_patch": TEST_PATCH}
    m.update(meta)
    return {"prompt": [{"role": "user", "content": "p"}], "label": iid, "metadata": m}


def test_load_reports_each_bad_row_with_number_and_reason(tmp_path: Path) -> None:
    lines = [
        json.dumps(_row("a")),
        "{not json",
        "",
        json.dumps(_row("b", workdir="relative")),
        json.dumps(_row("c", eval_cmd=None)),
        json.dumps(_row("a")),
        json.dumps(_row("d", test_patch="--- a/../x\n+++ b/../x\n")),
        json.dumps([1, 2]),
    ]
    f = tmp_path / "t.jsonl"
    f.write_text("\n".join(lines) + "\n")
    res = load_tasks(f)
    assert [r.label for r in res.rows] == ["a"]
    by_row = {i.row: i for i in res.issues}
    assert sorted(by_row) == [2, 4, 5, 6, 7, 8]
    assert "invalid JSON" in by_row[2].reason
    assert "workdir" in by_row[4].reason and by_row[4].instance_id == "b"
    assert "eval_cmd" in by_row[5].reason
    assert "duplicate instance_id 'a' (first on row 1)" in by_row[6].reason
    assert "'..'" in by_row[7].reason
    assert "JSON object" in by_row[8].reason
    with pytest.raises(TaskDataError, match=r"t.jsonl row 2: invalid JSON.*and 5 more"):
        res.raise_on_issues(str(f))


def test_f2p_script_rows_in_native_shape_are_normalised(tmp_path: Path) -> None:
    raw = {"prompt": "Make add() work", "metadata": {"remote_env_info": {
        "image_url": "reg/x:1", "workdir": "/repo", "instance_id": "f2p-1",
        "f2p_script": "def test_x():\n    assert True\n", "pre_commands": "pip install -e ."}}}
    f = tmp_path / "f.jsonl"
    f.write_text(json.dumps(raw) + "\n")
    res = load_tasks(f)
    assert not res.issues
    m = res.rows[0].metadata
    assert (m.kind, m.image, m.workdir, m.pre_commands) == ("f2p_script", "reg/x:1", "/repo", ["pip install -e ."])
    assert res.rows[0].prompt[0].content == "Make add() work"


def test_select_ids_rejects_duplicates_and_unknown_ids() -> None:
    rows = [TaskRow.model_validate(_row(i)) for i in ("a", "b")]
    assert [r.label for r in select_ids(rows, ["b", "a"])] == ["b", "a"]
    with pytest.raises(TaskDataError, match="more than once"):
        select_ids(rows, ["a", "a"])
    with pytest.raises(TaskDataError, match="not found.*zzz"):
        select_ids(rows, ["a", "zzz"])


def test_write_is_atomic_and_round_trips(tmp_path: Path) -> None:
    rows = [TaskRow.model_validate(_row(i)) for i in ("a", "b")]
    out = tmp_path / "out.jsonl"
    out.write_text("old complete file\n")

    class Boom(TaskRow):
        def to_json_line(self) -> str:
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_tasks(out, [rows[0], Boom.model_validate(_row("c"))])
    assert out.read_text() == "old complete file\n"  # untouched, no temp file left behind
    assert list(tmp_path.iterdir()) == [out]
    assert write_tasks(out, rows) == 2
    assert [r.label for r in load_tasks(out).rows] == ["a", "b"]
