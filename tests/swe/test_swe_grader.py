"""The fresh-sandbox grader on a real task image: right fixes score 1, everything else 0 or GraderError."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
from swe_data import EVAL_CMD, FIX_PATCH, TEST_PATCH, WORKDIR, WRONG_PATCH, provider_options, task_meta

from lego_rl.errors import GraderError
from lego_rl.sandbox.base import ImageSpec, Sandbox
from lego_rl.sandbox.factory import create_sandbox
from lego_rl.swe import capture_patch, grade, prepare_workspace, take_snapshot
from lego_rl.swe.grader import BaselineCache
from lego_rl.swe.shell import q
from lego_rl.tasks.model import TaskMetadata

Opener = Callable[[], AbstractAsyncContextManager[Sandbox]]

OWN_TEST = """diff --git a/tests/test_calc.py b/tests/test_calc.py
new file mode 100644
--- /dev/null
+++ b/tests/test_calc.py
@@ -0,0 +1 @@
+print("the agent's own test: always passes")
"""


async def test_correct_fix_scores_1_and_empty_or_wrong_fix_0(opener: Opener) -> None:
    meta = task_meta()
    good = await grade(meta, FIX_PATCH, open_sandbox=opener, timeout=60)
    assert (good.reward, good.solved, good.reason, good.eval_exit_code) == (1.0, True, "tests passed", 0)
    assert good.apply_method in ("git-apply-3way", "git-apply")
    assert "===== eval as root: exit 0" in good.output and "apply official test patch: exit 0" in good.output
    empty = await grade(meta, b"", open_sandbox=opener, timeout=60)
    assert (empty.reward, empty.apply_method) == (0.0, "empty")
    assert "add(2, 3) returned -1" in empty.output  # the unmodified image fails the official test
    wrong = await grade(meta, WRONG_PATCH, open_sandbox=opener, timeout=60)
    assert wrong.reward == 0.0 and "add(2, 3) returned 6" in wrong.output


async def test_official_tests_win_over_the_agents_test_edits(opener: Opener) -> None:
    meta = task_meta()
    # wrong fix plus a "test" that always passes at the official path: the official test comes back
    cheat = await grade(meta, WRONG_PATCH + OWN_TEST, open_sandbox=opener, timeout=60)
    assert cheat.reward == 0.0
    # a right fix that also wrote its own file at an official test path still applies and passes
    honest = await grade(meta, FIX_PATCH + OWN_TEST, open_sandbox=opener, timeout=60)
    assert honest.reward == 1.0


async def test_unappliable_patch_and_timeout_score_0(opener: Opener) -> None:
    garbage = FIX_PATCH.replace("return a - b", "return something_else")
    res = await grade(task_meta(), garbage, open_sandbox=opener, timeout=60)
    assert res.reward == 0.0 and res.reason.startswith("agent patch does not apply")
    assert "agent patch (patch): exit" in res.output  # all three methods were tried
    slow = await grade(task_meta(eval_cmd="sleep 30"), FIX_PATCH, open_sandbox=opener, timeout=1)
    assert slow.reward == 0.0 and slow.timed_out and "timed out" in slow.reason


async def test_eval_runs_as_eval_user(opener: Opener) -> None:
    res = await grade(task_meta(eval_cmd="id -un; test $(id -u) -ne 0", eval_user="agent"), FIX_PATCH,
                      open_sandbox=opener, timeout=60)
    assert res.reward == 1.0 and "eval as agent: exit 0" in res.output and "\nagent\n" in res.output


async def test_infrastructure_failures_are_grader_errors(opener: Opener, provider: str) -> None:
    broken_official = TEST_PATCH.replace(" assert add(0, 0) == 0", " assert add(9, 9) == 0")
    with pytest.raises(GraderError, match="apply official test patch") as info:
        await grade(task_meta(test_patch=broken_official), FIX_PATCH, open_sandbox=opener, timeout=60)
    assert "reset official test paths to HEAD: exit 0" in info.value.output
    missing = ImageSpec(name="gone", rootfs="/nonexistent/rootfs", workdir=WORKDIR)
    with pytest.raises(GraderError, match="grader sandbox failed for calc-1") as gone:
        await grade(task_meta(), FIX_PATCH, open_sandbox=lambda: create_sandbox(missing, provider=provider, provider_options=provider_options(provider)),
                    timeout=60)
    assert gone.value.output == ""  # no step ran


async def test_f2p_script_row_with_pre_commands_round_trip(opener: Opener) -> None:
    """Agent sandbox and grader both run pre-commands, so a patch over a pre-command file applies."""
    f2p = "from calc import add\nfrom offset import OFFSET\nassert add(2, 3) + OFFSET == 5\nprint('f2p ok')\n"
    meta = task_meta(eval_cmd="PYTHONPATH=. python3 /tmp/lego-grader/test_f2p.py", test_patch="", f2p_script=f2p,
                     pre_commands=["printf 'OFFSET = 7\\n' > offset.py"])
    assert meta.kind == "f2p_script"
    async with opener() as agent:
        await prepare_workspace(agent, workdir=WORKDIR, problem_statement="p", pre_commands=meta.pre_commands)
        snap = await take_snapshot(agent, WORKDIR)
        await agent.exec(["bash", "-c", "sed -i 's/a - b/a + b/' calc.py && printf 'OFFSET = 0\\n' > offset.py"],
                         user="agent", cwd=WORKDIR, check=True)
        patch = await capture_patch(agent, snap)
    assert b"-OFFSET = 7" in patch
    res = await grade(meta, patch, open_sandbox=opener, timeout=60)
    assert res.reward == 1.0 and "f2p ok" in res.output
    assert (await grade(meta, b"", open_sandbox=opener, timeout=60)).reward == 0.0


RUN_SCRIPT = """#!/bin/bash
# SWE-bench Pro style: run the selected test files, one verdict line each
IFS=',' read -ra files <<< "$1"
for f in "${files[@]}"; do
  if PYTHONPATH=. python3 "$f"; then echo "RESULT PASSED $f"; else echo "RESULT FAILED $f"; fi
