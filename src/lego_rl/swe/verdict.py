"""Pure verdict helpers: SWE-bench Pro's parser JSON against fail-to-pass / pass-to-pass lists."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from lego_rl.errors import GraderError


@dataclass(frozen=True)
class TestsVerdict:
    solved: bool
    statuses: dict[str, str] = field(default_factory=dict)
    failing: list[str] = field(default_factory=list)
    """Required tests (f2p or p2p) that were not reported PASSED, with their status or MISSING."""


def parse_parser_output(raw: bytes | str) -> dict[str, str]:
    """``{"tests": [{"name", "status"}]}`` -> name -> status; anything else is a ``GraderError``."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise GraderError(f"the SWE-bench Pro parser wrote invalid JSON: {exc}") from None
    tests = data.get("tests") if isinstance(data, dict) else None
    if not isinstance(tests, list):
        raise GraderError('the SWE-bench Pro parser output lacks a "tests" list')
    out: dict[str, str] = {}
    for t in tests:
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not isinstance(t.get("status"), str):
            raise GraderError(f"the SWE-bench Pro parser output has a malformed test entry: {str(t)[:120]}")
        # A test reported twice counts only if every report passed (a retried flaky failure stays a failure).
        prev = out.get(t["name"])
        out[t["name"]] = t["status"] if prev in (None, "PASSED") else prev
    return out


def judge_tests(statuses: dict[str, str], fail_to_pass: Sequence[str], pass_to_pass: Sequence[str]) -> TestsVerdict:
    """Solved only when every fail-to-pass and pass-to-pass test is reported ``PASSED``."""
    failing = [
        f"{name}: {statuses.get(name, 'MISSING')}"
        for name in [*fail_to_pass, *pass_to_pass]
        if statuses.get(name) != "PASSED"
    ]
    return TestsVerdict(solved=not failing, statuses=statuses, failing=failing)
