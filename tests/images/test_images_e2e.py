"""End to end on real parts: a task image built here as an OCI layout from the debootstrap rootfs,
imported by `lego images`, booted by bwrap from images.json, graded by `lego tasks check`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lego_rl.cli.main import app
from lego_rl.images import load_images_json
from lego_rl.sandbox.factory import create_sandbox

BASE = Path(os.environ.get("LEGO_ROOTFS_CACHE", "/var/cache/lego-rl/rootfs-bookworm"))
IMAGE = "docker.io/xiaomimimo/mimo-v2.6-rl-oss:format-code-task-e2e"
TEST_PATCH = """diff --git a/test_calc.py b/test_calc.py
new file mode 100644
--- /dev/null
+++ b/test_calc.py
@@ -0,0 +1,2 @@
+from calc import add
+assert add(2, 3) == 5
"""
FIX = """diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1 +1 @@
-def add(a, b): return a - b
+def add(a, b): return a + b
"""
PYENV_PYTHON = '#!/bin/sh\necho "pyenv python as $(id -un)"\n'


def _run(*argv: str, cwd: Path | None = None) -> None:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(argv, check=True, capture_output=True, cwd=cwd, env=env)


def _image_layout(work: Path) -> Path:
    """An OCI layout whose one layer is the debootstrap rootfs + /testbed repo + a pyenv under a 0700 /root."""
    layout, bundle = work / "sources" / "format-code-task-e2e", work / "bundle"
    _run("umoci", "init", "--layout", str(layout))
    _run("umoci", "new", "--image", f"{layout}:format-code-task-e2e")
    _run("umoci", "unpack", "--image", f"{layout}:format-code-task-e2e", str(bundle))
    rootfs = bundle / "rootfs"
    shutil.rmtree(rootfs)
    _run("cp", "-al", str(BASE), str(rootfs))  # directories are new, files shared read-only: never edited in place
    shutil.rmtree(rootfs / "testbed")
    (rootfs / "testbed").mkdir()
    (rootfs / "testbed" / "calc.py").write_text("def add(a, b): return a - b\n")
    _run("git", "init", "-q", cwd=rootfs / "testbed")
    _run("git", "add", "-A", cwd=rootfs / "testbed")
    _run("git", "commit", "-qm", "base", cwd=rootfs / "testbed")
    py = rootfs / "root/.pyenv/versions/3.11.7/bin/python"
    py.parent.mkdir(parents=True)
    py.write_text(PYENV_PYTHON)
    py.chmod(0o755)
    (rootfs / "root/.pyenv/version").write_text("3.11.7\n")
    (rootfs / "root").chmod(0o700)
    _run("umoci", "repack", "--image", f"{layout}:format-code-task-e2e", str(bundle))
    _run("umoci", "config", "--image", f"{layout}:format-code-task-e2e", "--config.workingdir", "/",
         "--config.env", "PATH=/root/.pyenv/shims:/usr/local/bin:/usr/bin:/bin", "--config.env", "LEGO_FROM_IMAGE=1")
    shutil.rmtree(bundle)
    return layout


@pytest.mark.slow
@pytest.mark.root
def test_oci_image_to_graded_task(tmp_path: Path) -> None:
    if os.geteuid() != 0 or not (BASE / ".lego-rootfs-stamp").is_file():
        if os.environ.get("LEGO_SKIP_MISSING_SETUP") == "1":
            pytest.skip("needs root and scripts/build_rootfs.sh")
        pytest.fail("needs root and the rootfs of scripts/build_rootfs.sh (LEGO_SKIP_MISSING_SETUP=1 to skip)")
    tmp_path.chmod(0o755)
    _image_layout(tmp_path)
    row = {"prompt": [{"role": "user", "content": "add() is wrong"}], "label": "e2e", "metadata": {
        "instance_id": "e2e", "image": IMAGE, "workdir": "/testbed", "problem_statement": "add() is wrong",
        "eval_cmd": "PYTHONPATH=. python3 test_calc.py", "test_patch": TEST_PATCH, "reference_patch": FIX}}
    data, images = tmp_path / "train.jsonl", tmp_path / "images.json"
    data.write_text(json.dumps(row) + "\n")
    res = CliRunner().invoke(app, ["images", "--data", str(data), "--root", str(tmp_path / "bundles"), "-o",
                                   str(images), "--source", str(tmp_path / "sources"), "--fix-root-path"])
    assert res.exit_code == 0, res.output
    spec = load_images_json(images)[IMAGE]
    assert spec.workdir == "/testbed" and spec.env["LEGO_FROM_IMAGE"] == "1"

    async def agent_runs_pyenv_python() -> str:
        async with create_sandbox(IMAGE, provider="bwrap", images=load_images_json(images)) as sb:
            r = await sb.exec("python", user="agent", cwd="/testbed", timeout=30)  # a login shell (sh -lc)
            return r.stdout or repr(r)

    import asyncio

    assert asyncio.run(agent_runs_pyenv_python()) == "pyenv python as agent\n"
    res = CliRunner().invoke(app, ["tasks", "check", "--data", str(data), "--images", str(images), "--json"])
    assert res.exit_code == 0, res.output
    [check] = [r["check"] for r in json.loads(res.stdout)["rows"]]
    assert {k: check[k] for k in ("instance_id", "baseline", "reference", "verdict", "baseline_reason")} == {
        "instance_id": "e2e", "baseline": "fails", "reference": "passes", "verdict": "gradable",
        "baseline_reason": "tests failed"}