done
"""
PARSER = """import sys
# python3-minimal has no json module: the JSON is written by hand
stdout, _stderr, out = sys.argv[1:4]
items = []
for line in open(stdout):
    if line.startswith("RESULT "):
        _, status, name = line.split()
        items.append('{"name": "%s", "status": "%s"}' % (name, status))
open(out, "w").write('{"tests": [%s]}' % ", ".join(items))
"""


def _swepro_meta(tmp: Path, *, parser: str = PARSER, before: str = "") -> TaskMetadata:
    (tmp / "run_script.sh").write_text(RUN_SCRIPT)
    (tmp / "parser.py").write_text(parser)
    return task_meta(eval_cmd=None, swepro={
        "before_repo_set_cmd": before, "selected_test_files": ["tests/test_calc.py", "tests/test_existing.py"],
        "fail_to_pass": ["tests/test_calc.py"], "pass_to_pass": ["tests/test_existing.py"],
        "run_script": str(tmp / "run_script.sh"), "parser": str(tmp / "parser.py")})


async def test_swepro_verdict_from_parser_json(opener: Opener, tmp_path: Path) -> None:
    meta = _swepro_meta(tmp_path)
    good = await grade(meta, FIX_PATCH, open_sandbox=opener, timeout=60)
    assert good.reward == 1.0 and good.tests == {"tests/test_calc.py": "PASSED", "tests/test_existing.py": "PASSED"}
    bad = await grade(meta, WRONG_PATCH, open_sandbox=opener, timeout=60)
    assert bad.reward == 0.0 and "tests/test_calc.py: FAILED" in bad.reason
    # the official test files may come from before_repo_set_cmd's last line instead of the test patch
    before = "git status --short\nprintf 'from calc import add\\nassert add(2, 3) == 5\\n' > tests/test_calc.py"
    via_cmd = _swepro_meta(tmp_path, before=before).model_copy(update={"test_patch": ""})
    assert (await grade(via_cmd, FIX_PATCH, open_sandbox=opener, timeout=60)).reward == 1.0
    assert (await grade(via_cmd, WRONG_PATCH + OWN_TEST, open_sandbox=opener, timeout=60)).reward == 0.0
    with pytest.raises(GraderError, match="parser"):
        await grade(_swepro_meta(tmp_path, parser="import sys; sys.exit(3)\n"), FIX_PATCH, open_sandbox=opener,
                    timeout=60)


async def test_fuzzy_patch_falls_back_to_patch(opener: Opener) -> None:
    """git apply refuses a hunk whose context drifted; GNU patch (fuzz) takes it, leaving no backups."""
    fuzzy = FIX_PATCH.replace(" def add(a, b):", " def add(x, y):")
    meta = task_meta(eval_cmd="test ! -e calc.py.orig && test ! -e calc.py.rej && " + task_meta().eval_cmd)
    res = await grade(meta, fuzzy, open_sandbox=opener, timeout=60)
    assert (res.reward, res.apply_method) == (1.0, "patch")
    assert "agent patch (git-apply): exit 1" in res.output


SITECUSTOMIZE = """diff --git a/sitecustomize.py b/sitecustomize.py
new file mode 100644
--- /dev/null
+++ b/sitecustomize.py
@@ -0,0 +1,2 @@
+import os
+os._exit(0)
"""


async def test_exit_status_rows_get_the_test_infrastructure_reset(opener: Opener) -> None:
    """EVAL_CMD runs plain scripts (no per-test report): the exit status decides, after the reset.

    With ``PYTHONPATH=.`` a ``sitecustomize.py`` in the working directory ends every interpreter with
    status 0; the old grader scored this wrong fix 1."""
    res = await grade(task_meta(), WRONG_PATCH + SITECUSTOMIZE, open_sandbox=opener, timeout=60)
    assert (res.reward, res.verdict_source) == (0.0, "exit status")
    assert res.reset == ["removed (added by the agent): sitecustomize.py"]
    assert "reports no per-test results" in res.output and "add(2, 3) returned 6" in res.output
    harmless = SITECUSTOMIZE.replace("os._exit(0)", "pass")
    honest = await grade(task_meta(), FIX_PATCH + harmless, open_sandbox=opener, timeout=60)
    assert honest.reward == 1.0


async def test_a_script_the_eval_command_runs_is_restored(opener: Opener) -> None:
    # the script comes from a pre-command, like an image's own test script
    meta = task_meta(eval_cmd="bash run_tests.sh",
                     pre_commands=[f"printf '%s\\n' {q(EVAL_CMD)} > run_tests.sh"])
    cheat = ("diff --git a/run_tests.sh b/run_tests.sh\n--- a/run_tests.sh\n+++ b/run_tests.sh\n"
             f"@@ -1 +1 @@\n-{EVAL_CMD}\n+exit 0\n")
    res = await grade(meta, WRONG_PATCH + cheat, open_sandbox=opener, timeout=60)
    assert res.reward == 0.0 and res.reset == ["restored (changed by the agent): run_tests.sh"]
    assert (await grade(meta, FIX_PATCH, open_sandbox=opener, timeout=60)).reward == 1.0


async def test_a_baseline_without_per_test_results_is_a_grader_error(opener: Opener) -> None:
    """The calc image has no pytest: a pytest row reports nothing at baseline. That is the task's
    problem (GraderError, excluded from training), never a verdict for the policy."""
    meta = task_meta(eval_cmd="python3 -m pytest -q tests")
    with pytest.raises(GraderError, match="baseline for calc-1 is unusable: the runner never started"):
        await grade(meta, FIX_PATCH, open_sandbox=opener, timeout=60, baselines=BaselineCache())
    # the row names its tests: no baseline needed, and a run without a report scores 0
    named = task_meta(eval_cmd="python3 -m pytest -q tests", fail_to_pass=["tests/test_calc.py::test_add"])
    res = await grade(named, FIX_PATCH, open_sandbox=opener, timeout=60)
    assert res.reward == 0.0 and "never started the grader's shim" in res.reason and res.label is None


TESTS_AS_FILE = """diff --git a/tests/test_existing.py b/tests/test_existing.py
deleted file mode 100644
--- a/tests/test_existing.py
+++ /dev/null
@@ -1,2 +0,0 @@
-from calc import add
-assert add(0, 0) == 0
diff --git a/tests b/tests
new file mode 100644
--- /dev/null
+++ b/tests
@@ -0,0 +1 @@
+not a folder
"""


async def test_an_official_patch_the_agents_tree_blocks_is_the_policys_zero(opener: Opener) -> None:
    """Both sides of the line: the official test patch applies to the base commit but not after the agent's patch
    (its tests folder became a file) is ``grading_blocked``, reward 0; one that fails on the base commit too is
    our task data's fault, a GraderError (test_infrastructure_failures_are_grader_errors)."""
    adds_only = TEST_PATCH.split("diff --git a/tests/test_existing.py")[0]  # a new test file, nothing else
    meta = task_meta(test_patch=adds_only, eval_cmd="export PYTHONPATH=.; python3 tests/test_calc.py")
    res = await grade(meta, FIX_PATCH.rstrip("\n") + "\n" + TESTS_AS_FILE, open_sandbox=opener, timeout=60)
    assert res.reward == 0.0 and res.label == "grading_blocked", res.output
    assert res.reason.startswith("grading blocked") and "NOT SOLVED (grading_blocked)" in res.output
    honest = await grade(meta, FIX_PATCH, open_sandbox=opener, timeout=60)
    assert honest.reward == 1.0 and honest.label is None, honest.output


