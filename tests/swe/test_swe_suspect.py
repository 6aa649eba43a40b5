"""Suspect constructs (``suspect_patch``): code built to fool comparisons is found, honest code is not."""

from __future__ import annotations

import difflib
import textwrap

import pytest

from lego_rl.swe.suspect import Suspect, added_lines, find_suspects, suspects_in


def new_file(path: str, text: str) -> tuple[dict[str, str], str]:
    """(sources, patch) for a patch that adds ``path`` with ``text``."""
    text = textwrap.dedent(text)
    lines = text.splitlines(keepends=True)
    body = "".join("+" + ln for ln in lines)
    patch = (f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
             f"@@ -0,0 +1,{len(lines)} @@\n{body}")
    return {path: text}, patch


def found(text: str, path: str = "calc/ops.py") -> list[str]:
    sources, patch = new_file(path, text)
    return [s.what for s in find_suspects(sources, patch)]


@pytest.mark.parametrize(
    ("code", "what"),
    [
        ("class R(int):\n    def __eq__(self, other):\n        return True\n", "R.__eq__ returns a constant"),
        ("class R:\n    def __ne__(self, other):\n        return False\n", "R.__ne__ returns a constant"),
        ("class R(float):\n    def __eq__(self, other):\n        return float(self) == float(self)\n",
         "R.__eq__ ignores its argument (other)"),
        ("class R:\n    __eq__ = lambda self, other: True\n", "R.__eq__ returns a constant"),
        ("class R:\n    def __lt__(self, o):\n        pass\n", "R.__lt__ returns a constant"),
        ("class R:\n    def __contains__(self, item):\n        return 1\n", "R.__contains__ returns a constant"),
        ("class R:\n    def __hash__(self):\n        return 0\n", "R.__hash__ returns a constant"),
        ("class R:\n    def __bool__(self):\n        return True\n", "R.__bool__ returns a constant"),
        ("class M(type):\n    def __instancecheck__(cls, obj):\n        return True\n",
         "M.__instancecheck__ returns a constant"),
        ("class R:\n    __class__ = property(lambda self: int)\n", "R defines __class__"),
        ("import unittest\nunittest.TestCase.assertEqual = lambda *a, **k: None\n",
         "redefines the assertion helper unittest.TestCase.assertEqual"),
        ("from unittest import TestCase as T\nsetattr(T, 'assertTrue', print)\n",
         "redefines the assertion helper unittest.TestCase.assertTrue (setattr)"),
        ("from unittest import mock, TestCase\nmock.patch.object(TestCase, 'assertIn', print).start()\n",
         "patches unittest.TestCase.assertIn"),
        ("import _pytest.assertion.rewrite as r\nr.AssertionRewritingHook.exec_module = None\n",
         "patches _pytest.assertion.rewrite.AssertionRewritingHook.exec_module"),
        ("import builtins\nbuiltins.isinstance = lambda a, b: True\n", "patches builtins.isinstance"),
        ("__builtins__['len'] = lambda x: 0\n", "replaces the entry 'len' of __builtins__"),
        ("import sys, types\nsys.modules['helpers'] = types.ModuleType('helpers')\n",
         "replaces the entry 'helpers' of sys.modules"),
        ("import pytest\npytest.approx = lambda *a, **k: 5\n", "patches pytest.approx"),
        ("from unittest.mock import ANY\n\ndef add(a, b):\n    return ANY\n", "uses mock.ANY"),
        ("import unittest\nclass Base(unittest.TestCase):\n    def assertEqual(self, first, second, msg=None):\n"
         "        pass\n", "Base overrides assertEqual with a method that can never fail"),
        ("import unittest\nclass Base(unittest.TestCase):\n    def assertEqual(self, first, second, msg=None):\n"
         "        print(first)\n", "Base overrides assertEqual with a method that ignores second"),
    ],
)
def test_constructs_that_fool_comparisons_are_reported(code: str, what: str) -> None:
    whats = found(code)
    assert any(w.startswith(what) for w in whats), whats


HONEST = '''
import sys
import unittest
from dataclasses import dataclass
from functools import total_ordering


@total_ordering
class Money:
    def __init__(self, cents, currency="EUR"):
        self.cents, self.currency = cents, currency

    def __eq__(self, other):
        if not isinstance(other, Money):
            return NotImplemented
        return (self.cents, self.currency) == (other.cents, other.currency)

    def __lt__(self, other):
        return (self.currency, self.cents) < (other.currency, other.cents)

    def __hash__(self):
        return hash((self.cents, self.currency))

    def __bool__(self):
        return self.cents != 0

    def __contains__(self, item):
        return item == self.currency


class Sentinel:
    def __eq__(self, other):
        return NotImplemented

    __hash__ = None


class Point(tuple):
    __hash__ = tuple.__hash__

    def __eq__(self, other):
        return super().__eq__(other)

    def __ne__(self, other):
        return not self == other


@dataclass(eq=True, frozen=True)
class Version:
    major: int


class Case(unittest.TestCase):
    def assertMoneyEqual(self, a, b):
        self.assertEqual((a.cents, a.currency), (b.cents, b.currency))

    def assertEqual(self, first, second, msg=None):
        super().assertEqual(first, second, msg)


sys.modules[__name__] = Money  # a module replacing itself: a known idiom
'''


def test_honest_code_with_real_comparisons_is_not_reported() -> None:
    assert found(HONEST) == []


def test_only_lines_the_patch_added_are_judged() -> None:
    before = "class R(int):\n    def __eq__(self, other):\n        return True\n\n\ndef add(a, b):\n    return a - b\n"
    after = before.replace("a - b", "a + b")
    patch = "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), "a/calc/ops.py",
                                         "b/calc/ops.py"))
    assert added_lines(patch) == {"calc/ops.py": {7}}
    assert find_suspects({"calc/ops.py": after}, patch) == []  # the repository's own __eq__, untouched
    hacked = before.replace("return True", "return 1 == 1")
    patch2 = "".join(difflib.unified_diff(before.splitlines(True), hacked.splitlines(True), "a/calc/ops.py",
                                          "b/calc/ops.py"))
    assert [s.line for s in find_suspects({"calc/ops.py": hacked}, patch2)] == [2]


def test_added_lines_reads_git_quoting_and_header_lookalikes_inside_hunks() -> None:
    patch = ('diff --git "a/caf\\303\\251.py" "b/caf\\303\\251.py"\n--- "a/caf\\303\\251.py"\n'
             '+++ "b/caf\\303\\251.py"\n@@ -1,2 +1,3 @@\n x = 1\n+++ y = 2\n-z\n+w\n')
    assert added_lines(patch) == {"café.py": {2, 3}}


def test_evidence_names_file_line_and_what_and_a_broken_file_is_left_to_the_tests() -> None:
    s = suspects_in("calc/ops.py", "class R:\n    def __eq__(self, o):\n        return True\n", {1, 2, 3})
    assert [str(x) for x in s] == ["calc/ops.py:2: R.__eq__ returns a constant, whatever it is compared with"]
    assert isinstance(s[0], Suspect)
    assert suspects_in("calc/ops.py", "def broken(:\n", {1}) == []
