import json
from pathlib import Path

import pytest
from tasks_data import TEST_PATCH, mimo_instance, write_mimo

from lego_rl.errors import TaskDataError
from lego_rl.tasks import convert_mimo, convert_swepro

FIX = "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-old\n+new\n"


def test_mimo_rows_have_the_reference_shape(tmp_path: Path) -> None:
    d = write_mimo(tmp_path, [mimo_instance("format-code-task-002661"), mimo_instance("t2")])
    res = convert_mimo(d)
    assert not res.issues
    row = json.loads(res.rows[0].to_json_line())
    assert row["prompt"] == [{"role": "user", "content": "Fix the bug in format-code-task-002661."}]
    assert row["label"] == "format-code-task-002661"
    meta = row["metadata"]
    assert meta["image"] == "docker.io/xiaomimimo/mimo-v2.6-rl-oss:format-code-task-002661"
    assert meta["dataset"] == "XiaomiMiMo/MiMo-V2.6-RL-oss"
    assert (meta["workdir"], meta["eval_user"]) == ("/testbed", "root")
    assert meta["eval_cmd"] == "python -m pytest -q tests/test_calc.py"
    assert meta["test_patch"] == TEST_PATCH
    # the agent only ever sees the prompt: no grading data may leak into it
    assert "pytest" not in json.dumps(row["prompt"]) and "test_calc" not in json.dumps(row["prompt"])


def test_mimo_bad_rows_are_reported_by_row_number(tmp_path: Path) -> None:
    good = mimo_instance("ok")
    no_map = mimo_instance("nomap", docker_image="mimo/unknown:1")
    lacking = {k: v for k, v in mimo_instance("lack").items() if k != "test_command"}
    escaping = mimo_instance("esc", test_patch="--- /etc/passwd\n+++ /etc/passwd\n")
    d = write_mimo(tmp_path, [good, no_map, "{broken", lacking, escaping, mimo_instance("ok")],
                   mapping={"mimo/ok:latest": "r/ok", "mimo/lack:latest": "r/l", "mimo/esc:latest": "r/e"})
    res = convert_mimo(d)
    assert [r.label for r in res.rows] == ["ok"]
    reasons = {i.row: i.reason for i in res.issues}
    assert sorted(reasons) == [2, 3, 4, 5, 6]
    assert "'mimo/unknown:1' is not in image-mapping.jsonl" in reasons[2]
    assert "not valid JSON" in reasons[3]
    assert "test_command" in reasons[4]
    assert "absolute" in reasons[5]
    assert "duplicate" in reasons[6]


def test_mimo_ids_selection(tmp_path: Path) -> None:
    d = write_mimo(tmp_path, [mimo_instance(f"t{i}") for i in range(4)])
    assert [r.label for r in convert_mimo(d, ["t3", "t1"]).rows] == ["t3", "t1"]
    with pytest.raises(TaskDataError, match="more than once"):
        convert_mimo(d, ["t1", "t1"])
    with pytest.raises(TaskDataError, match="ids not found: nope"):
        convert_mimo(d, ["t1", "nope"])


def test_mimo_missing_files_and_bad_mapping(tmp_path: Path) -> None:
    with pytest.raises(TaskDataError, match="code.parquet not found"):
        convert_mimo(tmp_path)
    d = write_mimo(tmp_path, [mimo_instance("a")])
    (d / "image-mapping.jsonl").write_text('{"dataset_image": "x", "dockerhub_image": "y"}\n{"dataset_image": "x", "dockerhub_image": "z"}\n')
    with pytest.raises(TaskDataError, match="row 2: 'x' is mapped twice"):
        convert_mimo(d)


def test_swepro_rows(tmp_path: Path) -> None:
    scripts = tmp_path / "run_scripts"
    (scripts / "inst-1").mkdir(parents=True)
    (scripts / "inst-1" / "run_script.sh").write_text("#!/bin/bash\n")
    (scripts / "inst-1" / "parser.py").write_text("print()\n")
    raw = {"instance_id": "inst-1", "problem_statement": "Broken", "requirements": "Must X", "interface": "",
           "dockerhub_tag": "org.repo-inst-1", "before_repo_set_cmd": "git checkout abc -- tests",
           "selected_test_files_to_run": "['tests/a.py']", "fail_to_pass": '["tests/a.py::t1"]',
           "pass_to_pass": "[]", "test_patch": TEST_PATCH, "patch": FIX}
    missing_script = dict(raw, instance_id="inst-2")
    data = tmp_path / "swepro.jsonl"
    data.write_text(json.dumps(raw) + "\n" + json.dumps(missing_script) + "\n")
    res = convert_swepro(data, scripts)
    assert len(res.rows) == 1 and res.issues[0].row == 2 and "run_script.sh does not exist" in res.issues[0].reason
    m = res.rows[0].metadata
    assert m.kind == "swepro" and m.image == "docker.io/jefzda/sweap-images:org.repo-inst-1"
    assert m.swepro is not None and m.swepro.fail_to_pass == ["tests/a.py::t1"]
    assert m.swepro.selected_test_files == ["tests/a.py"]
    assert "Requirements:\nMust X" in res.rows[0].prompt[0].content
    assert m.reference_patch == FIX
