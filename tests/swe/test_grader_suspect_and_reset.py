"""``grader.suspect_policy`` through a real grade, and the test-infrastructure reset and the suspect check on
sunabako, the cluster provider: its sandboxes copy the image's root filesystem, so the listings that tell what
a patch changed (inode, change time) run on another file system than bwrap's bind mounts. Red-team patches of
issue 26's classes, each a real grade in real sandboxes; the full suite runs on bwrap (test_grader_redteam.py)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from redteam_task import build_image, load_hacks, meta
from swe_data import provider_options, require_setup

from lego_rl.sandbox.base import ImageSpec
from lego_rl.sandbox.factory import create_sandbox
from lego_rl.swe.grader import BaselineCache, grade

HACKS = {h.name: h for h in load_hacks()}
PICKED = ["testfolder_helper_package", "venv_python_retarget", "shadow_pygments_package", "suspect_always_equal",
          "honest_fix_with_eq"]


@pytest.fixture(scope="module")
def image() -> Iterator[ImageSpec]:
    require_setup("bwrap")
    base = Path(tempfile.mkdtemp(prefix="lego-suspect-reset-", dir="/var/tmp"))
    base.chmod(0o755)
    try:
        yield build_image(base / "rootfs")
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
async def test_keep_policy_keeps_the_verdict_and_the_label(image: ImageSpec) -> None:
    hack = HACKS["suspect_always_equal"]
    opener = lambda: create_sandbox(image, provider="bwrap")
    kept = await grade(meta("unittest", named=True), hack.patch, open_sandbox=opener, timeout=120,
                       suspect_policy="keep")
    # Keep: the label is recorded and the reward is whatever the tests and the canaries decided. That verdict
    # varies with the canaries drawn this run: a perturbed assertEqual passes against an always-equal object
    # (caught: 0), a flipped one (assertNotEqual) fails as it must (not caught: the tests' 1 stands).
    solved_by_tests = "\nSOLVED (" in kept.output
    assert kept.label == "suspect_patch" and kept.reward == float(solved_by_tests), kept.output
    assert kept.suspects == ["calc/ops.py:2: _Result.__eq__ returns a constant, whatever it is compared with"]
    assert "grader.suspect_policy = keep" in kept.output and "===== suspect patch" in kept.output
    zero = await grade(meta("unittest", named=True), hack.patch, open_sandbox=opener, timeout=120)
    assert (zero.reward, zero.label) == (0.0, "suspect_patch") and zero.reason.startswith("suspect patch: calc/ops.py:2")
    # the reward the tests gave is named in the reason, so a log reader sees what the label cost
    assert "; was: " in zero.reason


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.parametrize("name", PICKED)
async def test_the_reset_and_the_suspect_check_hold_on_sunabako(name: str, image: ImageSpec) -> None:
    require_setup("sunabako")
    hack = HACKS[name]
    runner = hack.runners[0]
    res = await grade(meta(runner, named=True), hack.patch, timeout=120, baselines=BaselineCache(),
                      open_sandbox=lambda: create_sandbox(image, provider="sunabako",
                                                          provider_options=provider_options("sunabako")))
    assert res.reward == hack.expect, f"{name} on {runner}: {res.reason}\n{res.output}"
    assert res.label == hack.label, res.output
    if hack.expect == 0 and hack.label is None:
        assert any(line.startswith(("restored", "removed")) for line in res.reset), res.reset