async def test_every_read_back_is_capped(opener: Opener) -> None:
    from lego_rl.swe.grader import GradingBlocked, read_capped

    async with opener() as sb:
        await sb.exec("truncate -s 8G /tmp/huge && ln -s /etc/passwd /tmp/link && printf ok > /tmp/small",
                      user="root", check=True)
        with pytest.raises(GradingBlocked, match="over the grader's cap"):  # sparse: nothing is read
            await read_capped(sb, "/tmp/huge", 1 << 20, what="a report")
        with pytest.raises(GradingBlocked, match="symbolic link"):
            await read_capped(sb, "/tmp/link", 1 << 20, what="a report")
        assert await read_capped(sb, "/tmp/small", 1 << 20, what="a report") == b"ok"
        assert await read_capped(sb, "/tmp/absent", 1 << 20, what="a report") is None


async def test_several_reads_share_one_exec_and_its_output_budget(opener: Opener, monkeypatch: pytest.MonkeyPatch
                                                                  ) -> None:
    """``read_many``: each file keeps its own cap and verdict, in order; what does not fit the exec's output budget
    is read by its own exec, still capped; a tail read returns the last bytes."""
    from lego_rl.swe import grader
    from lego_rl.swe.grader import GradingBlocked, Read, read_many

    monkeypatch.setattr(grader, "_INLINE_READ", 1000)
    async with opener() as sb:
        await sb.exec("head -c 900 /dev/zero > /tmp/a && head -c 600 /dev/zero | tr '\\0' b > /tmp/b && "
                      "printf 'one\\ntwo\\n' > /tmp/log && truncate -s 4G /tmp/huge && ln -s /tmp/a /tmp/link",
                      user="root", check=True)
        got = await read_many(sb, [Read("/tmp/a", 1000), Read("/tmp/b", 1000), Read("/tmp/huge", 1 << 20, "a log"),
                                   Read("/tmp/link", 1000), Read("/tmp/absent", 10), Read("/tmp/log", 4, tail=True),
                                   Read("/tmp/b", 500, "a record")])
    assert got[0] == b"\0" * 900 and got[1] == b"b" * 600  # /tmp/b past the budget: read on its own
    assert isinstance(got[2], GradingBlocked) and "over the grader's cap" in str(got[2])
    assert isinstance(got[3], GradingBlocked) and "symbolic link" in str(got[3])
    assert got[4] is None and got[5] == b"two\n"
    assert isinstance(got[6], GradingBlocked) and "a record (/tmp/b) is 600 bytes" in str(got[6])
