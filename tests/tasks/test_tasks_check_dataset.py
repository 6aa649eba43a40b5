"""`lego tasks check` over a dataset: every broken row caught and named, verdicts resumable and atomic.

The datasets come from tests/support/task_dataset.py: real example tasks (real repositories, real tests,
graded in real bwrap sandboxes), some broken on purpose, each with the reason the checker must give.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from support.task_dataset import BROKEN_KINDS, MALFORMED_KINDS, GeneratedDataset, generate
from typer.testing import CliRunner

from lego_rl.cli.main import app
from lego_rl.swe import dataset_check
from lego_rl.swe.seed import repo_archive
from lego_rl.swe.dataset_check import CHECKER_VERSION, CheckOptions, _Keys, journal_path, read_dataset

ROOTFS = Path("/var/cache/lego-rl/rootfs-bookworm")
needs_sandbox = pytest.mark.skipif(not ROOTFS.is_dir() or shutil.which("bwrap") is None,
                                   reason="needs bwrap and the examples' rootfs (scripts/build_rootfs.sh)")
runner = CliRunner()


def _check(ds: GeneratedDataset, out: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    res = runner.invoke(app, ["tasks", "check", "--data", str(ds.path), "--images", str(ds.images),
                              "--output", str(out), "--json", *extra])
    return res.exit_code, json.loads(res.stdout)


def _assert_named(ds: GeneratedDataset, report: dict[str, Any]) -> None:
    """Every row has the verdict its generator meant: valid rows valid, each broken row invalid with its
    reason among the reasons given."""
    by_row = {r["row"]: r for r in report["rows"]}
    assert set(by_row) == set(ds.expected)
    for row, expected in ds.expected.items():
        got = by_row[row]
        assert got["instance_id"] == ds.ids[row]
        if expected == "valid":
            assert (got["status"], got["reasons"]) == ("valid", []), got
        else:
            assert got["status"] == "invalid" and expected in got["reasons"], (expected, got)


def _run_twice(ds: GeneratedDataset, tmp_path: Path, concurrency: str) -> None:
    out, valid = tmp_path / "verdicts.jsonl", tmp_path / "valid.jsonl"
    code, first = _check(ds, out, "--concurrency", concurrency, "--write-valid", str(valid))
    assert code == 1, first["summary"]  # some rows invalid, none an infrastructure error
    _assert_named(ds, first)
    assert first["summary"]["error"] == 0 and first["summary"]["reused"] == 0
    assert not journal_path(out).exists()  # published whole, journal gone
    published = out.read_text()
    assert [json.loads(line)["row"] for line in published.splitlines()] == sorted(ds.expected)
    kept = [json.loads(line)["metadata"]["instance_id"] for line in valid.read_text().splitlines()]
    assert kept == [ds.ids[r] for r, e in sorted(ds.expected.items()) if e == "valid"]
    timed = [r for r in first["rows"] if r["check"]]
    assert all(r["costs"]["sandbox"] > 0 and r["costs"]["tests"] > 0 for r in timed)

    # Same inputs: nothing is judged again, and the verdicts are the same ones.
    code, second = _check(ds, out, "--concurrency", concurrency)
    assert code == 1 and second["summary"]["reused"] == len(ds.expected) and second["summary"]["checked"] == 0
    assert second["rows"] == first["rows"]

    # One row edited: only that row is judged again.
    lines = ds.path.read_text().splitlines()
    valid_row = next(r for r, e in ds.expected.items() if e == "valid")
    row = json.loads(lines[valid_row - 1])
    row["metadata"]["problem_statement"] += "\n(reworded)"
    lines[valid_row - 1] = json.dumps(row)
    ds.path.write_text("\n".join(lines) + "\n")
    code, third = _check(ds, out)
    assert third["summary"]["checked"] == 1 and third["summary"]["reused"] == len(ds.expected) - 1
    assert next(r for r in third["rows"] if r["row"] == valid_row)["status"] == "valid"


@needs_sandbox
def test_every_kind_of_broken_row_is_caught_and_named(tmp_path: Path) -> None:
    """One row of each broken kind (base passes, reference fails, flaky, future history, hidden tests
    reachable, three malformed rows) and one good row, checked, resumed, and one row re-judged."""
    ds = generate(tmp_path / "data", rows=len(BROKEN_KINDS) + len(MALFORMED_KINDS) + 1, broken_each=1)
    assert sorted(set(ds.expected.values())) == sorted({*BROKEN_KINDS, "malformed row", "valid"})
    _run_twice(ds, tmp_path, "3")


@pytest.mark.slow
@needs_sandbox
def test_fifty_generated_rows(tmp_path: Path) -> None:
    """The 50-row dataset of the issue: 15 broken rows, 3 malformed ones, 32 good ones (minutes)."""
    ds = generate(tmp_path / "data", rows=50)
    assert sum(e != "valid" for e in ds.expected.values()) == 18
    _run_twice(ds, tmp_path, "2")


def test_malformed_rows_need_no_sandbox_and_an_interrupted_run_resumes(tmp_path: Path) -> None:
    """Rows that do not parse are judged without a sandbox; a journal left by an interrupted run (with a
    torn last line) is read back, and its verdicts are reused."""
    data = tmp_path / "tasks.jsonl"
    data.write_text('{"not": "a row"}\n{"broken\n\n{"prompt": [], "label": "x", "metadata": {}}\n')
    out = tmp_path / "v.jsonl"
    res = runner.invoke(app, ["tasks", "check", "--data", str(data), "--output", str(out), "--json"])
    assert res.exit_code == 1, res.output
    rows = json.loads(res.stdout)["rows"]
    assert [(r["row"], r["status"], r["reasons"]) for r in rows] == [
        (1, "invalid", ["malformed row"]), (2, "invalid", ["malformed row"]), (4, "invalid", ["malformed row"])]
    assert "invalid JSON" in rows[1]["detail"]
    # an interrupted run: the published file gone, its journal holding two whole lines and a torn third
    lines = out.read_text().splitlines()
    out.unlink()
    journal_path(out).write_text(lines[0] + "\n" + lines[2] + "\n" + lines[1][:40])
    res = runner.invoke(app, ["tasks", "check", "--data", str(data), "--output", str(out), "--json"])
    summary = json.loads(res.stdout)["summary"]
    assert (summary["reused"], summary["checked"]) == (2, 1)
    assert out.read_text().splitlines() == lines and not journal_path(out).exists()


def test_verdict_keys_follow_every_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The key changes with the row, its repository archive's bytes, the grading options and the checker."""
    ds = generate(tmp_path / "data", rows=9, broken_each=1)
    rows = [r for r in read_dataset(ds.path) if r.task is not None]
    keys = _Keys(CheckOptions(), ds.path.parent)
    first = keys.of(rows[0])
    assert first == _Keys(CheckOptions(), ds.path.parent).of(rows[0])  # stable across runs
    assert keys.of(rows[1]) != first
    assert _Keys(CheckOptions(timeout=5), ds.path.parent).of(rows[0]) != first
    assert _Keys(CheckOptions(repeat=False), ds.path.parent).of(rows[0]) != first
    assert rows[0].task is not None
    archive = repo_archive(rows[0].task.metadata, ds.path.parent)
    assert archive is not None
    monkeypatch.setattr(dataset_check, "CHECKER_VERSION", CHECKER_VERSION + "+1")
    assert _Keys(CheckOptions(), ds.path.parent).of(rows[0]) != first
    monkeypatch.undo()
    archive.write_bytes(archive.read_bytes() + b"\0")
    assert _Keys(CheckOptions(), ds.path.parent).of(rows[0]) != first


def test_bad_usage_exits_2(tmp_path: Path) -> None:
    data = tmp_path / "tasks.jsonl"
    assert runner.invoke(app, ["tasks", "check", "--data", str(data)]).exit_code == 2  # no such file
    data.write_text('{"x": 1}\n')
    res = runner.invoke(app, ["tasks", "check", "--data", str(data), "--ids", "nope"])
    assert res.exit_code == 2 and "nope" in res.output
    assert runner.invoke(app, ["tasks", "check", "--data", str(data), "--concurrency", "0"]).exit_code == 2
