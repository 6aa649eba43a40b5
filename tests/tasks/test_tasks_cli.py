"""`lego tasks prepare` through the real typer app (CliRunner)."""

from __future__ import annotations

import json
from pathlib import Path

from tasks_data import TEST_PATCH, mimo_instance, write_mimo
from typer.testing import CliRunner

from lego_rl.cli.main import app

runner = CliRunner()


def test_prepare_mimo_writes_rows_and_summary(tmp_path: Path) -> None:
    d = write_mimo(tmp_path / "data", [mimo_instance("format-code-task-002661"), mimo_instance("t2")])
    out = tmp_path / "train.jsonl"
    res = runner.invoke(app, ["tasks", "prepare", "--data", str(d), "--output", str(out), "--ids", "format-code-task-002661"])
    assert res.exit_code == 0, res.output
    assert "lego tasks prepare" in res.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["label"] for r in rows] == ["format-code-task-002661"]
    res = runner.invoke(app, ["tasks", "prepare", "--data", str(d), "-o", str(out), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout) == {"output": str(out), "tasks": 2, "images": 2, "references": 0,
                                                      "bad_rows": []}


def test_bad_rows_write_nothing_unless_skipped(tmp_path: Path) -> None:
    d = write_mimo(tmp_path / "data", [mimo_instance("ok"), mimo_instance("bad", cwd="rel")])
    out = tmp_path / "train.jsonl"
    res = runner.invoke(app, ["tasks", "prepare", "--data", str(d), "-o", str(out)])
    assert res.exit_code == 2 and not out.exists()
    text = " ".join(res.output.split())
    assert "1 bad rows; nothing written" in text and "workdir" in text
    res = runner.invoke(app, ["tasks", "prepare", "--data", str(d), "-o", str(out), "--skip-bad", "--json"])
    assert res.exit_code == 0
    report = json.loads(res.stdout)
    assert report["tasks"] == 1 and report["bad_rows"][0]["row"] == 2
    assert len(out.read_text().splitlines()) == 1


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    d = write_mimo(tmp_path / "data", [mimo_instance("a")])
    for argv, needle in [
        (["--ids", "a,a"], "more than once"),
        (["--ids", "zzz"], "ids not found: zzz"),
        (["--format", "nope"], "not one of"),
        (["--format", "swepro"], "--scripts"),
    ]:
        res = runner.invoke(app, ["tasks", "prepare", "--data", str(d), "-o", str(tmp_path / "x.jsonl"), *argv])
        assert res.exit_code == 2 and needle in " ".join(res.output.split()), (argv, res.output)
    assert not (tmp_path / "x.jsonl").exists()


FIX = """diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b
"""


def test_structurally_invalid_test_patches_are_bad_rows_with_their_number(tmp_path: Path) -> None:
    """A test patch git would refuse (or apply as something else) is caught at prepare, not at grading."""
    short = TEST_PATCH.replace("@@ -0,0 +1,2 @@", "@@ -0,0 +1,3 @@")
    long = TEST_PATCH.replace("@@ -0,0 +1,2 @@", "@@ -0,0 +1,1 @@")
    d = write_mimo(tmp_path / "data", [
        mimo_instance("ok"),
        mimo_instance("prose", test_patch="Add a test that add(2, 3) == 5.\n"),
        mimo_instance("short-hunk", test_patch=short),
        mimo_instance("long-hunk", test_patch=long),
        mimo_instance("bad-ref", patch=FIX.replace("@@ -1,2 +1,2 @@", "@@ -1,5 +1,2 @@")),
    ])
    out = tmp_path / "train.jsonl"
    res = runner.invoke(app, ["tasks", "prepare", "--data", str(d), "-o", str(out), "--skip-bad", "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    bad = {b["row"]: (b["instance_id"], b["reason"]) for b in report["bad_rows"]}
    assert report["tasks"] == 1 and sorted(bad) == [2, 3, 4, 5]
    assert bad[2][0] == "prose" and "not a unified diff" in bad[2][1]
    assert bad[3][0] == "short-hunk" and "is short: 0 old and 1 new lines still owed" in bad[3][1]
    assert bad[4][0] == "long-hunk" and "line counts are too small" in bad[4][1] and "test patch line 7" in bad[4][1]
    assert bad[5][0] == "bad-ref" and "reference patch line 4" in bad[5][1] and "is short" in bad[5][1]
    res = runner.invoke(app, ["tasks", "prepare", "--data", str(d), "-o", str(tmp_path / "none.jsonl")])
    assert res.exit_code == 2 and "4 bad rows; nothing written" in " ".join(res.output.split())


def test_reference_patches_from_a_separate_file(tmp_path: Path) -> None:
    d = write_mimo(tmp_path / "data", [mimo_instance("a"), mimo_instance("b"), mimo_instance("c")])
    refs = tmp_path / "refs.jsonl"
    refs.write_text(json.dumps({"instance_id": "a", "patch": FIX}) + "\n\n" +
                    json.dumps({"instance_id": "c", "patch": FIX}) + "\n")
    out = tmp_path / "train.jsonl"
    res = runner.invoke(app, ["tasks", "prepare", "--data", str(d), "-o", str(out), "--reference", str(refs), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["references"] == 2
    rows = {r["label"]: r["metadata"] for r in map(json.loads, out.read_text().splitlines())}
    assert rows["a"]["reference_patch"] == FIX and rows["c"]["reference_patch"] == FIX
    assert "reference_patch" not in rows["b"]

    def refused(text: str, *needles: str) -> None:
        refs.write_text(text)
        res = runner.invoke(app, ["tasks", "prepare", "--data", str(d), "-o", str(tmp_path / "x.jsonl"),
                                  "--reference", str(refs)])
        said = " ".join(res.output.split())
        assert res.exit_code == 2 and all(n in said for n in needles), said
        assert not (tmp_path / "x.jsonl").exists()

    ok = json.dumps({"instance_id": "a", "patch": FIX})
    refused(ok + "\n{oops\n", "line 2: invalid JSON")
    refused(ok + "\n" + ok + "\n", "line 2: duplicate instance_id 'a' (first on line 1)")
    refused(json.dumps({"id": "a", "diff": FIX}) + "\n", "line 1: expected")
    refused(json.dumps({"instance_id": "a", "patch": "just use add"}) + "\n", "line 1 (a)", "not a unified diff")
    refused(json.dumps({"instance_id": "zz", "patch": FIX}) + "\n", "name no task of the dataset", "'zz' (line 1)")
    refused("", "holds no patch")
    # With --ids, references of tasks outside the selection are not an error.
    refs.write_text(ok + "\n" + json.dumps({"instance_id": "zz", "patch": FIX}) + "\n")
    res = runner.invoke(app, ["tasks", "prepare", "--data", str(d), "-o", str(out), "--ids", "a", "--reference", str(refs)])
    assert res.exit_code == 0, res.output
