"""`lego tasks check` on the real task image with bwrap: gradable vs not gradable tasks."""

from __future__ import annotations

import json
from pathlib import Path

from swe_data import WRONG_PATCH, task_meta
from typer.testing import CliRunner

from lego_rl.cli.main import app
from lego_rl.sandbox.base import ImageSpec
from lego_rl.tasks.model import Message, TaskRow

runner = CliRunner()


def _row(**over: object) -> str:
    meta = task_meta(**over)
    return TaskRow(prompt=[Message(role="user", content="p")], label=meta.instance_id, metadata=meta).to_json_line()


def test_tasks_check(tmp_path: Path, task_image: tuple[ImageSpec, str]) -> None:
    spec = task_image[0]
    images = tmp_path / "images.json"
    images.write_text(json.dumps({"test/calc:1": {"rootfs": spec.rootfs, "workdir": "/testbed", "env": {}}}))
    data = tmp_path / "tasks.jsonl"
    data.write_text("\n".join([
        _row(),  # gradable: HEAD fails, the reference fix passes
        _row(instance_id="already-solved", eval_cmd="true"),
        _row(instance_id="bad-reference", reference_patch=WRONG_PATCH),
        _row(instance_id="no-reference", reference_patch=None),
    ]) + "\n")
    base = ["tasks", "check", "--data", str(data), "--images", str(images), "--provider", "bwrap", "--json"]
    res = runner.invoke(app, base)
    assert res.exit_code == 1, res.output
    got = {c["instance_id"]: (c["baseline"], c["reference"], c["verdict"]) for c in json.loads(res.stdout)}
    assert got == {
        "calc-1": ("fails", "passes", "gradable"),
        "already-solved": ("passes", "passes", "not gradable"),
        "bad-reference": ("fails", "fails", "not gradable"),
        "no-reference": ("fails", "none", "gradable"),
    }
    res = runner.invoke(app, [*base, "--ids", "calc-1", "--provider-option", "no_such_option=1"])
    assert res.exit_code == 3 and "no_such_option" in res.stdout  # options reach the provider's constructor
    res = runner.invoke(app, [*base, "--provider-option", "not-key-value"])
    assert res.exit_code == 2
    res = runner.invoke(app, [*base[:-1], "--ids", "calc-1,no-reference"])
    assert res.exit_code == 0 and "gradable" in res.output
    # no images mapping: the image name is not a rootfs, so every grader run is an infrastructure error
    res = runner.invoke(app, ["tasks", "check", "--data", str(data), "--ids", "calc-1", "--json"])
    assert res.exit_code == 3 and json.loads(res.stdout)[0]["verdict"] == "grader error"


def test_tasks_check_says_why_the_baseline_fails(tmp_path: Path, task_image: tuple[ImageSpec, str]) -> None:
    """A non-zero exit is not "the tests failed": a missing command, a missing test module and hanging
    tests are reported as such, with the time each grading took, and are not gradable."""
    spec = task_image[0]
    images = tmp_path / "images.json"
    images.write_text(json.dumps({"test/calc:1": {"rootfs": spec.rootfs, "workdir": "/testbed", "env": {}}}))
    data = tmp_path / "tasks.jsonl"
    data.write_text("\n".join([
        _row(),
        _row(instance_id="no-runner", eval_cmd="export PYTHONPATH=.; calc-test-runner tests/"),
        _row(instance_id="no-pytest", eval_cmd="python3 -m pytest tests/test_calc.py"),  # the image has no pytest
        _row(instance_id="no-module", eval_cmd="export PYTHONPATH=.; python3 tests/test_missing.py"),
        _row(instance_id="no-module-no-ref", eval_cmd="export PYTHONPATH=.; python3 tests/test_missing.py",
             reference_patch=None),
        _row(instance_id="hangs", eval_cmd="sleep 120", reference_patch=None),
    ]) + "\n")
    res = runner.invoke(app, ["tasks", "check", "--data", str(data), "--images", str(images), "--provider", "bwrap",
                              "--timeout", "8", "--json"])
    assert res.exit_code == 1, res.output
    checks = {c["instance_id"]: c for c in json.loads(res.stdout)}
    got = {i: (c["baseline_reason"], c["verdict"]) for i, c in checks.items()}
    assert got == {
        "calc-1": ("tests failed", "gradable"),
        "no-runner": ("command not found", "not gradable"),
        "no-pytest": ("command not found", "not gradable"),
        "no-module": ("collection error", "not gradable"),
        "no-module-no-ref": ("collection error", "not gradable"),
        "hangs": ("timeout", "not gradable"),
    }
    assert "exit 127" in checks["no-runner"]["detail"] and "No module named pytest" in checks["no-pytest"]["detail"]
    assert "can't open file" in checks["no-module"]["detail"]
    assert checks["hangs"]["baseline_s"] >= 8 and checks["calc-1"]["reference_s"] > 0
    assert checks["no-runner"]["reference_s"] is None  # nothing the reference could change: not graded
    table = runner.invoke(app, ["tasks", "check", "--data", str(data), "--images", str(images), "--ids", "no-module",
                                "--provider", "bwrap"])
    assert "collection error" in table.output and " s" in table.output
