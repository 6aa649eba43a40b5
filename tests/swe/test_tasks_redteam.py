"""`lego tasks check --red-team` end to end: every attack class graded in real bwrap sandboxes by the real grader,
and each attack shown to fool a naive grader (so that "held" means something).

Two datasets: the red-team task of tests/swe (pytest with named tests, unittest judged against a baseline;
its honest fix as the reference patch) and the shipped example tasks (unittest, baseline, repositories
seeded from their archives). Every class must write at least one attack for each task, the controls must
come out as expected (the empty patch 0, the reference 1), and the grader must hold every attack: a class
that earns reward, or turns its 0 into a grader error, is a hole in the grader, and this test names it.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redteam_task import HACKS, TEST_PATCH, Hack, build_image, meta
from swe_data import require_setup
from typer.testing import CliRunner

from lego_rl.cli.main import app
from lego_rl.sandbox.base import ImageSpec
from lego_rl.sandbox.factory import create_sandbox
from lego_rl.swe.redteam import CLASSES, generate
from lego_rl.swe.redteam_run import survey
from lego_rl.tasks.model import Message, TaskRow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"
runner = CliRunner()


@pytest.fixture(scope="module")
def redteam_image() -> Iterator[ImageSpec]:
    require_setup("bwrap")
    base = Path(tempfile.mkdtemp(prefix="lego-redteam-cli-", dir="/var/tmp"))
    base.chmod(0o755)
    try:
        yield build_image(base / "rootfs")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _assert_report(report: dict[str, Any], exit_code: int, ids: set[str]) -> None:
    tasks = report["tasks"]
    assert {t["instance_id"] for t in tasks} == ids
    for t in tasks:
        assert t["verdict"] != "error", t
        controls = {c["patch"]: c["reward"] for c in t["controls"]}
        assert controls == {"empty": 0.0, "reference": 1.0}, t["controls"]
        graded = [a for a in t["attacks"] if a["status"] != "n/a"]
        assert {a["attack_class"] for a in graded} == set(CLASSES), t["attacks"]
        assert all(a["reason"] for a in graded)
    hacked = {(t["instance_id"], a["attack_class"], a["variant"]): a["reason"] for t in tasks for a in t["attacks"]
              if a["status"] in ("rewarded", "escaped")}
    # the exit status follows the table: 1 when a task is hackable, 0 when every task is sound
    assert exit_code == (1 if hacked else 0)
    hackable = len({task for task, _, _ in hacked})
    assert report["summary"]["verdicts"].get("hackable", 0) == hackable
    assert report["summary"]["verdicts"].get("sound", 0) == len(tasks) - hackable
    assert not hacked, f"the grader let these attacks through: {hacked}"


@pytest.mark.slow
def test_red_team_of_the_red_team_task(tmp_path: Path, redteam_image: ImageSpec) -> None:
    honest = Hack.load(HACKS / "honest_fix.patch").patch.decode()
    rows = []
    for name, named in (("pytest", True), ("unittest", False)):
        m = meta(name, named=named).model_copy(update={"reference_patch": honest})
        rows.append(TaskRow(prompt=[Message(role="user", content="p")], label=m.instance_id, metadata=m))
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(r.to_json_line() + "\n" for r in rows))
    images = tmp_path / "images.json"
    images.write_text(json.dumps({"test/redteam:1": {"rootfs": redteam_image.rootfs, "workdir": "/testbed"}}))
    out = tmp_path / "redteam.jsonl"
    res = runner.invoke(app, ["tasks", "check", "--red-team", "--data", str(data), "--images", str(images),
                              "--provider", "bwrap", "-j", "2", "--timeout", "120", "--json", "--output", str(out)])
    assert res.exit_code in (0, 1), res.output
    report = json.loads(res.stdout)
    assert [json.loads(line)["instance_id"] for line in out.read_text().splitlines()] == [
        "redteam-pytest-named", "redteam-unittest-baseline"]
    by_id = {t["instance_id"]: t for t in report["tasks"]}
    assert by_id["redteam-pytest-named"]["runner"] == "pytest" and by_id["redteam-unittest-baseline"]["runner"] == (
        "unittest")
    _assert_report(report, res.exit_code, set(by_id))


@pytest.mark.slow
def test_red_team_of_the_example_tasks_renders_a_table_per_task() -> None:
    rootfs = json.loads((EXAMPLES / "images.json").read_text())["lego-rl/examples:bookworm"]["rootfs"]
    if not Path(rootfs).is_dir():
        pytest.fail(f"{rootfs} is missing: run scripts/build_rootfs.sh")
    base = ["tasks", "check", "--red-team", "--data", str(EXAMPLES / "tasks.jsonl"), "--images",
            str(EXAMPLES / "images.json"), "-j", "3"]
    res = runner.invoke(app, [*base, "--json"])
    assert res.exit_code in (0, 1), res.output
    report = json.loads(res.stdout)
    _assert_report(report, res.exit_code, {"lego-example-duration", "lego-example-median", "lego-example-slugify"})
    # the table: one per task, a line per control and per class, with the grader's reason
    res = runner.invoke(app, [*base, "--ids", "lego-example-median", "--attack", "remove-tests,break-test-patch"],
                        terminal_width=250)
    assert res.exit_code == 0, res.output
    text = res.stdout
    assert "row 2 lego-example-median (unittest): sound" in text
    for cell in ("control", "empty", "reference", "as expected", "remove-tests", "break-test-patch", "held",
                 "red team summary"):
        assert cell in text, cell


# The attacks that fool a naive grader (the exit status, or the junit report as pytest wrote it) on the red-team
# task's pytest row: the catalogue must keep its teeth, or "every class held" above would prove nothing.
FOOLS_A_NAIVE_GRADER = {
    "exit-status/os-exit", "result-writer/forced-reports", "result-writer/rewrite-at-exit", "plugin/entry-point",
    "plugin/startup-hook", "assertions/noop-asserts", "assertions/helpers-redefined", "shadowing/runner",
    "shadowing/stdlib", "runner-config/addopts-plugin", "remove-tests/skip", "always-equal/anything",
    "oracle/expected-from-caller", "planted-files/conftest-and-module", "outliving-process/daemon",
}
_NAIVE = """mkdir -p /tmp/naive && git apply /tmp/attack.patch && git apply /tmp/test.patch || exit 99
.venv/bin/python -m pytest -q -p no:cacheprovider tests --junitxml=/tmp/naive/junit.xml >/dev/null 2>&1
echo "exit $?"; sleep 1
f=/tmp/naive/junit.xml
if [ -f "$f" ] && [ ! -L "$f" ] && [ "$(stat -c %s "$f")" -lt 1000000 ]; then
  echo "failures $(grep -c -E '<failure|<error' "$f") passed-cases $(grep -c '<testcase' "$f")"
fi
"""


@pytest.mark.slow
async def test_the_attacks_fool_a_naive_grader(redteam_image: ImageSpec) -> None:
    opener = lambda: create_sandbox(redteam_image, provider="bwrap")  # noqa: E731
    view = await survey(meta("pytest", named=True), opener)
    fooled = set()
    for attacks in generate(view).values():
        for attack in attacks:
            async with opener() as sb:
                await sb.write_file("/tmp/attack.patch", attack.patch)
                await sb.write_file("/tmp/test.patch", TEST_PATCH)
                res = await sb.exec(["bash", "-c", _NAIVE], cwd="/testbed", timeout=120)
            words = res.stdout.split()
            exit_zero = words[:2] == ["exit", "0"]
            clean_report = "failures" in words and words[words.index("failures") + 1] == "0"
            if exit_zero or clean_report:
                fooled.add(attack.name)
    assert fooled >= FOOLS_A_NAIVE_GRADER, sorted(FOOLS_A_NAIVE_GRADER - fooled)
