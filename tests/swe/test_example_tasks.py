"""The shipped example tasks are gradable in real bwrap sandboxes: the unmodified repository fails its
hidden tests and the reference fix passes them (through ``lego tasks check``, repo archives seeded)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lego_rl.cli.main import app

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "tasks"


@pytest.mark.slow
def test_example_tasks_are_gradable() -> None:
    rootfs = json.loads((EXAMPLES / "images.json").read_text())["lego-rl/examples:bookworm"]["rootfs"]
    if not Path(rootfs).is_dir():
        pytest.fail(f"{rootfs} is missing: run scripts/build_rootfs.sh")
    result = CliRunner().invoke(app, ["tasks", "check", "--data", str(EXAMPLES / "tasks.jsonl"),
                                      "--images", str(EXAMPLES / "images.json"), "--json"])
    assert result.exit_code == 0, result.output
    checks = [r["check"] for r in json.loads(result.stdout)["rows"]]
    assert {c["instance_id"] for c in checks} == {"lego-example-duration", "lego-example-median",
                                                  "lego-example-slugify"}
    assert all((c["baseline"], c["reference"], c["verdict"]) == ("fails", "passes", "gradable") for c in checks)


def test_missing_repo_archive_is_named(tmp_path: Path) -> None:
    row = json.loads((EXAMPLES / "tasks.jsonl").read_text().splitlines()[0])
    row["metadata"]["repo_archive"] = "repos/nope.tar.gz"
    (tmp_path / "tasks.jsonl").write_text(json.dumps(row) + "\n")
    from lego_rl.errors import TaskDataError
    from lego_rl.swe.seed import repo_archive
    from lego_rl.tasks.model import TaskRow

    meta = TaskRow.model_validate(row).metadata
    with pytest.raises(TaskDataError, match="repos/nope.tar.gz does not exist"):
        repo_archive(meta, tmp_path)
    assert repo_archive(TaskRow.model_validate(json.loads((EXAMPLES / "tasks.jsonl").read_text().splitlines()[0]))
                        .metadata, EXAMPLES).is_file()
