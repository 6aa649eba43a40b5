"""`lego tasks check` on the real task image with bwrap: gradable vs not gradable tasks."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from swe_data import WRONG_PATCH, build_task_image, provider_options, task_meta
from typer.testing import CliRunner

from lego_rl.cli.main import app
from lego_rl.sandbox.base import ImageSpec
from lego_rl.tasks.model import Message, TaskRow

runner = CliRunner()


def _row(**over: object) -> str:
    meta = task_meta(**over)
    return TaskRow(prompt=[Message(role="user", content="p")], label=meta.instance_id, metadata=meta).to_json_line()


def _checks(stdout: str) -> list[dict[str, object]]:
    """The per-row ``TaskCheck`` dicts of `lego tasks check --json` (rows that were judged)."""
    return [r["check"] for r in json.loads(stdout)["rows"]]


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
    got = {c["instance_id"]: (c["baseline"], c["reference"], c["verdict"]) for c in _checks(res.stdout)}
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
    assert res.exit_code == 0 and "valid" in res.output
    # no images mapping: the image name is not a rootfs, so no sandbox can be created: an infrastructure error,
    # met first by the agent-side setup
    res = runner.invoke(app, ["tasks", "check", "--data", str(data), "--ids", "calc-1", "--json"])
    assert res.exit_code == 3 and _checks(res.stdout)[0]["verdict"] == "setup error"


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
    checks = {c["instance_id"]: c for c in _checks(res.stdout)}
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
                                "--provider", "bwrap"], env={"COLUMNS": "300"})
    assert "collection error" in table.output and "can't open file" in table.output
    assert re.search(r"\d+\.\d \+ \d+\.\d \+ \d+\.\d", table.output), table.output  # setup + base + ref


def _images_json(tmp_path: Path, spec: ImageSpec, name: str = "test/calc:1") -> Path:
    images = tmp_path / f"images-{name.replace('/', '_')}.json"
    images.write_text(json.dumps({name: {"rootfs": spec.rootfs, "workdir": "/testbed", "env": {}}}))
    return images


@pytest.fixture(scope="module")
def no_commit_image(task_image: tuple[ImageSpec, str]) -> Iterator[ImageSpec]:
    """The task image whose repository has no commit: grading works, a rollout's setup cannot."""
    base = Path(tempfile.mkdtemp(prefix="lego-nocommit-image-", dir="/var/tmp"))
    base.chmod(0o755)
    try:
        spec, _ = build_task_image(base / "rootfs")
        repo = Path(spec.rootfs or "") / "testbed"
        shutil.rmtree(repo / ".git")
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        yield spec
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_tasks_check_sets_up_the_agent_workspace_like_a_rollout(tmp_path: Path, no_commit_image: ImageSpec) -> None:
    """A task the grader alone calls gradable but on which every rollout would fail at sandbox_setup."""
    data = tmp_path / "tasks.jsonl"
    data.write_text(_row() + "\n")
    base = ["tasks", "check", "--data", str(data), "--images", str(_images_json(tmp_path, no_commit_image)),
            "--provider", "bwrap"]
    res = runner.invoke(app, [*base, "--json"])
    assert res.exit_code == 3, res.output
    [check] = _checks(res.stdout)
    assert (check["verdict"], check["workspace"]) == ("setup error", "error")
    assert "no commit at HEAD" in check["detail"] and check["workspace_s"] > 0


@pytest.mark.parametrize("provider", ["bwrap", pytest.param("sunabako", marks=[pytest.mark.slow, pytest.mark.root])])
def test_tasks_check_on_an_image_with_acls(provider: str, tmp_path: Path, acl_image: ImageSpec) -> None:
    """The ACL image that failed every sunabako rollout at setup while tasks check called it gradable."""
    data = tmp_path / "tasks.jsonl"
    data.write_text(_row() + "\n")
    options = [f"--provider-option={k}={json.dumps(v)}" for k, v in provider_options(provider).items()]
    res = runner.invoke(app, ["tasks", "check", "--data", str(data), "--images", str(_images_json(tmp_path, acl_image)),
                              "--provider", provider, *options, "--json"])
    [check] = _checks(res.stdout)
    assert (res.exit_code, check["workspace"], check["verdict"]) == (0, "ok", "gradable"), check
