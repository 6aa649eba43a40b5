"""Canaries (swe/canary.py): where they go, what they change, and which failure counts as theirs."""

from __future__ import annotations

import ast
import random
import subprocess
import sys
from pathlib import Path

from lego_rl.swe.canary import Canary, plant

MODULE = '''import unittest

from helpers import check_add


class AddTest(unittest.TestCase):
    def test_small(self):
        check_add(self, 2, 3, 5)

    def test_flags(self):
        value = 3
        self.assertTrue(value > 2)
        self.assertEqual(value, 3)


def test_plain():
    x = [1, 2]
    assert len(x) == 2
    assert 2 in x


def test_early_return():
    return
    assert False


@unittest.skip("decorated tests are never copied")
def test_decorated():
    assert 1 == 1
'''


def test_canaries_are_copies_with_one_assertion_perturbed_and_fresh_module_words_for_names() -> None:
    for seed in range(20):
        new, canaries, note = plant(MODULE, "tests/test_add.py", random.Random(seed), 3)
        assert len(canaries) == 3 and "3 canaries planted" in note
        tree = ast.parse(new)
        names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        original = {n.name for n in ast.walk(ast.parse(MODULE)) if isinstance(n, ast.FunctionDef)}
        assert original < names and len(names - original) == 3
        for c in canaries:
            assert c.name not in original and c.host in ("AddTest.test_small", "AddTest.test_flags", "test_plain")
            assert all(w in ("small", "flags", "plain", "early", "return", "decorated")
                       for w in c.name.removeprefix("test_").split("_")), c.name
            line = new.splitlines()[c.line - 1]
            assert ("check_add" in line) != c.guaranteed, (c, line)  # only helper calls are not guaranteed
        # guaranteed canaries first: two of the three hosts assert directly
        assert sum(c.guaranteed for c in canaries) == 2


def test_planted_canaries_fail_through_their_own_line_when_the_copied_tests_pass(tmp_path: Path) -> None:
    (tmp_path / "helpers.py").write_text("def check_add(case, a, b, expected):\n    case.assertEqual(a + b, expected)\n")
    new, canaries, _ = plant(MODULE, "test_add.py", random.Random(7), 3)
    (tmp_path / "test_add.py").write_text(new)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                           "test_add.py", "--tb=short"], cwd=tmp_path, capture_output=True, text=True, check=False)
    for c in canaries:
        nodeid = f"test_add.py::{c.cls}::{c.name}" if c.cls else f"test_add.py::{c.name}"
        assert f"FAILED {nodeid}" in proc.stdout, proc.stdout
        assert c.matches(nodeid) and not c.matches(nodeid + "x")
        assert f"test_add.py:{c.line}" in proc.stdout or f"test_add.py:{c.last}" in proc.stdout, proc.stdout
    assert "passed" in proc.stdout.splitlines()[-1]  # the originals still pass


def test_unittest_ids_match_by_module_and_class() -> None:
    c = Canary("tests/test_add.py", "AddTest", "test_small_flags", 10, 10, "AddTest.test_small", True, "x")
    assert c.matches("test_add.AddTest.test_small_flags") and c.matches("tests.test_add.AddTest.test_small_flags")
    assert not c.matches("other.AddTest.test_small_flags") and not c.matches("test_add.AddTest.test_small")


def test_a_module_without_a_perturbable_assertion_gets_none_and_says_why() -> None:
    src = "def test_x():\n    run()\n\n\ndef helper():\n    assert 1\n"
    new, canaries, note = plant(src, "t.py", random.Random(1), 3)
    assert new == src and canaries == [] and "no test with an assertion" in note
    assert plant("def test_x(:\n", "t.py", random.Random(1), 3)[1] == []
