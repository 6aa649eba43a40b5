"""`lego images` through the real typer app, with OCI images built here."""

from __future__ import annotations

import json
from pathlib import Path

from oci_data import build_oci
from typer.testing import CliRunner

from lego_rl.cli.main import app

runner = CliRunner()


def _row(iid: str, image: str) -> str:
    return json.dumps({"prompt": [{"role": "user", "content": "p"}], "label": iid, "metadata": {
        "instance_id": iid, "image": image, "workdir": "/testbed", "problem_statement": "p", "eval_cmd": "true"}})


def test_images_command(tmp_path: Path) -> None:
    src = tmp_path / "src"
    build_oci(src / "task-a", "task-a", {"testbed/x": "1"}, env=["PATH=/usr/bin:/bin"])
    data = tmp_path / "train.jsonl"
    data.write_text(_row("a", "reg/mimo:task-a") + "\n" + _row("b", "reg/mimo:task-b") + "\n"
                    + _row("c", "reg/mimo:task-a") + "\n")
    out = tmp_path / "images.json"
    argv = ["images", "--data", str(data), "--root", str(tmp_path / "root"), "-o", str(out), "--source", str(src)]
    res = runner.invoke(app, argv)
    assert res.exit_code == 1, res.output  # task-b has no image on disk: reported, skipped
    text = " ".join(res.output.split())
    assert "failed reg/mimo:task-b: no OCI layout or archive found" in text
    assert list(json.loads(out.read_text())) == ["reg/mimo:task-a"]
    res = runner.invoke(app, [*argv, "--ids", "a", "--json"])
    assert res.exit_code == 0
    assert [o["status"] for o in json.loads(res.stdout)["outcomes"]] == ["reused"]
    assert [o["tasks"] for o in json.loads(res.stdout)["outcomes"]] == [1]  # only row a was selected
    res = runner.invoke(app, [*argv, "--json"])
    assert {o["image"]: o["tasks"] for o in json.loads(res.stdout)["outcomes"]} == {"reg/mimo:task-a": 2,
                                                                                   "reg/mimo:task-b": 1}


def test_images_rejects_bad_task_file(tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text("{}\n")
    res = runner.invoke(app, ["images", "--data", str(data), "--root", str(tmp_path), "-o", str(tmp_path / "i.json"),
                              "--source", str(tmp_path)])
    assert res.exit_code == 2 and "row 1" in " ".join(res.output.split())


def test_missing_tools_are_an_infrastructure_failure(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # neither skopeo nor umoci on PATH
    data = tmp_path / "train.jsonl"
    data.write_text(_row("a", "reg/mimo:task-a") + "\n")
    res = runner.invoke(app, ["images", "--data", str(data), "--root", str(tmp_path / "r"), "-o",
                              str(tmp_path / "i.json"), "--source", str(tmp_path)])
    assert res.exit_code == 3 and "skopeo and umoci not installed" in " ".join(res.output.split())
    assert not (tmp_path / "i.json").exists()
